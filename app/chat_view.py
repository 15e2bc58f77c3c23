"""The conversation as chat bubbles: the user's turns (a live partial transcript while they speak), and
the assistant's reply as it grows, with the clause being spoken highlighted.

The window feeds it the engine's events (engine/events.py); it keeps only what it shows.
Object names for the style sheet (assets/): QFrame#bubble with the dynamic property role = "user",
"assistant", "partial" or "notice"; QLabel#bubbleText inside; QLabel#bubbleNote under an interrupted
or failed reply, or typed text Parley said as written. A reply keeps the audio of what was heard (the last
KEPT_AUDIO replies), which its context menu saves as a WAV file.
"""

from __future__ import annotations

import html

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QPalette
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QMenu, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

ROLES = ("user", "assistant", "partial", "notice")
WIDEST = 0.8  # a bubble's widest, as a share of the conversation's width; a short one is as wide as its text
AS_WRITTEN = "said as you typed it"  # the note of a turn in which Parley said the user's text, not a reply
KEPT_AUDIO = 20  # replies whose audio is kept for "Save audio…": a minute of speech is 5.8 MB
# a growing reply is drawn at most this often, not at every token: each draw lays out all its text again, in the GUI
# thread, which shares Python with the engine's threads on a small machine
REPLY_DRAW_MS = 50


class Bubble(QFrame):
    """One message: its text, and a small note under it ("interrupted", "not sent: ..."), after its tag where it
    has one (AS_WRITTEN)."""

    def __init__(self, role: str, text: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
        self.setObjectName("bubble")
        self.setProperty("role", role)
        self.role = role
        self.tag = ""
        self.audio = None  # (float32 samples, rate_hz) of what was heard, for a reply
        self.label = QLabel(objectName="bubbleText", wordWrap=True, textFormat=Qt.TextFormat.RichText)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.label.setContextMenuPolicy(Qt.ContextMenuPolicy.NoContextMenu)  # the bubble's menu, which copies too
        self.note = QLabel(objectName="bubbleNote", wordWrap=True)
        self.note.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.addWidget(self.label)
        layout.addWidget(self.note)
        self.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Preferred)  # its height follows its width
        self.set_text(text)

    def set_text(self, text: str, spoken: tuple[int, int] | None = None) -> None:
        """Show `text`; `spoken` = (start, end) character offsets of the part now being spoken, highlighted."""
        self.text, self.spoken = text, spoken
        if spoken is None:
            shown = html.escape(text)
        else:
            # rich text takes no palette() colours: the style sheet's highlight, read from the palette
            start, end = spoken
            colors = self.palette()
            back = colors.color(QPalette.ColorRole.Highlight).name()
            fore = colors.color(QPalette.ColorRole.HighlightedText).name()
            shown = (f"{html.escape(text[:start])}<span style='background-color:{back}; color:{fore}'>"
                     f"{html.escape(text[start:end])}</span>{html.escape(text[end:])}")
        self.label.setText(shown.replace("\n", "<br>"))

    def sizeHint(self) -> QSize:
        """As wide as its longest line (or note), so that a short message makes a short bubble; the view caps it."""
        margins = self.layout().contentsMargins()
        lines = [(self.label, line) for line in self.text.split("\n")] + [(self.note, self.note.text())]
        text = max(label.fontMetrics().horizontalAdvance(line) for label, line in lines)
        return QSize(text + margins.left() + margins.right() + 4, super().sizeHint().height())

    def set_note(self, note: str) -> None:
        shown = " · ".join(part for part in (self.tag, note) if part)
        self.note.setText(shown)
        self.note.setVisible(bool(shown))

    def set_tag(self, tag: str) -> None:
        self.tag = tag
        self.set_note("")


