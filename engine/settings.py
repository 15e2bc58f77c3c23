"""The assistant's configuration (AssistantConfig) and the settings file that keeps it, the one the desktop app
writes and the command line reads, so `parley chat` speaks with the models and voice chosen in the app.

The file is an INI file as Qt's QSettings writes it (the app writes it through QSettings; this module reads it
without Qt): $XDG_CONFIG_HOME/Parley/Parley.conf, else ~/.config/Parley/Parley.conf. Each setting is a key there
(SETTINGS); a value that is missing, unreadable or out of range reads as its default. Importing this module is
light (no numpy, no torch): the window reads the settings before anything of the engine loads.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.llm.chat import ChatOptions

__all__ = ["ENGINE_DEVICES", "LISTEN_MODES", "LONGEST_PAUSE_MS_RANGE", "SETTINGS", "SILENCE_MS_RANGE",
           "SPEECH_PRECISIONS",
           "AssistantConfig", "Setting", "load_config", "read_settings", "settings_path"]

LISTEN_MODES = ("hands-free", "push-to-talk")
ENGINE_DEVICES = ("auto", "cuda", "cpu")
# engine/tts/cpu.py PRECISIONS, named here so that reading the settings imports no torch (a test holds them equal)
SPEECH_PRECISIONS = ("auto", "int8", "bf16", "float32")
SILENCE_MS_RANGE = (200, 3000)
LONGEST_PAUSE_MS_RANGE = (500, 5000)


@dataclass(frozen=True)
class AssistantConfig:
    """What the assistant loads and how it holds the conversation (engine/assistant.py).

    tts_model, stt_model, llm_model: a folder or file path, or "" to find the model on its own
        (engine/models.py, the bundled Whisper and SmolLM2 packages).
    base_model: the Base checkpoint that clones voices and speaks in saved ones (a folder), or "" for the official
        one of the saved voice's size (engine/models.py find_base_model).
    speaker, language: the voice; "" is the model's first speaker, "auto" any language.
    saved_voice: the name of one of the user's saved voices (engine/voice_library.py) to speak in instead of a
        speaker, with base_model in place of tts_model; "" for a speaker. The speaker stays set beside it: it speaks
        when the saved voice is chosen off again, or cannot be used (removed, damaged, no Base model here).
    speech_server: the address of a Parley speech server (`parley serve`, e.g. http://192.168.1.20:8000) that speaks
        in place of a speech model on this computer (engine/speech_client.py); "" to speak here. It speaks its own
        model's voices: tts_model, base_model and saved_voice wait unused while it is set.
    speech_token: the bearer token that server asks for; "" for none. It is kept in the settings file, which the app
        makes readable by the user alone (as the history's and the saved voices' folders are).
    style: how the voice speaks (1.7B CustomVoice) or what it sounds like (VoiceDesign), for the TTS's
        instruct; "" for none. Models that take none ignore it (AssistantInfo.style_kind says which).
    input_device, output_device: a device name or part of one; "" is the system default.
    listen_mode: "hands-free" or "push-to-talk".
    turn_detection: hands-free, a short pause asks the end-of-turn models of the voice and of the words
        (engine/stt/turn.py, turn_text.py) whether the user has finished: the reply starts then, or Parley waits up to
        longest_pause_ms while they think.
    silence_ms: hands-free without turn detection, the pause that ends a turn (the VAD's default).
    longest_pause_ms: with turn detection, the pause that ends a turn even when the model says it goes on.
    echo_cancellation: take Parley's own voice out of the microphone (open speakers; a headset's passes through).
    system_prompt: the LLM's first message; "" is the engine's own.
    device: "auto" (the GPU when there is one), "cuda" or "cpu", for the TTS, Whisper and the LLM.
    speech_precision: how the speech model computes on the CPU (engine/tts/cpu.py): "auto" (the fastest this CPU
        allows), "int8", "bf16", or "float32" (the reference arithmetic, slowest); on a GPU it has no say.
    history_file: the SQLite conversation store; None is the default profile's.
    chat_options: engine ChatOptions for the LLM (threads, sampling); None is ChatOptions().
    tts_seed: makes speech reproducible (tests); None draws a seed per clause.
    voice_input: open speech recognition and the microphone; False for typed turns only (`parley chat --text`).
    live_transcript: transcribe what the user says while they speak (Partial events, for a window to show); each
        costs a Whisper run, so a caller that shows none turns it off.
    The last five are not kept in the settings file.
    """

    tts_model: str = ""
    stt_model: str = ""
    llm_model: str = ""
    base_model: str = ""
    speaker: str = ""
    saved_voice: str = ""
    speech_server: str = ""
    speech_token: str = ""
    language: str = "auto"
    style: str = ""
    input_device: str = ""
    output_device: str = ""
    listen_mode: str = "hands-free"
    turn_detection: bool = True
    silence_ms: int = 700
    longest_pause_ms: int = 2000
    echo_cancellation: bool = True
    system_prompt: str = ""
    device: str = "auto"
    speech_precision: str = "auto"
    history_file: Path | None = None
    chat_options: ChatOptions | None = None
    tts_seed: int | None = None
    voice_input: bool = True
    live_transcript: bool = True

    def __post_init__(self):
        for setting in SETTINGS:
            setting.check(getattr(self, setting.name))

    def models_differ(self, other: AssistantConfig) -> bool:
        """Whether going from self to other needs the models or sound devices opened anew, but for the speech model
        (speech_model_setting says which settings name that: the Assistant opens another under the conversation
        going on)."""
        heavy = ("stt_model", "llm_model", "input_device", "output_device", "device", "history_file",
                 "chat_options", "voice_input", "live_transcript")
        return any(getattr(self, name) != getattr(other, name) for name in heavy)

    @property
    def speech_model_setting(self) -> tuple[str, ...]:
        """("server", speech_server, speech_token) where a speech server speaks, else ("base", base_model,
        speech_precision) where a saved voice is chosen, else ("custom", tts_model, speech_precision): which settings
        name the speech model and how it computes. From a speaker to a saved voice or back changes it (CustomVoice,
        Base); whether a saved voice can be spoken at all, and by which Base model, its file says: the Assistant looks
        there too."""
        if self.speech_server:
            return "server", self.speech_server, self.speech_token
        model = ("base", self.base_model) if self.saved_voice else ("custom", self.tts_model)
        return *model, self.speech_precision


_BOOLS = {"true": True, "false": False}


@dataclass(frozen=True)
class Setting:
    """One value kept in the settings file: its key there, its name (the AssistantConfig field it fills), its
    default (whose type is the setting's), and the values it may take (choices, or inclusive bounds)."""

    key: str
    name: str
    default: object
    choices: tuple = ()
    bounds: tuple | None = None

    @property
    def kind(self) -> type:
        return type(self.default)

    def valid(self, value) -> bool:
        if type(value) is not self.kind:  # type(), not isinstance(): True is no silence_ms
            return False
        if self.choices and value not in self.choices:
            return False
        return self.bounds is None or self.bounds[0] <= value <= self.bounds[1]

    def check(self, value) -> None:
        """Raises ValueError naming the key and the valid values, for a value this setting cannot take."""
        if not self.valid(value):
            allowed = (f"one of {', '.join(map(str, self.choices))}" if self.choices else
                       f"{self.bounds[0]}..{self.bounds[1]}" if self.bounds else f"a {self.kind.__name__}")
            raise ValueError(f"setting {self.key} must be {allowed}; got {value!r}")

    def parse(self, raw):
        """The value of a stored one: a string from the file (or the value itself, as QSettings hands back what
        it wrote in this process); the default when it is not one this setting can take (a hand-edited file)."""
        try:
            # QSettings writes a bool as "true" or "false", and bool("false") is True
            value = _BOOLS[raw.lower()] if self.kind is bool and isinstance(raw, str) else self.kind(raw)
        except (KeyError, TypeError, ValueError, AttributeError):
            return self.default
        return value if self.valid(value) else self.default


def _field(key: str, name: str, **limits) -> Setting:
    """The Setting of an AssistantConfig field, with the field's default."""
    return Setting(key, name, AssistantConfig.__dataclass_fields__[name].default, **limits)


SETTINGS = (
    _field("models/tts", "tts_model"),
    _field("models/stt", "stt_model"),
    _field("models/llm", "llm_model"),
    _field("models/base", "base_model"),
    _field("voice/speaker", "speaker"),
    _field("voice/saved", "saved_voice"),
    _field("speech/server", "speech_server"),
    _field("speech/token", "speech_token"),
    _field("voice/language", "language"),
    _field("voice/style", "style"),
    _field("audio/input", "input_device"),
    _field("audio/output", "output_device"),
    _field("listen/mode", "listen_mode", choices=LISTEN_MODES),
    _field("listen/turn_detection", "turn_detection"),
    _field("listen/silence_ms", "silence_ms", bounds=SILENCE_MS_RANGE),
    _field("listen/longest_pause_ms", "longest_pause_ms", bounds=LONGEST_PAUSE_MS_RANGE),
    _field("listen/echo_cancellation", "echo_cancellation"),
    _field("llm/system_prompt", "system_prompt"),
    _field("engine/device", "device", choices=ENGINE_DEVICES),
    _field("engine/speech_precision", "speech_precision", choices=SPEECH_PRECISIONS),
)


def data_dir() -> Path:
    """Where Parley keeps what it makes (history, voices, downloaded models): $XDG_DATA_HOME/parley, else
    ~/.local/share/parley."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "parley"


def settings_path() -> Path:
    """The settings file: $XDG_CONFIG_HOME/Parley/Parley.conf, else ~/.config/Parley/Parley.conf (where QSettings
    keeps organization "Parley", application "Parley" in INI format)."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "Parley" / "Parley.conf"


# QSettings' escapes in an INI value (qsettings.cpp, iniEscapedString): \\ \" \n \t ..., and \xHHHH for other control
# characters
_ESCAPES = {"\\": "\\", '"': '"', "'": "'", "?": "?", "n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b",
            "f": "\f", "v": "\v", "0": "\0"}
_HEX = re.compile(r"[0-9a-fA-F]{1,4}")


def _unescape(raw: str) -> str | None:
    """A string value as QSettings writes it to an INI file: escapes undone, double quotes (which keep spaces and
    commas) taken away, and a leading @ written @@ made one. None for what is no string: a list (an unquoted
    comma) or a typed value (@Variant(...), @ByteArray(...))."""
    out, quoted, i = [], False, 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\\" and i + 1 < len(raw):
            hex_digits = _HEX.match(raw, i + 2) if raw[i + 1] == "x" else None
            if hex_digits:
                out.append(chr(int(hex_digits.group(), 16)))
                i = hex_digits.end()
                continue
            out.append(_ESCAPES.get(raw[i + 1], raw[i + 1]))
            i += 2
            continue
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            return None
        else:
            out.append(ch)
        i += 1
    text = "".join(out)
    if text.startswith("@"):
        return text[1:] if text.startswith("@@") else None
    return text


def read_settings(path: Path | None = None) -> dict[str, object]:
    """The settings stored in `path` (settings_path() when None): {AssistantConfig field: value} for each
    setting the file holds; one that is unreadable or out of range reads as its default. A missing or
    unreadable file holds none."""
    try:
        text = (path or settings_path()).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    stored, group = {}, ""
    for line in text.split("\n"):  # not splitlines(): QSettings writes U+2028 and other separators as they are
        line = line.strip(" \t\r")
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1]
        elif "=" in line and not line.startswith(";"):
            key, raw = line.split("=", 1)
            stored[f"{group}/{key.strip(' ')}"] = raw.strip(" \t")
    values = {}
    for setting in SETTINGS:
        if setting.key in stored:
            raw = _unescape(stored[setting.key])
            values[setting.name] = setting.default if raw is None else setting.parse(raw)
    return values


def load_config(path: Path | None = None, **overrides) -> AssistantConfig:
    """The AssistantConfig of the settings file (see read_settings), with `overrides` (AssistantConfig fields)
    replacing what it says; an override of None leaves the file's value.

    Raises:
        ValueError: an override the setting cannot take (named, with the valid values).
    """
    config = AssistantConfig(**read_settings(path))
    return dataclasses.replace(config, **{name: value for name, value in overrides.items() if value is not None})
