"""The settings file from the engine's side (engine/settings.py): read as Qt's QSettings writes it, whatever a
value holds; a missing, unreadable or hand-edited file reads as the defaults; command-line overrides win."""

import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from engine.settings import SETTINGS, AssistantConfig, load_config, read_settings, settings_path

TRICKY = ['You are "Parley";\nbe brief.\t\\ ok', "@at the start", " spaces around ", "日本語 ü ñ 😀", "",
          "C:\\Users\\x", "a, b, c", "\x01\x7f control", "x\\x41y", "#no comment", ";no comment", "a=b", "[group]",
          "ends with \\", '"quoted"', "\u2028line separator", "@Variant(not one)"]


def written_by_qt(path, values: dict) -> None:
    """`values` {key: value} written to an INI file by QSettings, as the app writes them."""
    store = QSettings(str(path), QSettings.Format.IniFormat)
    for key, value in values.items():
        store.setValue(key, value)
    store.sync()


@pytest.mark.parametrize("text", TRICKY)
def test_any_text_qsettings_wrote_reads_back_as_written(tmp_path, text):
    """A system prompt or path with quotes, escapes, commas, a leading @, non-ASCII, control characters or INI
    syntax reads back exactly, beside an int and a bool written with it."""
    path = tmp_path / "Parley.conf"
    written_by_qt(path, {"llm/system_prompt": text, "models/tts": text, "listen/silence_ms": 900,
                         "listen/echo_cancellation": False})
    assert read_settings(path) == {"system_prompt": text, "tts_model": text, "silence_ms": 900,
                                   "echo_cancellation": False}


def test_every_setting_has_its_fields_type_and_a_valid_default():
    """Each stored setting is an AssistantConfig field, its default the field's, and valid."""
    names = {f.name for f in fields(AssistantConfig)}
    for setting in SETTINGS:
        assert setting.name in names and setting.default == getattr(AssistantConfig(), setting.name)
        assert setting.valid(setting.default)
    assert len({s.key for s in SETTINGS}) == len(SETTINGS)


def test_a_missing_or_broken_file_or_bad_values_read_as_the_defaults(tmp_path):
    """No file, a file that is not UTF-8, and values out of range or of the wrong kind: the defaults, never a crash."""
    assert read_settings(tmp_path / "none.conf") == {}
    binary = tmp_path / "binary.conf"
    binary.write_bytes(b"\xff\xfe[listen]\nmode=push-to-talk\n")
    assert read_settings(binary) == {}
    edited = tmp_path / "edited.conf"
    edited.write_text("[listen]\nmode=sometimes\nsilence_ms=soon\necho_cancellation=maybe\n"
                      "[engine]\ndevice=cuda\n[voice]\nspeaker=\"a, b\"\nlanguage=a, b\n", encoding="utf-8")
    config = load_config(edited)
    assert (config.listen_mode, config.silence_ms, config.echo_cancellation) == ("hands-free", 700, True)
    assert config.device == "cuda" and config.speaker == "a, b"  # the good ones still count
    assert config.language == "auto"  # unquoted commas: QSettings wrote a list, which no setting is


def test_command_line_overrides_win_and_none_keeps_the_files_value(tmp_path):
    """load_config(path, **overrides): an override replaces the file's value, None leaves it; an invalid one is
    refused naming the key and the valid values."""
    path = tmp_path / "Parley.conf"
    written_by_qt(path, {"voice/speaker": "aiden", "models/tts": "/m/tts", "listen/mode": "push-to-talk"})
    config = load_config(path, speaker="ryan", tts_model=None)
    assert (config.speaker, config.tts_model, config.listen_mode) == ("ryan", "/m/tts", "push-to-talk")
    with pytest.raises(ValueError, match="engine/device must be one of auto, cuda, cpu; got 'tpu'"):
        load_config(path, device="tpu")


def test_the_file_is_where_qsettings_keeps_parleys_on_linux(tmp_path, monkeypatch):
    """$XDG_CONFIG_HOME/Parley/Parley.conf: the file QSettings("Parley", "Parley") uses (asked in a process of its
    own, as Qt reads the variable once), so the settings earlier versions of the app wrote are read."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    qt = subprocess.run([sys.executable, "-c", "from PySide6.QtCore import QSettings; "
                         "print(QSettings('Parley', 'Parley').fileName())"], capture_output=True, text=True, check=True)
    assert settings_path() == tmp_path / "Parley" / "Parley.conf" == Path(qt.stdout.strip())


def test_a_saved_voice_and_the_base_model_are_kept_and_change_the_speech_model(tmp_path):
    """voice/saved and models/base read back as written (any name); going from a speaker to a saved voice or back
    changes the speech model, from one saved voice to another or a new speaker does not."""
    path = tmp_path / "Parley.conf"
    written_by_qt(path, {"voice/saved": "Grandma Ann 😀, \"quoted\"", "models/base": "/m/base",
                         "voice/speaker": "aiden"})
    config = load_config(path)
    assert (config.saved_voice, config.base_model, config.speaker) == ("Grandma Ann 😀, \"quoted\"", "/m/base",
                                                                       "aiden")
    speaker = AssistantConfig(speaker="aiden")
    assert config.speech_model_setting == ("base", "/m/base", "auto")
    assert speaker.speech_model_setting == ("custom", "", "auto")
    exact = replace(speaker, speech_precision="float32")
    assert exact.speech_model_setting == ("custom", "", "float32") and not exact.models_differ(speaker)
    assert speaker.speech_model_setting != config.speech_model_setting and not speaker.models_differ(config)
    assert config.speech_model_setting == replace(config, saved_voice="Zoe", speaker="ryan").speech_model_setting
    assert speaker.speech_model_setting == replace(speaker, speaker="ryan", base_model="/other").speech_model_setting
    assert config.speech_model_setting != replace(config, base_model="/other").speech_model_setting
    assert config.speech_model_setting == replace(config, tts_model="/other").speech_model_setting


def test_a_speech_server_and_its_token_are_kept_and_change_the_speech_model(tmp_path):
    """speech/server and speech/token read back as written; naming a server, another one or another token changes
    the speech model, while the local model settings it leaves unused do not."""
    path = tmp_path / "Parley.conf"
    written_by_qt(path, {"speech/server": "http://192.168.1.20:8000", "speech/token": "s3cret, \"quoted\"",
                         "models/tts": "/m/tts"})
    served = load_config(path)
    assert (served.speech_server, served.speech_token) == ("http://192.168.1.20:8000", "s3cret, \"quoted\"")
    assert served.speech_model_setting == ("server", "http://192.168.1.20:8000", "s3cret, \"quoted\"")
    for other in (replace(served, speech_server=""), replace(served, speech_token="other"),
                  replace(served, speech_server="http://b:1")):
        assert other.speech_model_setting != served.speech_model_setting and not other.models_differ(served)
    unused = replace(served, saved_voice="Zoe", tts_model="/other", base_model="/x", speech_precision="float32")
    assert unused.speech_model_setting == served.speech_model_setting


def test_the_speech_precisions_on_offer_are_the_engines():
    """The settings name the CPU's speech precisions without importing torch; they are load_tts's own."""
    from engine.settings import SPEECH_PRECISIONS
    from engine.tts.cpu import PRECISIONS

    assert set(SPEECH_PRECISIONS) == set(PRECISIONS) and SPEECH_PRECISIONS[0] == "auto"
