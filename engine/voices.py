"""The voices of Qwen3-TTS's CustomVoice models as a person reads them: a name, what the voice sounds like and the
language it speaks best (each speaks every language the model does), after the model card; the line a voice's
preview says, a built-in one's or a saved one's (engine/voice_library.py); and the model's language names as the ISO
codes other programs (Wyoming, Pipecat) name them by. A voice of another checkpoint gets its id, tidied, and no
description."""

from __future__ import annotations

from dataclasses import dataclass

# The model's language names as ISO 639-1 codes, which other programs ask for a language by ("en-US": en)
LANGUAGE_CODES = {"chinese": "zh", "english": "en", "french": "fr", "german": "de", "italian": "it", "japanese": "ja",
                  "korean": "ko", "portuguese": "pt", "russian": "ru", "spanish": "es"}


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


def model_language(languages: list[str], asked: str) -> str | None:
    """The model's name, out of its `languages`, for a language asked for by its name ("English", "auto") or code
    ("en", "en-US", "en_US"); None where the model does not speak it."""
    asked = asked.lower()
    code = asked.replace("_", "-").split("-")[0]
    return next((name for name in languages if asked == name or LANGUAGE_CODES.get(name) == code), None)
