"""The codec's encoder (a Base model's speech_tokenizer/ encoder.*) against the official qwen-tts speech tokenizer
on the same random-weight folder: codes must be identical."""

import pytest
import torch

from engine.tts.encoder import load_speech_encoder
from tests.oracle import import_qwen_tts
from tests.tts.conftest import speech_like


@pytest.mark.oracle
def test_codes_equal_the_official_speech_tokenizers(base_checkpoint):
    """Recordings of whole and part frames encode to the official codes, which vary in every codebook."""
    qwen_tts = import_qwen_tts()
    folder = base_checkpoint / "speech_tokenizer"
    official = qwen_tts.Qwen3TTSTokenizer.from_pretrained(str(folder), dtype=torch.float32)
    encoder = load_speech_encoder(folder)
    for seconds, frames in ((3.0, 38), (4.08, 51)):  # 37.5 frames (a started frame counts), and exactly 51
        recording = speech_like(seconds, seed=int(seconds))
        expected = official.encode(recording, sr=24_000).audio_codes[0]
        got = encoder.encode(torch.from_numpy(recording))
        assert got.shape == (frames, 16) and got.dtype == torch.int64
        assert torch.equal(got, expected)
        assert all(len(set(got[:, q].tolist())) > 5 for q in range(16))
