"""Checkpoints the TTS tests share (tiny_checkpoint, short_checkpoint and short_tts are in tests/conftest.py)."""

import pytest
import torch

from engine.tts import load_tts
from engine.tts.testing import write_checkpoint


@pytest.fixture(scope="session")
def tiny17_checkpoint(tmp_path_factory):
    """A 1.7B-shaped tiny checkpoint: the talker is wider than its code predictor."""
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny17", "tiny-1.7b", seed=1)


@pytest.fixture(scope="session")
def tiny_tts(tiny_checkpoint):
    """The tiny checkpoint in float32, the reference precision (test_cpu.py covers the CPU's fast path)."""
    return load_tts(tiny_checkpoint, precision="float32")


@pytest.fixture
def exact_float32():
    """TF32 off while an engine loads (CUDA graphs keep the setting of their capture) and runs, so CUDA
    float32 matmuls and convolutions round like the CPU's."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
