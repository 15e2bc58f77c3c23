"""Helpers of the hearing tests; the speak, whisper_dir and transcriber fixtures are in tests/conftest.py."""

import re

import numpy as np
import pytest

from engine.stt import SAMPLE_RATE_HZ


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


@pytest.fixture(scope="module")
def voiced(speak):
    """voiced(text): espeak-ng speech cut to its voiced samples, so silence around it is only ours."""

    def voiced(text):
        audio = speak(text)
        lo, hi = voiced_span(audio)
        return audio[lo:hi]

    return voiced

