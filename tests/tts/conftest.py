"""Checkpoints the TTS tests share (tiny_checkpoint, short_checkpoint, short_tts and base_checkpoint are in
tests/conftest.py)."""

import numpy as np
import pytest
import torch

from engine.tts import load_tts
from engine.tts.testing import write_checkpoint


def speech_like(seconds: float, rate_hz: int = 24_000, seed: int = 0) -> np.ndarray:
    """A voiced-sounding recording at about -20 dBFS for the cloning tests: a gliding 110-190 Hz buzz with harmonics,
    in syllables of ~200 ms, and a little noise; float32 (samples,)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    pitch = 150 + 40 * np.sin(2 * np.pi * 0.8 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate_hz
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    syllables = 0.5 + 0.5 * np.sin(2 * np.pi * 2.5 * t) ** 2
    return (0.12 * voiced * syllables + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


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
