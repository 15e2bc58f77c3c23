"""The one rule of what can be spoken (engine/text.py), shared by the speech engine and the clause splitter."""

import pytest

from engine.errors import InputTextError
from engine.llm.clauses import split_clauses
from engine.text import CJK_SENTENCE_ENDS, SENTENCE_ENDS, clean_text, speech_seconds


@pytest.mark.parametrize("text, cleaned", [
    ("Great job 🎉👍", "Great job"),
    ("👩‍👩‍👧‍👦 family", "family"),  # the joiners of a composed emoji go with it
    ("  two\t\tspaces\x00and a NUL ", "two spaces and a NUL"),
    ("日本語のテキスト。", "日本語のテキスト。"),
    ("مرحبا بالعالم", "مرحبا بالعالم"),
    ("3:14", "3:14"),
    ("line one\n\n\nline two", "line one\nline two"),
])
def test_clean_text_keeps_words_in_any_script_and_drops_emoji_and_control_characters(text, cleaned):
    """Letters and digits of every script stay, with their punctuation; emoji and control characters go."""
    assert clean_text(text) == cleaned


@pytest.mark.parametrize("text", ["", "   ", "😀🎉👍", "!!!", "…", "—", "\x00\x07", "\ud800\udfff"[:1] * 3, "★☆"])
def test_text_with_no_letter_or_digit_has_nothing_to_speak(text):
    """Punctuation, symbols, emoji or control characters alone are refused with one readable message."""
    with pytest.raises(InputTextError, match="^nothing to speak: the text has no letters or digits$"):
        clean_text(text)


def test_the_clause_splitter_drops_what_the_speech_engine_would_refuse():
    """A reply's clauses are each speakable by the engine's rule: no clause of emoji or punctuation alone."""
    clauses = split_clauses("Sure! 🎉🎉 Here it is: … — done. 👍")
    assert clauses and all(clean_text(c) for c in clauses)
    assert not any("🎉" in c or "👍" in c for c in clauses)


def test_speech_seconds_estimates_a_conversational_pace():
    """About 150 words a minute in English, about 5 characters a second in Chinese."""
    english = "The quick brown fox jumps over the lazy dog. " * 20  # 180 words
    assert 60 <= speech_seconds(english) <= 80
    assert 18 <= speech_seconds("我们今天去公园散步。" * 10) <= 22


@pytest.mark.parametrize("end", list(SENTENCE_ENDS + CJK_SENTENCE_ENDS))
def test_the_speech_engines_segments_and_a_replys_clauses_end_sentences_alike(end):
    """Every sentence end of engine/text.py ends a TTS segment (when sentences no longer fit together) and a clause
    of an LLM reply, the Arabic and Devanagari ones too."""
    from engine.llm.clauses import ClauseOptions
    from engine.tts.prompt import split_text

    space = "" if end in CJK_SENTENCE_ENDS else " "
    first, second = f"alpha beta gamma delta{end}", f"epsilon zeta eta theta{end}"
    assert split_text(first + space + second, len(first) + 1) == [first, second]
    assert split_clauses(first + space + second, ClauseOptions(min_first_words=1, min_words=1)) == [first, second]
