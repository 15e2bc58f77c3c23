"""Checkpoints the TTS tests share: random weights in the official layout, written once per session."""

import json
import shutil

import pytest

from engine.tts import load_tts
from engine.tts.testing import write_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A 0.6B-shaped tiny CustomVoice checkpoint (bf16 weights, Qwen2-format tokenizer, codec)."""
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny17_checkpoint(tmp_path_factory):
    """A 1.7B-shaped tiny checkpoint: the talker is wider than its code predictor."""
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny17", "tiny-1.7b", seed=1)


def copy_checkpoint(source, target, **generation):
    """A copy of a checkpoint folder with generation_config.json values replaced."""
    shutil.copytree(source, target)
    path = target / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **generation}))
    return target


@pytest.fixture(scope="session")
def short_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint capped at 6 frames per segment (official max_new_tokens=7), for quick streams."""
    return copy_checkpoint(tiny_checkpoint, tmp_path_factory.mktemp("ckpt") / "short", max_new_tokens=7)


@pytest.fixture(scope="session")
def tiny_tts(tiny_checkpoint):
    return load_tts(tiny_checkpoint)


@pytest.fixture(scope="session")
def short_tts(short_checkpoint):
    return load_tts(short_checkpoint)
