"""Real speech for the hearing tests: espeak-ng sentences resampled to 16 kHz, and the bundled Whisper model."""

import re
import shutil
import subprocess

import numpy as np
import pytest
import soundfile
import soxr

from engine.stt import SAMPLE_RATE_HZ


@pytest.fixture(scope="session")
def speak(tmp_path_factory):
    """speak(text) -> (n,) float32 at 16 kHz: espeak-ng's en-us voice at 150 words a minute."""
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is not installed; apt-get install -y --no-install-recommends espeak-ng")
    folder = tmp_path_factory.mktemp("speech")
    made = {}

    def speak(text: str) -> np.ndarray:
        if text not in made:
            wav = folder / f"{len(made)}.wav"
            subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(wav), text], check=True)
            audio, rate = soundfile.read(wav, dtype="float32")
            made[text] = soxr.resample(audio, rate, SAMPLE_RATE_HZ).astype(np.float32)
        return made[text]

    return speak


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SAMPLE_RATE_HZ), np.float32)


def voiced_span(audio: np.ndarray, level: float = 0.02) -> tuple[int, int]:
    """First and one-past-last sample louder than `level`: the ground truth for where speech is."""
    loud = np.flatnonzero(np.abs(audio) > level)
    return int(loud[0]), int(loud[-1]) + 1


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level edit distance over the reference length, after lower-casing and dropping punctuation."""
    ref = re.sub(r"[^a-z0-9' ]", " ", reference.lower()).split()
    hyp = re.sub(r"[^a-z0-9' ]", " ", hypothesis.lower()).split()
    row = list(range(len(hyp) + 1))  # distances from the empty reference prefix
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / max(len(ref), 1)


@pytest.fixture(scope="session")
def whisper_dir(tmp_path_factory):
    """The bundled Whisper base model, assembled into a session folder (never the user's cache)."""
    from engine.stt import assemble_bundled_model

    return assemble_bundled_model(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="session")
def transcriber(whisper_dir):
    """Whisper base on the CPU (int8), 2 threads: this machine's cores are shared."""
    from engine.stt import Transcriber, TranscriberOptions

    return Transcriber(whisper_dir, TranscriberOptions(device="cpu", cpu_threads=2))
