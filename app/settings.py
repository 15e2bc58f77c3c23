"""Parley's settings: a typed view over QSettings (organization "Parley", application "Parley").

The keys are shared with app/models_page.py, which reads and writes the model paths through the same
QSettings. `engine_config()` turns the stored values into the EngineConfig the worker loads from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QSettings

ORGANIZATION = "Parley"
APPLICATION = "Parley"
LISTEN_MODES = ("hands-free", "push-to-talk")
ENGINE_DEVICES = ("auto", "cuda", "cpu")
THEMES = ("system", "light", "dark")
# VadOptions.silence_ms's default (engine/stt/vad.py); a copy, because importing the engine here
# would pull numpy into the window's start-up for one number. tests/app/test_settings.py checks it.
DEFAULT_SILENCE_MS = 700
SILENCE_MS_RANGE = (200, 3000)
# The voice a VoiceDesign model speaks in until the user describes one: such a model has no voice of
# its own, and an empty description would stop it speaking at all
DEFAULT_VOICE_DESCRIPTION = "A warm, clear, friendly voice at a natural, relaxed pace."

if TYPE_CHECKING:
    from engine.llm.chat import ChatOptions


@dataclass(frozen=True)
class EngineConfig:
    """What the worker loads and how it runs the conversation; built from Settings.

    tts_model, stt_model, llm_model: a folder or file path, or "" to find the model on its own
        (engine/models.py, the bundled Whisper and SmolLM2 packages).
    speaker, language: the voice; "" is the model's first speaker, "auto" any language.
    style: how the voice speaks (1.7B CustomVoice) or what it sounds like (VoiceDesign), for the TTS's
        instruct; "" for none. Models that take none ignore it (EngineInfo.style_kind says which).
    input_device, output_device: a device name or part of one; "" is the system default.
    listen_mode: "hands-free" or "push-to-talk". silence_ms: hands-free end-of-turn silence.
    echo_cancellation: take Parley's own voice out of the microphone (open speakers; a headset's passes through).
    system_prompt: the LLM's first message.
    device: "auto" (the GPU when there is one), "cuda" or "cpu", for the TTS and the LLM.
    history_file: the SQLite conversation store.
    chat_options: engine ChatOptions for the LLM (threads, sampling); None is ChatOptions().
    tts_seed: makes speech reproducible (tests); None draws a seed per clause.
    """

    tts_model: str = ""
    stt_model: str = ""
    llm_model: str = ""
    speaker: str = ""
    language: str = "auto"
    style: str = ""
    input_device: str = ""
    output_device: str = ""
    listen_mode: str = "hands-free"
    silence_ms: int = DEFAULT_SILENCE_MS
    echo_cancellation: bool = True
    system_prompt: str = ""
    device: str = "auto"
    history_file: Path | None = None
    chat_options: ChatOptions | None = None
    tts_seed: int | None = None

    def __post_init__(self):
        if self.listen_mode not in LISTEN_MODES:
            raise ValueError(f"listen_mode must be one of {', '.join(LISTEN_MODES)}; got {self.listen_mode!r}")
        if self.device not in ENGINE_DEVICES:
            raise ValueError(f"device must be one of {', '.join(ENGINE_DEVICES)}; got {self.device!r}")

    def models_differ(self, other: EngineConfig) -> bool:
        """Whether going from self to other needs the models or audio devices reopened (not just the voice)."""
        heavy = ("tts_model", "stt_model", "llm_model", "input_device", "output_device", "device", "history_file",
                 "chat_options")
        return any(getattr(self, name) != getattr(other, name) for name in heavy)


_BOOLS = {"true": True, "false": False}


class _Value:
    """One setting: a QSettings key with a type, a default and (optionally) the values it may take.

    A stored value of the wrong type or outside the choices (a hand-edited file) reads as the default;
    assigning one raises ValueError, so the dialog's mistakes never reach the file.
    """

    def __init__(self, key: str, kind: type, default, choices: tuple = (), bounds: tuple | None = None):
        self.key, self.kind, self.default, self.choices, self.bounds = key, kind, default, choices, bounds

    def __set_name__(self, owner, name):
        self.name = name

    def valid(self, value) -> bool:
        if type(value) is not self.kind:  # type(), not isinstance(): True is no silence_ms
            return False
        if self.choices and value not in self.choices:
            return False
        return self.bounds is None or self.bounds[0] <= value <= self.bounds[1]

    def __get__(self, settings, owner=None):
        if settings is None:
            return self
        raw = settings.store.value(self.key, self.default)  # an INI file gives back strings
        try:
            # QSettings writes a bool as "true" or "false", and bool("false") is True
            value = _BOOLS[raw.lower()] if self.kind is bool and isinstance(raw, str) else self.kind(raw)
        except (KeyError, TypeError, ValueError):
            return self.default
        return value if self.valid(value) else self.default

    def __set__(self, settings, value):
        if not self.valid(value):
            allowed = (f"one of {', '.join(map(str, self.choices))}" if self.choices else
                       f"{self.bounds[0]}..{self.bounds[1]}" if self.bounds else f"a {self.kind.__name__}")
            raise ValueError(f"setting {self.key} must be {allowed}; got {value!r}")
        settings.store.setValue(self.key, value)


class Settings:
    """Parley's settings, typed; each property reads and writes its QSettings key at once.

        settings = Settings()                # the user's settings file
        settings.listen_mode = "push-to-talk"
        config = settings.engine_config()    # what the worker loads

    Args:
        store: the QSettings to use; None is QSettings("Parley", "Parley"), the user's own. Tests pass
            one on a file in a temporary folder.
    """

    tts_model = _Value("models/tts", str, "")
    stt_model = _Value("models/stt", str, "")
    llm_model = _Value("models/llm", str, "")
    speaker = _Value("voice/speaker", str, "")
    language = _Value("voice/language", str, "auto")
    style = _Value("voice/style", str, "")
    input_device = _Value("audio/input", str, "")
    output_device = _Value("audio/output", str, "")
    listen_mode = _Value("listen/mode", str, "hands-free", choices=LISTEN_MODES)
    silence_ms = _Value("listen/silence_ms", int, DEFAULT_SILENCE_MS, bounds=SILENCE_MS_RANGE)
    echo_cancellation = _Value("listen/echo_cancellation", bool, True)
    system_prompt = _Value("llm/system_prompt", str, "")
    device = _Value("engine/device", str, "auto", choices=ENGINE_DEVICES)
    theme = _Value("ui/theme", str, "system", choices=THEMES)
    # the last reason shown for speech running without the megakernel: a lasting one is told once, not every start
    megakernel_notice = _Value("notices/megakernel", str, "")

    def __init__(self, store: QSettings | None = None):
        self.store = store if store is not None else QSettings(ORGANIZATION, APPLICATION)

    def sync(self) -> None:
        """Write pending changes to disk now (QSettings otherwise writes them a little later)."""
        self.store.sync()

    def engine_config(self, history_file: Path | None = None, chat_options: ChatOptions | None = None) -> EngineConfig:
        """The stored settings as the worker's EngineConfig; history_file None is the default profile's,
        chat_options None is ChatOptions()."""
        names = [n for n in EngineConfig.__dataclass_fields__ if isinstance(getattr(Settings, n, None), _Value)]
        return EngineConfig(history_file=history_file, chat_options=chat_options,
                            **{name: getattr(self, name) for name in names})
