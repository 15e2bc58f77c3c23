"""Clause splitter: turns the LLM's token stream into speakable clauses for the TTS, as soon as each is whole.

The first clause is kept short so speech starts early; later ones run to a sentence end (or a clause
mark once they are long). Markdown is stripped and fenced code is skipped (or replaced by a
placeholder clause), because neither can be spoken. Pure logic: no model, no threads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from engine.text import (CJK_CLAUSE_MARKS, CJK_SENTENCE_ENDS, CLAUSE_MARKS, SENTENCE_ENDS, has_words, is_cjk,
                         is_emoji)

__all__ = ["ClauseOptions", "ClauseSplitter", "iter_clauses", "speakable_text", "split_clauses"]


@dataclass(frozen=True)
class ClauseOptions:
    """Where clauses break.

    min_first_words: a clause mark (, ; : dash) ends the FIRST clause once it has this many words;
        a short first clause lets the TTS start while the LLM is still writing.
    min_words: a clause mark ends a later clause once it has this many words; sentence ends
        (. ! ? 。！？) and line ends always end a clause.
    max_words: a clause with no punctuation breaks at the next space after this many words.
    code_placeholder: spoken in place of a fenced ``` code block; "" (the default) skips the code
        silently, since the GUI shows it and no placeholder suits every language.
    A CJK character counts as one word (CJK has no spaces between words).
    """

    min_first_words: int = 3
    min_words: int = 12
    max_words: int = 40
    code_placeholder: str = ""

    def __post_init__(self):
        for name in ("min_first_words", "min_words", "max_words"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_words < max(self.min_first_words, self.min_words):
            raise ValueError(
                f"max_words ({self.max_words}) must be >= min_first_words ({self.min_first_words}) "
                f"and min_words ({self.min_words})"
            )


_DASHES = "—–"
_PUNCT = SENTENCE_ENDS + CLAUSE_MARKS + CJK_SENTENCE_ENDS + CJK_CLAUSE_MARKS
_CLOSERS = "\"')]}”’」』）》】"
_OPENERS = "\"'([{“‘「『（《【"
# Words whose trailing period does not end a sentence ("Mr. Smith", "etc. and so on").
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc approx inc ltd corp co fig eq vol cf al dept est mt".split()
)
_DOTTED_LETTERS = re.compile(r"(?:[a-z]\.)+")  # e.g. i.e. u.s. p.m. and initials ("J.")
_SPACE_BEFORE_PUNCT = re.compile(f" (?=[{re.escape(_PUNCT)}])")
_LINE_DECORATION = re.compile(r"[\s\-*_=#>+`]*")  # a line of only these is a rule or a bare marker


def _word_count(text: str) -> int:
    n = 0
    for token in text.split():
        cjk = sum(1 for ch in token if is_cjk(ch))
        n += cjk + (1 if any(ch.isalnum() and not is_cjk(ch) for ch in token) else 0)
    return n


def _classify_line_start(prefix: str) -> tuple[str, int]:
    """What the start of a line is: ("more", 0) undecided, ("marker", n) n chars of markdown
    to drop, ("fence", 0) a ``` fence, ("text", 0) plain text."""
    s = prefix.lstrip(" \t")
    indent = len(prefix) - len(s)
    if not s:
        return "more", 0
    ch = s[0]
    if ch == "`":
        if s in ("`", "``"):
            return "more", 0
        return ("fence", 0) if s.startswith("```") else ("text", 0)
    if ch == "#":
        hashes = len(s) - len(s.lstrip("#"))
        if hashes == len(s):
            return "more", 0
        return ("marker", indent + hashes + 1) if s[hashes] == " " else ("text", 0)
    if ch in "-*+>_=":
        if ch in "-*+>" and len(s) >= 2 and s[1] == " ":
            return "marker", indent + 2
        # "---" / "***" may still be a horizontal rule: wait for the line to go on or end
        return ("more", 0) if all(c == ch for c in s) else ("text", 0)
    if ch.isdigit():
        digits = len(s) - len(s.lstrip("0123456789"))
        if digits == len(s):
            return "more", 0
        if s[digits] in ".)":
            if len(s) == digits + 1:
                return "more", 0
            if s[digits + 1] == " ":
                return "marker", indent + digits + 2  # "2. item" (but "3.14" is text)
        return "text", 0
    return "text", 0


