"""Speech as 16-bit PCM: a finished piece as a WAV file (mono), written whole or not at all, and the samples
themselves (`pcm16`), as the speech service streams them."""

from __future__ import annotations

import os
import tempfile
import wave
from pathlib import Path

import numpy as np


def pcm16(pcm: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1] (clipped beyond) as 16-bit signed little-endian integers."""
    return (np.clip(np.asarray(pcm, np.float32), -1.0, 1.0) * 32767.0).round().astype("<i2")


def write_wav(path: Path | str, pcm: np.ndarray, rate_hz: int) -> Path:
    """Write float32 samples in [-1, 1] (clipped beyond) to `path` as 16-bit PCM: through a temporary file beside it,
    renamed once complete, so a failed write leaves no half file.

    Raises:
        OSError: the folder is missing or not writable, or the disk is full (the message names the path).
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path.parent}: no such folder; choose another place for {path.name}")
    samples = pcm16(pcm)
    fd, tmp = tempfile.mkstemp(suffix=".wav", prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f, wave.open(f, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(rate_hz)
            out.writeframes(samples.tobytes())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
