"""What of a text can be spoken: the one rule the speech engine's front (engine/tts/prompt.py) and the clause
splitter (engine/llm/clauses.py) share, so `parley say`, the app's speak-as-written and an LLM reply agree.
Emoji are dropped (the speech model has no sound for them), and a text with no letter or digit has nothing to say.
"""

from __future__ import annotations

import re
import unicodedata

from engine.errors import InputTextError

__all__ = ["CJK_CLAUSE_MARKS", "CJK_SENTENCE_ENDS", "CLAUSE_MARKS", "SENTENCE_ENDS", "clean_text", "has_words",
           "is_cjk", "is_emoji", "speech_seconds"]

# Where text breaks, for the TTS's segments (engine/tts/prompt.py) and the LLM reply's clauses (engine/llm/clauses.py)
# alike: sentence ends a space follows (Latin, Arabic, Devanagari), sentence ends none does (CJK), and clause marks of
# both kinds.
SENTENCE_ENDS = ".!?…؟।"
CJK_SENTENCE_ENDS = "。！？"
CLAUSE_MARKS = ",;:"
CJK_CLAUSE_MARKS = "，、；："

# Conversational speaking rates, for an estimate: 150 words a minute is about 14 characters a second in alphabetic
# scripts; Chinese and Japanese run at about 5 characters a second.
_CHARS_PER_S = 14.0
_CJK_CHARS_PER_S = 5.0


def is_emoji(ch: str) -> bool:
    """A pictograph, or a character that only joins or styles one (ZWJ, variation selector 16, keycap)."""
    cp = ord(ch)
    return (
        0x1F000 <= cp <= 0x1FAFF  # pictographs, emoticons, flags, skin tones
        or 0x2600 <= cp <= 0x27BF  # misc symbols and dingbats
        or 0x2B00 <= cp <= 0x2BFF  # stars, arrows
        or 0xE0020 <= cp <= 0xE007F  # tag characters (subdivision flags)
        or cp in (0xFE0F, 0x200D, 0x20E3)  # variation selector, zero-width joiner, keycap
    )


def is_cjk(ch: str) -> bool:
    """A Chinese or Japanese character: each is about a word. Hangul is left out: Korean puts spaces between words."""
    cp = ord(ch)
    return 0x3040 <= cp <= 0x30FF or 0x3400 <= cp <= 0x4DBF or 0x4E00 <= cp <= 0x9FFF or 0xF900 <= cp <= 0xFAFF


def has_words(text: str) -> bool:
    """Whether `text` holds a letter or a digit, in any script: punctuation, symbols and emoji alone say nothing."""
    return any(ch.isalnum() for ch in text)


def clean_text(text: str) -> str:
    """Text fit to speak: emoji and lone surrogates dropped, line breaks kept (a line ends a sentence), other control
    characters and whitespace runs made one space.

    Raises:
        InputTextError: no letter or digit is left.
    """
    if not isinstance(text, str):
        raise InputTextError(f"text must be a string, got {type(text).__name__}")
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if cat == "Cs" or is_emoji(ch):  # a lone surrogate cannot be encoded as UTF-8, so no tokenizer can take it
            continue
        kept.append("\n" if ch == "\n" or cat in ("Zl", "Zp") else " " if cat == "Cc" else ch)
    cleaned = re.sub(r"[ \t\u00a0\u3000]+", " ", "".join(kept))
    cleaned = "\n".join(line.strip() for line in cleaned.split("\n") if line.strip())
    if not has_words(cleaned):
        raise InputTextError("nothing to speak: the text has no letters or digits")
    return cleaned


def speech_seconds(text: str) -> float:
    """About how long cleaned `text` takes to say at a conversational pace (an estimate to show, not a limit)."""
    cjk = sum(1 for ch in text if is_cjk(ch))
    return cjk / _CJK_CHARS_PER_S + (len(text) - cjk) / _CHARS_PER_S
