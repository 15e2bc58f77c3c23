"""Settings: typed values on the shared QSettings keys, persisted to the file, refused when invalid, and read back
by the engine (engine/settings.py: the command line reads the same file)."""

import shutil

import pytest
from PySide6.QtCore import QSettings

from app.settings import Settings
from engine.settings import AssistantConfig, read_settings


def test_defaults_are_the_engines_own(settings):
    """A fresh file reads as the engine's defaults: VAD silence, automatic models, hands-free, auto device,
    echo cancellation on."""
    from engine.stt.vad import VadOptions

    assert AssistantConfig().silence_ms == VadOptions().silence_ms == settings.silence_ms
    assert (settings.tts_model, settings.llm_model, settings.stt_model) == ("", "", "")
    assert (settings.listen_mode, settings.device, settings.theme, settings.language) == \
        ("hands-free", "auto", "system", "auto")
    assert settings.echo_cancellation is True


def test_every_setting_persists_under_the_shared_key(settings, tmp_path):
    """Values written through one Settings are in the file under the agreed keys and read back by another."""
    chosen = {
        "tts_model": "/models/tts", "stt_model": "/models/whisper", "llm_model": "/models/chat.gguf",
        "speaker": "ryan", "language": "english", "style": "calm", "input_device": "USB mic",
        "output_device": "pulse", "listen_mode": "push-to-talk", "silence_ms": 1200, "echo_cancellation": False,
        "turn_detection": False, "longest_pause_ms": 3500,
        "system_prompt": "Be brief.", "device": "cpu", "theme": "dark",
    }
    for name, value in chosen.items():
        setattr(settings, name, value)
    settings.sync()

    raw = QSettings(str(tmp_path / "parley.ini"), QSettings.Format.IniFormat)
    assert raw.value("models/tts") == "/models/tts" and raw.value("listen/mode") == "push-to-talk"
    assert int(raw.value("listen/silence_ms")) == 1200 and raw.value("ui/theme") == "dark"
    assert "echo_cancellation=false" in (tmp_path / "parley.ini").read_text()
    again = Settings(raw)
    assert {name: getattr(again, name) for name in chosen} == chosen
    del chosen["theme"]  # the window's own
    assert read_settings(tmp_path / "parley.ini") == chosen  # the engine reads what the app wrote


def test_invalid_values_are_refused_and_nothing_is_written(settings):
    """Assigning a value outside the choices or range raises ValueError naming the key and the valid values."""
    with pytest.raises(ValueError, match="listen/mode must be one of hands-free, push-to-talk"):
        settings.listen_mode = "always"
    with pytest.raises(ValueError, match=r"listen/silence_ms must be 200\.\.3000"):
        settings.silence_ms = 50
    with pytest.raises(ValueError, match="engine/device"):
        settings.device = "tpu"
    with pytest.raises(ValueError, match="listen/echo_cancellation must be a bool"):
        settings.echo_cancellation = "off"
    assert settings.store.value("listen/mode") is None and settings.listen_mode == "hands-free"


def test_a_hand_edited_file_with_bad_values_reads_as_the_defaults(settings):
    """Garbage in the file (a typo, a wrong type) does not crash the app: those settings read as their defaults."""
    settings.store.setValue("listen/mode", "sometimes")
    settings.store.setValue("listen/silence_ms", "soon")
    settings.store.setValue("engine/device", "cuda")
    settings.store.setValue("listen/echo_cancellation", "maybe")
    assert settings.listen_mode == "hands-free" and settings.silence_ms == AssistantConfig().silence_ms
    assert settings.echo_cancellation is True
    assert settings.device == "cuda"  # the good one still counts


def test_echo_cancellation_turned_off_stays_off_at_the_next_start(settings, tmp_path):
    """Off is written as "false" and a file this process has not read yet (the next start) gives back that
    string, which reads as False, not as bool("false"); on again round-trips the same way."""
    for value in (False, True):
        settings.echo_cancellation = value
        settings.sync()
        # a copy: QSettings caches a file it has read, handing back the bool instead of the file's text
        shutil.copy(tmp_path / "parley.ini", tmp_path / f"next-{value}.ini")
        later = Settings(QSettings(str(tmp_path / f"next-{value}.ini"), QSettings.Format.IniFormat))
        assert later.store.value("listen/echo_cancellation") == str(value).lower()
        assert later.echo_cancellation is value


def test_assistant_config_carries_the_settings_and_knows_what_needs_a_reload(settings, tmp_path):
    """assistant_config() copies the stored values; only model, device or engine changes need the models reloaded."""
    settings.speaker, settings.silence_ms, settings.tts_model = "aiden", 900, "/m/tts"
    settings.echo_cancellation = False
    config = settings.assistant_config(tmp_path / "h.sqlite3")
    assert (config.speaker, config.silence_ms, config.tts_model) == ("aiden", 900, "/m/tts")
    assert config.echo_cancellation is False
    assert config.history_file == tmp_path / "h.sqlite3"
    from dataclasses import replace

    assert not config.models_differ(replace(config, speaker="ryan", listen_mode="push-to-talk", system_prompt="x",
                                            echo_cancellation=True))
    assert config.models_differ(replace(config, device="cpu"))
    assert config.models_differ(replace(config, output_device="pulse"))
    with pytest.raises(ValueError, match="listen/mode must be one of hands-free, push-to-talk; got 'maybe'"):
        AssistantConfig(listen_mode="maybe")
