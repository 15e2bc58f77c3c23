"""Clause splitter: where clauses break, what is stripped, and that streaming equals splitting whole."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.llm.clauses import ClauseOptions, ClauseSplitter, iter_clauses, speakable_text, split_clauses


def _stream(text: str, cuts: list[int]) -> list[str]:
    splitter, out, start = ClauseSplitter(), [], 0
    for cut in sorted(set(c % (len(text) + 1) for c in cuts)) + [len(text)]:
        out += splitter.feed(text[start:cut])
        start = cut
    return out + splitter.flush()


def test_first_clause_breaks_at_a_comma_once_it_has_three_words():
    """A comma after three words ends the first clause, so speech can start early."""
    assert split_clauses("Well yes of course, I can help you with that today.") == [
        "Well yes of course,",
        "I can help you with that today.",
    ]


def test_first_clause_does_not_break_before_three_words():
    """A comma after one or two words is not a break: a one-word clause sounds clipped."""
    assert split_clauses("Sure, here is the answer. Next one.") == ["Sure, here is the answer.", "Next one."]


def test_later_clauses_break_at_commas_only_when_long():
    """After the first clause, commas break only once the clause has twelve words."""
    text = (
        "First of all, this is fine, and short, but this one here goes on and on for quite a few words, "
        "then stops."
    )
    assert split_clauses(text) == [
        "First of all,",
        "this is fine, and short, but this one here goes on and on for quite a few words,",
        "then stops.",
    ]


def test_sentence_ends_always_break():
    """Every . ! ? before a space ends a clause, even a one-word sentence."""
    assert split_clauses("Hi! How are you? I am fine.") == ["Hi!", "How are you?", "I am fine."]


@pytest.mark.parametrize(
    "text",
    [
        "Pi is 3.14 and e is 2.718 roughly",
        "About 1,000,000 people",
        "We meet at 10:30 tomorrow",
        "Fruit e.g. apples and i.e. pears",
        "Mr. Smith and Dr. Jones met Prof. Lee",
        "She moved to the U.S. last year",
        "Visit https://example.com/a.b?c=1,2 for more",
        "Pages 10–20 of the book",
        "A well-known and long-standing fact",
    ],
)
def test_no_break_inside_numbers_abbreviations_urls_or_ranges(text):
    """Numbers, times, abbreviations, URLs, hyphenated words and ranges stay in one clause."""
    assert split_clauses(text + ".") == [text + "."]


def test_a_sentence_end_after_a_number_or_url_still_breaks():
    """A period after a number or URL, followed by a space, does end the sentence."""
    assert split_clauses("I counted 3. See example.com. Done.") == ["I counted 3.", "See example.com.", "Done."]


def test_closing_quotes_stay_with_their_clause():
    """Quotes and brackets after a sentence end belong to that sentence."""
    assert split_clauses('He said "stop." Then he left (finally.) Bye.') == [
        'He said "stop."',
        "Then he left (finally.)",
        "Bye.",
    ]


def test_cjk_punctuation_breaks_without_spaces():
    """。！？ end a clause with no space after them; ， does once the clause has three characters."""
    assert split_clauses("你好，世界。今天天气很好！我们去公园吧？好") == [
        "你好，世界。",
        "今天天气很好！",
        "我们去公园吧？",
        "好",
    ]
    assert split_clauses("我觉得很好，谢谢你。") == ["我觉得很好，", "谢谢你。"]


def test_markdown_is_stripped_and_lines_end_clauses():
    """Headings, bullets, numbers, bold and inline code marks go; each list item is its own clause."""
    text = "## Steps\n- **Open** the `file`\n* save it\n2. close it\n---\n> quoted line\n"
    assert split_clauses(text) == ["Steps", "Open the file", "save it", "close it", "quoted line"]


def test_a_number_at_line_start_is_text_not_a_list_marker():
    """'3.14 ...' at the start of a line is a number, not a numbered list item."""
    assert split_clauses("3.14 is pi.\n42 is the answer.") == ["3.14 is pi.", "42 is the answer."]


def test_code_blocks_are_skipped_by_default():
    """A fenced code block is not spoken; the text around it is."""
    text = "Here is code:\n```python\nx = 1, y = 2.\nprint(x)\n```\nThat prints one."
    assert split_clauses(text) == ["Here is code:", "That prints one."]


def test_code_blocks_can_be_spoken_as_a_placeholder():
    """With code_placeholder set, the code block becomes that one clause."""
    opts = ClauseOptions(code_placeholder="The code is on screen.")
    text = "Try this:\n```\nrm -rf build\n```\nThen rebuild."
    assert split_clauses(text, opts) == ["Try this:", "The code is on screen.", "Then rebuild."]


def test_an_unclosed_code_block_swallows_the_rest():
    """A reply cut off inside a code block speaks nothing of the code."""
    assert split_clauses("Look:\n```\nwhile True:\n    pass") == ["Look:"]


def test_emoji_are_removed():
    """Emoji (including joined and flag sequences) are not spoken."""
    assert split_clauses("Great job 👍🏽! Family 👨‍👩‍👧 and flag 🇫🇷 ❤️.") == ["Great job!", "Family and flag."]


def test_long_clause_without_punctuation_breaks_at_max_words():
    """A clause with no punctuation at all breaks at a space after max_words words."""
    words = " ".join(f"w{i}" for i in range(25))
    clauses = split_clauses(words, ClauseOptions(min_words=5, max_words=10))
    assert [len(c.split()) for c in clauses] == [10, 10, 5]


def test_punctuation_only_remainder_is_dropped():
    """Nothing is returned for text with no letters or digits, and no clause is empty."""
    assert split_clauses("... — !!") == []
    assert split_clauses("") == []
    assert split_clauses("Done. ...") == ["Done."]


def test_streaming_tokens_yields_clauses_as_soon_as_complete():
    """A clause comes out with the token after its end, before the reply is over."""
    splitter = ClauseSplitter()
    assert splitter.feed("Hello there my") == []
    assert splitter.feed(" friend,") == []  # the comma might still be "1,000": wait for the next char
    assert splitter.feed(" how") == ["Hello there my friend,"]
    assert splitter.feed(" are you?") == []
    assert splitter.flush() == ["how are you?"]


def test_flush_resets_for_a_new_reply():
    """After flush, the next reply's first clause is short again."""
    splitter = ClauseSplitter()
    splitter.feed("One two three four, five.")
    splitter.flush()
    assert splitter.feed("Again one two, three") == ["Again one two,"]


