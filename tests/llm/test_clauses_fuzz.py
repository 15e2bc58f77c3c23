"""Generated LLM replies through the clause splitter: no crash, clean clauses, nothing said twice or lost.

Replies are drawn from what a small model writes on a bad day: all punctuation, code (fenced and
inline), URLs, markdown tables, lists, emoji, CJK, stray markdown, any code point at all.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.llm.clauses import ClauseSplitter, speakable_text, split_clauses

PIECES = [
    "Sure!", "Here is the code:", "```python\nprint('hi')\n```", "`x = 1`", "https://example.com/a?b=c&d=e",
    "| a | b |\n|---|---|\n| 1 | 2 |", "- item one\n- item two", "1. first\n2. second", "**bold** and _it_",
    "# Heading", "...", "?!?!", ",,,;;;:::", "—", "😀🎉", "日本語です。", "Dr. Smith, e.g. 3.14 or 1,000.",
    "\n\n", "   ", "> quoted", "~~~", "\\n", "\t", "(parenthetical)", "\"quoted.\"", "10–20",
]

replies = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=400),
    st.lists(st.sampled_from(PIECES), max_size=15).map(" ".join),
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=15)), max_size=10).map("".join),
    st.text(st.sampled_from(".,;:!?…—-*_`#|~ \n"), max_size=200),  # all punctuation and markup
)


def _alnum(text: str) -> list[str]:
    return [ch for ch in text if ch.isalnum()]


@settings(max_examples=1000, deadline=None)
@given(reply=replies, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=30))
def test_any_reply_splits_into_clean_clauses_however_it_is_streamed(reply, cuts):
    """Each clause is trimmed, single-spaced and has a letter or digit; the clauses hold every letter and
    digit of the speakable text, in order, once; cutting the reply into other tokens changes nothing."""
    clauses = split_clauses(reply)
    for clause in clauses:
        assert clause and clause == " ".join(clause.split()) and any(ch.isalnum() for ch in clause)
    assert _alnum("".join(clauses)) == _alnum(speakable_text(reply))
    splitter, streamed, start = ClauseSplitter(), [], 0
    for cut in sorted(set(cuts)):
        streamed += splitter.feed(reply[start:cut])
        start = max(start, cut)
    streamed += splitter.feed(reply[start:]) + splitter.flush()
    assert streamed == clauses
