"""Fixtures for the app's tests: Qt offscreen (no display needed) and settings in a temporary file.

QT_QPA_PLATFORM is set here, before pytest-qt creates the QApplication, so the tests drive real
widgets without a screen; the user's own QSettings are never read or written.
"""

import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

from engine.assistant import AssistantInfo  # noqa: E402

# what the assistant reports for a loaded 0.6B CustomVoice model (Ready), for tests that emit its events themselves
INFO = AssistantInfo(speakers=("aiden", "ryan"), languages=("english", "german"), speaker="aiden",
                     device="cpu", tts_model=Path("/m/tts"), llm_model=Path("/m/llm.gguf"), stt_model=Path("/m/stt"),
                     microphone="default", speakers_device="default", conversation_id=None)


@pytest.fixture(autouse=True)
def _sound(sound_server):
    """The PulseAudio null sink, up before anything lists devices: PortAudio lists them once, at import
    (tests/conftest.py), and the settings dialog lists them."""


@pytest.fixture(autouse=True)
def voices(tmp_path, monkeypatch):
    """The saved voices' folder of each test: the user's own voices are never listed, changed or erased. Returns the
    library over it (engine/voice_library.py), which the app and the worker's assistant use too."""
    from engine import voice_library

    monkeypatch.setattr(voice_library, "voices_dir", lambda: tmp_path / "voices")
    return voice_library.VoiceLibrary()


@pytest.fixture
def settings(tmp_path):
    """A Settings over an INI file in tmp_path."""
    from PySide6.QtCore import QSettings

    from app.settings import Settings

    return Settings(QSettings(str(tmp_path / "parley.ini"), QSettings.Format.IniFormat))


@pytest.fixture(scope="session")
def cloned(base_checkpoint, reference_wav):
    """A real voice: the espeak recording (tests/conftest.py) cloned in context by the tiny Base model, for tests
    to save under names of their own (VoiceLibrary.add)."""
    from engine.tts import load_tts
    from tests.conftest import REFERENCE_TEXT

    return load_tts(base_checkpoint).clone_voice(reference_wav, text=REFERENCE_TEXT)