def test_iter_clauses_is_lazy():
    """iter_clauses yields the first clause before the token source is exhausted."""
    def tokens():
        yield "First clause here, "
        raise AssertionError("read too far")

    assert next(iter_clauses(tokens())) == "First clause here,"


def test_options_reject_nonsense():
    """Word limits below one or max below min are refused with the field named."""
    with pytest.raises(ValueError, match="min_words"):
        ClauseOptions(min_words=0)
    with pytest.raises(ValueError, match="max_words"):
        ClauseOptions(min_words=20, max_words=10)


_ALPHABET = st.sampled_from(
    list("abcXYZ019 .,;:!?-—–\n*#`'\"()")
    + ["。", "，", "！", "你", "好", "😀", "👍🏽", "e.g.", "Mr.", "3.14", "```", "- ", "## "]
)
_TEXT = st.lists(_ALPHABET, max_size=80).map("".join)


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


@settings(max_examples=400, deadline=None)
@given(text=_TEXT, cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_clauses_rebuild_the_text_and_do_not_depend_on_token_cuts(text, cuts):
    """Joined clauses equal the speakable text (modulo spaces); none is empty; any token cut gives the same."""
    clauses = split_clauses(text)
    assert _stream(text, cuts) == clauses
    assert all(c and c == c.strip() and any(ch.isalnum() for ch in c) for c in clauses)
    joined, expected = _squash("".join(clauses)), _squash(speakable_text(text))
    assert expected.startswith(joined)
    assert not any(ch.isalnum() for ch in expected[len(joined):])  # only a wordless tail is dropped


_WORD = st.text(alphabet="abdfghkmnpqr", min_size=3, max_size=7)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.tuples(_WORD, st.sampled_from(["", "", ",", "."])), min_size=1, max_size=30))
def test_first_clause_ends_at_the_first_mark_after_three_words(parts):
    """The first clause runs exactly to the first sentence end, or the first comma once it has 3 words."""
    text = " ".join(word + mark for word, mark in parts)
    expected_len = len(parts)
    for i, (_, mark) in enumerate(parts):
        if mark == "." or (mark == "," and i + 1 >= 3):
            expected_len = i + 1
            break
    expected_len = min(expected_len, ClauseOptions().max_words)
    first = split_clauses(text)[0]
    assert first == " ".join(word + mark for word, mark in parts[:expected_len])