class _Normalizer:
    """Stage one: raw LLM text in, speakable text out (markdown, code and emoji removed).

    A line end is passed on as "\\n", which the splitter treats as a clause end.
    """

    def __init__(self, options: ClauseOptions):
        self._options = options
        self._line_start = True
        self._prefix = ""  # start of the current line, held until it is known to be text or markup
        self._in_fence = False
        self._fence_line = ""
        self._fence_opening_line = False

    def feed(self, text: str) -> str:
        return "".join(self._char(ch) for ch in text)

    def flush(self) -> str:
        out = ""
        if self._line_start and self._prefix and not _LINE_DECORATION.fullmatch(self._prefix):
            out = self._inline(self._prefix)
        self.__init__(self._options)
        return out

    def _char(self, ch: str) -> str:
        if ch == "\r":
            return ""
        if self._in_fence:
            return self._fence_char(ch)
        if not self._line_start:
            if ch == "\n":
                self._line_start = True
                return "\n"
            return self._inline(ch)
        if ch == "\n":
            out = "" if _LINE_DECORATION.fullmatch(self._prefix) else self._inline(self._prefix)
            self._prefix = ""
            return out + "\n"
        self._prefix += ch
        kind, n = _classify_line_start(self._prefix)
        if kind == "more":
            return ""
        if kind == "fence":
            self._prefix = ""
            self._in_fence, self._fence_line, self._fence_opening_line = True, "", True
            placeholder = self._options.code_placeholder
            return f"\n{placeholder}\n" if placeholder else "\n"
        if kind == "marker":
            # nested markers ("> - item") are checked again on what follows
            rest, self._prefix = self._prefix[n:], ""
            return "".join(self._char(c) for c in rest)
        text, self._prefix, self._line_start = self._prefix, "", False
        return self._inline(text)

    def _fence_char(self, ch: str) -> str:
        if ch != "\n":
            self._fence_line += ch
            return ""
        closing = not self._fence_opening_line and self._fence_line.lstrip().startswith("```")
        self._fence_line, self._fence_opening_line = "", False
        if closing:
            self._in_fence, self._line_start = False, True
            return "\n"
        return ""

    @staticmethod
    def _inline(text: str) -> str:
        return "".join(
            " " if ch == "\t" else ch for ch in text if ch not in "*`" and not is_emoji(ch)
        )


@dataclass
class _Candidate:
    """A possible clause end just seen; the next character decides it."""

    sentence: bool  # a sentence end (else a clause mark)
    run: str  # the punctuation run so far, e.g. "." or "?!"
    needs_space: bool  # ASCII marks end a clause only before a space ("3.14", "1,000", "10:30")
    after_digit: bool = False  # a dash between digits ("10–20") is a range, not a pause


