"""The Base model's speaker encoder against the official qwen-tts package on the same random-weight folder.

Tolerance: float32 on both sides; embeddings agree to 1e-5 absolute (seen: ~6e-7).
"""

import json

import pytest
import torch

from engine.tts.config import TTSConfig
from engine.tts.speaker import SpeakerEncoder, load_speaker_encoder
from engine.tts.testing.checkpoint import make_config
from tests.oracle import import_qwen_tts
from tests.tts.conftest import speech_like


@pytest.mark.oracle
def test_speaker_embedding_equals_the_officials(base_checkpoint):
    """A recording's x-vector (mel, ECAPA-TDNN) is the official extract_speaker_embedding's within 1e-5."""
    qwen_tts = import_qwen_tts()
    official = qwen_tts.Qwen3TTSModel.from_pretrained(str(base_checkpoint), dtype=torch.float32)
    config = TTSConfig.from_file(base_checkpoint / "config.json")
    encoder = load_speaker_encoder(base_checkpoint, config.speaker_encoder)
    for seconds in (3.0, 7.3):
        recording = speech_like(seconds, seed=int(seconds))
        expected = official.model.extract_speaker_embedding(recording, 24_000)
        got = encoder.embed(torch.from_numpy(recording))
        assert got.shape == (config.talker.decoder.hidden_size,) and expected.abs().max() > 0.1
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_published_base_configs_build_the_officials_speaker_encoder(tmp_path):
    """The full-size Base config.json (only enc_dim and sample_rate, as published) gives the official speaker
    encoder's tensors, name for name and shape for shape."""
    import_qwen_tts()
    from qwen_tts.core.models import Qwen3TTSConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSSpeakerEncoder

    text = {"im_start": 1, "im_end": 2, "tts_pad": 3, "tts_bos": 4, "tts_eos": 5, "assistant": 6,
            "text_vocab_size": 151936}
    for size, width in (("0.6b", 1024), ("1.7b", 2048)):
        config = make_config(size, text, "base")
        assert config["speaker_encoder_config"] == {"enc_dim": width, "sample_rate": 24000}
        official = Qwen3TTSSpeakerEncoder(Qwen3TTSConfig(**config).speaker_encoder_config).state_dict()
        (tmp_path / "config.json").write_text(json.dumps(config))
        with torch.device("meta"):
            ours = SpeakerEncoder(TTSConfig.from_file(tmp_path / "config.json").speaker_encoder).state_dict()
        assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in official.items()}
