"""The voices of Qwen3-TTS's CustomVoice models as a person reads them: a name, what the voice sounds like and the
language it speaks best (each speaks every language the model does), after the model card; and the line a voice's
preview says, a built-in one's or a saved one's (engine/voice_library.py). A voice of another checkpoint gets its id,
tidied, and no description."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Voice:
    """name: "Ono Anna" for the id "ono_anna". description, language: "" where unknown."""

    name: str
    description: str
    language: str


_CUSTOM_VOICES = {
    "vivian": Voice("Vivian", "Bright, slightly edgy young female voice", "Chinese"),
    "serena": Voice("Serena", "Warm, gentle young female voice", "Chinese"),
    "uncle_fu": Voice("Uncle Fu", "Seasoned male voice with a low, mellow timbre", "Chinese"),
    "dylan": Voice("Dylan", "Youthful Beijing male voice with a clear, natural timbre", "Chinese (Beijing dialect)"),
    "eric": Voice("Eric", "Lively Chengdu male voice with a slightly husky brightness", "Chinese (Sichuan dialect)"),
    "ryan": Voice("Ryan", "Dynamic male voice with strong rhythmic drive", "English"),
    "aiden": Voice("Aiden", "Sunny American male voice with a clear midrange", "English"),
    "ono_anna": Voice("Ono Anna", "Playful Japanese female voice with a light, nimble timbre", "Japanese"),
    "sohee": Voice("Sohee", "Warm Korean female voice with rich emotion", "Korean"),
}


def describe(speaker: str) -> Voice:
    """What `speaker` (a model's voice id, any case) is, for people."""
    known = _CUSTOM_VOICES.get(speaker.lower())
    if known is not None:
        return known
    return Voice(" ".join(part.capitalize() for part in speaker.replace("-", "_").split("_") if part), "", "")


def sample_line(speaker: str) -> str:
    """What the preview of `speaker` says."""
    return f"Hello, I am {describe(speaker).name}. This is how I will sound when I answer you."


def saved_sample_line(name: str) -> str:
    """What the preview of the saved voice `name` (as the user wrote it) says."""
    return f"Hello, this is {name}. This is how I will sound when I answer you."