class ClauseSplitter:
    """Feed it text as it streams; it returns each clause once it is complete.

        splitter = ClauseSplitter()
        for token in tokens:
            for clause in splitter.feed(token):
                tts.speak(clause)
        for clause in splitter.flush():
            tts.speak(clause)

    Clauses have single spaces and no leading or trailing space, and each holds a letter or digit.
    The result does not depend on how the text is cut into tokens.
    """

    def __init__(self, options: ClauseOptions | None = None):
        self.options = options or ClauseOptions()
        self._normalizer = _Normalizer(self.options)
        self._reset()

    def _reset(self):
        self._cur = ""
        self._pending: _Candidate | None = None
        self._emitted = 0

    def feed(self, text: str) -> list[str]:
        """Take the next piece of text (any length); returns the clauses it completed, in order."""
        out: list[str] = []
        for ch in self._normalizer.feed(text):
            self._char(ch, out)
        return out

    def flush(self) -> list[str]:
        """End of the reply: returns what is left (at most one clause) and resets for a new reply.

        A remainder with no letter or digit (a stray "." or "—") is dropped: there is nothing to say.
        """
        out: list[str] = []
        for ch in self._normalizer.flush():
            self._char(ch, out)
        if has_words(self._cur):
            self._emit(out)
        self._reset()
        return out

    def _emit(self, out: list[str]):
        # a space before punctuation is left behind by a removed emoji or markdown mark
        out.append(_SPACE_BEFORE_PUNCT.sub("", " ".join(self._cur.split())))
        self._cur = ""
        self._emitted += 1

    def _eligible(self, cand: _Candidate) -> bool:
        if not has_words(self._cur):
            return False
        if cand.sentence:
            if cand.run == ".":
                token = self._cur.rstrip(_CLOSERS).split()[-1].lstrip(_OPENERS).lower()
                if token[:-1] in _ABBREVIATIONS or _DOTTED_LETTERS.fullmatch(token):
                    return False
            return True
        least = self.options.min_first_words if self._emitted == 0 else self.options.min_words
        return _word_count(self._cur) >= least

    def _char(self, ch: str, out: list[str]):
        cand = self._pending
        if cand is not None:
            if ch in _CLOSERS:
                self._cur += ch
                return
            if ch in _PUNCT or ch in _DASHES:
                self._cur += ch
                cand.run += ch
                cand.sentence = cand.sentence or ch in SENTENCE_ENDS + CJK_SENTENCE_ENDS
                cand.needs_space = cand.needs_space and ch not in CJK_SENTENCE_ENDS + CJK_CLAUSE_MARKS + _DASHES
                return
            self._pending = None
            if cand.needs_space:
                ends = ch.isspace()
            else:
                ends = not (cand.after_digit and ch.isdigit())
            if ends and self._eligible(cand):
                self._emit(out)  # then ch starts the next clause (a space there is dropped)
        if ch == "\n":
            if has_words(self._cur):
                self._emit(out)
            elif self._cur:
                self._cur += " "
            return
        if ch.isspace():
            if has_words(self._cur) and _word_count(self._cur) >= self.options.max_words:
                self._emit(out)
            elif self._cur:
                self._cur += " "
            return
        prev = self._cur[-1:] or " "
        self._cur += ch
        if ch in SENTENCE_ENDS:
            self._pending = _Candidate(sentence=True, run=ch, needs_space=True)
        elif ch in CLAUSE_MARKS:
            self._pending = _Candidate(sentence=False, run=ch, needs_space=True)
        elif ch in CJK_SENTENCE_ENDS:
            self._pending = _Candidate(sentence=True, run=ch, needs_space=False)
        elif ch in CJK_CLAUSE_MARKS:
            self._pending = _Candidate(sentence=False, run=ch, needs_space=False)
        elif ch in _DASHES:
            self._pending = _Candidate(sentence=False, run=ch, needs_space=False, after_digit=prev.isdigit())
        elif ch == "-" and prev.isspace():
            self._pending = _Candidate(sentence=False, run=ch, needs_space=True)  # "well - then"


def iter_clauses(tokens: Iterable[str], options: ClauseOptions | None = None) -> Iterator[str]:
    """Clauses of a token stream, each yielded as soon as it is complete (lazy)."""
    splitter = ClauseSplitter(options)
    for token in tokens:
        yield from splitter.feed(token)
    yield from splitter.flush()


def split_clauses(text: str, options: ClauseOptions | None = None) -> list[str]:
    """All clauses of a whole text; equals streaming it through ClauseSplitter in any pieces.

    Args:
        text: LLM output, possibly with markdown, code fences, emoji, CJK.
        options: where to break; ClauseOptions() by default.
    Returns:
        Speakable clauses in order, none empty.
    """
    return list(iter_clauses([text], options))


def speakable_text(text: str, options: ClauseOptions | None = None) -> str:
    """The text the clauses are cut from: markdown marks, fenced code and emoji removed."""
    normalizer = _Normalizer(options or ClauseOptions())
    return normalizer.feed(text) + normalizer.flush()
