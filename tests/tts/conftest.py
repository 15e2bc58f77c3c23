"""Checkpoints the TTS tests share (tiny_checkpoint, short_checkpoint and short_tts are in tests/conftest.py)."""

import pytest

from engine.tts import load_tts
from engine.tts.testing import write_checkpoint


@pytest.fixture(scope="session")
def tiny17_checkpoint(tmp_path_factory):
    """A 1.7B-shaped tiny checkpoint: the talker is wider than its code predictor."""
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny17", "tiny-1.7b", seed=1)


@pytest.fixture(scope="session")
def tiny_tts(tiny_checkpoint):
    return load_tts(tiny_checkpoint)
