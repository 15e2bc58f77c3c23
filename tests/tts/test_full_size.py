"""A published-size (0.6B) checkpoint: Parley loads and streams it, and matches the official model on it."""

import numpy as np
import pytest
import torch

from engine.tts import SamplingOptions, load_tts
from engine.tts.testing import write_checkpoint
from tests.oracle import import_qwen_tts
from tests.conftest import copy_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.oracle]

FRAMES = 3


@pytest.fixture(scope="module")
def full_checkpoint(tmp_path_factory):
    """0.6B CustomVoice dims (28 layers, hidden 1024, 151,936 text tokens, the real Qwen vocabulary), capped short."""
    folder = write_checkpoint(tmp_path_factory.mktemp("full") / "0.6b", "0.6b", seed=0)
    return copy_checkpoint(folder, folder.parent / "capped", max_new_tokens=FRAMES + 1)


def test_full_size_checkpoint_streams_and_equals_the_official_model(full_checkpoint):
    """The 0.6B-size folder streams 80 ms chunks; greedy codes and audio equal qwen-tts's on the same folder."""
    tts = load_tts(full_checkpoint, precision="float32")
    assert tts.config.talker.decoder.num_layers == 28 and tts.config.talker.text_vocab_size == 151936
    text = "Hello there, this is a full size model."
    chunks = list(tts.stream(text, "ryan", "english", sampling=SamplingOptions.greedy(), chunk_frames=1))
    assert [c.pcm.shape for c in chunks] == [(1920,)] * FRAMES
    codes = np.concatenate([c.codes for c in chunks])

    official = import_qwen_tts().Qwen3TTSModel.from_pretrained(str(full_checkpoint), dtype=torch.float32)
    input_ids = official._tokenize_texts([official._build_assistant_text(text)])
    assert input_ids[0][0].tolist() == tts.prompts.role_ids + tts.prompts.text_ids(text) + tts.prompts.tail_ids
    kwargs = official._merge_generate_kwargs(do_sample=False, subtalker_dosample=False)
    with torch.no_grad():
        expected, _ = official.model.generate(input_ids=input_ids, instruct_ids=[None], languages=["english"],
                                              speakers=["ryan"], non_streaming_mode=True, **kwargs)
        wavs, _ = official.model.speech_tokenizer.decode([{"audio_codes": expected[0]}])
    np.testing.assert_array_equal(codes, expected[0].numpy())
    np.testing.assert_allclose(np.concatenate([c.pcm for c in chunks]), wavs[0], atol=1e-4, rtol=0)