class ChatView(QScrollArea):
    """A scrolling column of bubbles, user turns on the right, Parley's on the left.

    The current turn is built from: show_partial() while the user speaks, add_user() for the final
    transcript or typed text, reply_text() as the reply grows, speaking_clause() as each clause starts
    playing, finish_reply() or fail_turn() at its end.
    """

    save_audio_requested = Signal(object)  # the Bubble whose audio the user wants to save

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("chatView")
        self.setAccessibleName("Conversation")
        self.setAccessibleDescription("Your turns and Parley's replies, newest last; the part of a reply being "
                                      "spoken is highlighted")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._column = QWidget(objectName="chatColumn")
        self._layout = QVBoxLayout(self._column)
        self._layout.setSpacing(8)
        self._layout.addStretch(1)  # keeps the bubbles at the bottom while there are few
        self.hint = QLabel("Talk to Parley: speak (hold Space in push-to-talk), or type below and press Enter.\n"
                           "Everything stays on this computer.", objectName="chatHint", wordWrap=True,
                           alignment=Qt.AlignmentFlag.AlignCenter)
        self._layout.addWidget(self.hint)
        self._show_hint(True)
        self.setWidget(self._column)
        self.bubbles: list[Bubble] = []
        self._partial: Bubble | None = None
        self._reply: Bubble | None = None  # the assistant bubble of the turn under way
        self._spoken_to = 0  # where the next spoken clause is looked for in the reply's text
        self._draw = QTimer(self, singleShot=True, interval=REPLY_DRAW_MS)
        self._draw.timeout.connect(self._draw_reply)
        self.verticalScrollBar().rangeChanged.connect(self._follow)

    # -- the turn under way -----------------------------------------------------------------------

    def show_partial(self, text: str) -> None:
        """The live transcript while the user speaks; replaced by add_user()."""
        if self._partial is None:
            self._partial = self._add("partial", text)
        else:
            self._partial.set_text(text)

    def add_user(self, text: str) -> Bubble:
        """A user turn (typed, or the final transcript), which starts a new turn."""
        self._drop_partial()
        self._reply, self._spoken_to = None, 0
        return self._add("user", text)

    def add_as_written(self, text: str) -> Bubble:
        """Parley saying the user's typed text as written (not a reply): its bubble, so marked, opens the turn, and the
        engine's reply_text() and finish_reply() then fill it."""
        self._drop_partial()
        self._reply, self._spoken_to = self._add("assistant", text), 0
        self._reply.set_tag(AS_WRITTEN)
        return self._reply

    def reply_text(self, text: str) -> None:
        """The reply so far (it only grows); the first call opens the assistant bubble, later ones are drawn together
        within REPLY_DRAW_MS."""
        if self._reply is None:
            self._reply = self._add("assistant", text)
        else:
            self._reply.text = text
            if not self._draw.isActive():
                self._draw.start()

    def _draw_reply(self) -> None:
        if self._reply is not None:  # the text grew since; the clause being spoken stays highlighted
            self._reply.set_text(self._reply.text, self._reply.spoken)

    def speaking_clause(self, clause: str, index: int) -> None:
        """Highlight `clause` (the index-th of the reply) in the reply bubble: its audio started playing."""
        if self._reply is None:  # the engine sends the reply's text before its first clause plays
            return
        if index == 0:
            self._spoken_to = 0
        text = self._reply.text
        start = text.find(clause.strip(), self._spoken_to)
        if start < 0:  # the clause splitter cleaned it (markdown, spaces): show it highlighted as is
            return
        end = start + len(clause.strip())
        self._spoken_to = end
        self._reply.set_text(text, spoken=(start, end))

    def finish_reply(self, reply: str, interrupted: bool = False, audio=None) -> None:
        """The turn ended: the reply's full text, marked when barge-in cut it short; audio: (samples, rate_hz) of what
        was heard, or None."""
        if self._reply is None and reply:
            self._reply = self._add("assistant", reply)
        if self._reply is not None:
            self._reply.set_text(reply)
            self._reply.set_note("interrupted" if interrupted else "")
            if audio is not None and len(audio[0]):
                self._reply.audio = audio
                for old in [b for b in self.bubbles if b.audio is not None][:-KEPT_AUDIO]:
                    old.audio = None
        self._drop_partial()
        self._reply, self._spoken_to = None, 0

    def fail_turn(self, message: str) -> None:
        """The turn failed: a note under the reply (or a notice line) saying so."""
        self._drop_partial()
        if self._reply is not None:
            self._reply.set_note(message)
        else:
            self._add("notice", message)
        self._reply, self._spoken_to = None, 0

    # -- whole conversations -----------------------------------------------------------------------

    def show_turns(self, turns) -> None:
        """Replace everything with saved turns (engine/history.py Turn), e.g. a reopened conversation."""
        self.clear()
        for turn in turns:
            if turn.role == "system":
                continue
            bubble = self._add("user" if turn.role == "user" else "assistant", turn.text)
            if turn.as_written:
                bubble.set_tag(AS_WRITTEN)
            if turn.interrupted:
                bubble.set_note("interrupted")

    def clear(self) -> None:
        for bubble in self.bubbles:
            bubble.parentWidget().deleteLater()
        self.bubbles.clear()
        self._partial = self._reply = None
        self._spoken_to = 0
        self._show_hint(True)

    # -- layout --------------------------------------------------------------------------------------

    def last_audio(self) -> Bubble | None:
        """The newest reply whose audio is kept, or None."""
        return next((b for b in reversed(self.bubbles) if b.audio is not None), None)

    def _menu(self, bubble: Bubble, at) -> QMenu:
        """A bubble's context menu: copy its text; save its audio, where it has some."""
        menu = QMenu(self)
        menu.addAction("Copy text", lambda: QGuiApplication.clipboard().setText(bubble.text))
        if bubble.role == "assistant":
            save = menu.addAction("Save audio…", lambda: self.save_audio_requested.emit(bubble))
            if bubble.audio is None:  # a reopened conversation's, or one older than the last KEPT_AUDIO
                save.setText("Save audio… (not kept for this reply)")
                save.setEnabled(False)
        menu.popup(bubble.mapToGlobal(at))
        return menu

    def _add(self, role: str, text: str) -> Bubble:
        bubble = Bubble(role, text)
        bubble.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        bubble.customContextMenuRequested.connect(lambda at: self._menu(bubble, at))
        row = QWidget()
        line = QHBoxLayout(row)
        line.setContentsMargins(0, 0, 0, 0)
        if role == "user" or role == "partial":
            line.addStretch(1)
        line.addWidget(bubble)
        if role in ("assistant", "notice"):
            line.addStretch(1)
        bubble.setMaximumWidth(int(self.viewport().width() * WIDEST))
        self._layout.addWidget(row)
        self.bubbles.append(bubble)
        self._show_hint(False)
        return bubble

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        for bubble in self.bubbles:
            bubble.setMaximumWidth(int(self.viewport().width() * WIDEST))

    def _show_hint(self, shown: bool) -> None:
        # shown, the hint takes the height (its text centred in it); hidden, the stretch above keeps the bubbles low
        self.hint.setVisible(shown)
        self._layout.setStretch(0, 0 if shown else 1)
        self._layout.setStretch(1, 1 if shown else 0)

    def _drop_partial(self) -> None:
        if self._partial is not None:
            self.bubbles.remove(self._partial)
            self._partial.parentWidget().deleteLater()
            self._partial = None

    def _follow(self, _low: int, high: int) -> None:
        self.verticalScrollBar().setValue(high)  # new text grows the column: keep the newest in view
