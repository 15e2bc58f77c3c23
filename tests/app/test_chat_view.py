"""The chat view on real widgets: partial transcripts, growing replies, the spoken clause highlighted."""

from app.chat_view import ChatView
from engine.history import Turn


def roles(view):
    return [(b.role, b.text) for b in view.bubbles]


def test_a_partial_transcript_is_replaced_by_the_final_one(qtbot):
    """Partials update one bubble while the user speaks; the final transcript takes its place."""
    view = ChatView()
    qtbot.addWidget(view)
    view.show_partial("what is")
    view.show_partial("what is the time")
    assert roles(view) == [("partial", "what is the time")]
    view.add_user("What is the time?")
    assert roles(view) == [("user", "What is the time?")]


def test_the_reply_grows_and_the_clause_being_spoken_is_highlighted(qtbot):
    """ReplyText grows one assistant bubble; each SpeakingClause highlights that clause, the earlier one no longer."""
    view = ChatView()
    qtbot.addWidget(view)
    view.add_user("Colors?")
    view.reply_text("Red,")
    view.reply_text("Red, green and blue. Also")
    view.reply_text("Red, green and blue. Also yellow.")
    reply = view.bubbles[-1]
    assert roles(view) == [("user", "Colors?"), ("assistant", "Red, green and blue. Also yellow.")]

    view.speaking_clause("Red, green and blue.", 0)
    shown = reply.label.text()
    assert "<span" in shown and shown.index("<span") < shown.index("Red, green and blue.") < shown.index("</span>")
    view.speaking_clause("Also yellow.", 1)
    shown = reply.label.text()
    assert shown.startswith("Red, green and blue. <span") and shown.index("Also yellow.") < shown.index("</span>")

    view.finish_reply("Red, green and blue. Also yellow.")
    assert "<span" not in reply.label.text() and reply.note.isHidden()


def test_an_interrupted_reply_is_marked_and_a_failed_turn_says_why(qtbot):
    """Barge-in marks the reply 'interrupted'; a failed turn without a reply leaves a notice line."""
    view = ChatView()
    qtbot.addWidget(view)
    view.add_user("Tell me a story.")
    view.reply_text("Once upon a time")
    view.finish_reply("Once upon a time", interrupted=True)
    assert not view.bubbles[-1].note.isHidden() and view.bubbles[-1].note.text() == "interrupted"
    view.show_partial("uh")
    view.fail_turn("heard no words; please speak again")
    assert roles(view)[-1] == ("notice", "heard no words; please speak again")
    assert "partial" not in [b.role for b in view.bubbles]


def test_text_is_shown_as_text_not_markup(qtbot):
    """What the user or the LLM writes is escaped: tags show as typed."""
    view = ChatView()
    qtbot.addWidget(view)
    view.add_user("<b>bold</b> & co")
    assert view.bubbles[-1].label.text() == "&lt;b&gt;bold&lt;/b&gt; &amp; co"


def test_a_saved_conversation_is_shown_turn_by_turn(qtbot):
    """show_turns() replaces the view with the saved turns, interrupted ones marked."""
    view = ChatView()
    qtbot.addWidget(view)
    view.add_user("old")
    view.show_turns([Turn("user", "Hi"), Turn("assistant", "Hello there, how", heard_text="Hello", interrupted=True)])
    assert roles(view) == [("user", "Hi"), ("assistant", "Hello there, how")]
    assert view.bubbles[-1].note.text() == "interrupted"
    view.show_turns([Turn("assistant", "Read this out.", as_written=True), Turn("assistant", "A reply.")])
    assert [b.note.text() for b in view.bubbles] == ["said as you typed it", ""]


def test_typed_text_parley_says_is_marked_as_such_through_the_turn(qtbot):
    """Ctrl+Enter's bubble is Parley's, marked "said as you typed it" from the start; the engine's text fills it, and
    an interruption adds to the mark rather than replacing it."""
    view = ChatView()
    qtbot.addWidget(view)
    view.add_as_written("Read this out, please.")
    view.reply_text("Read this out, please.")
    assert roles(view) == [("assistant", "Read this out, please.")]
    view.finish_reply("Read this out, please.", interrupted=True)
    assert view.bubbles[-1].note.text() == "said as you typed it · interrupted"


def test_an_empty_conversation_says_what_to_do_until_the_first_turn(qtbot):
    """A new conversation is not a blank pane: a hint says how to talk; it goes with the first bubble and comes back
    when the conversation is cleared (Ctrl+N)."""
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    assert view.hint.isVisible() and "hold Space" in view.hint.text()
    view.add_user("Hello")
    assert not view.hint.isVisible()
    view.clear()
    assert view.hint.isVisible()


def test_a_reply_keeps_its_audio_for_save_audio_the_last_twenty_only(qtbot):
    """finish_reply() hands each reply the audio of what was heard; its context menu saves it (asking the window),
    copies its text, and says when a reply's audio is not kept: older than the last KEPT_AUDIO replies, or reopened
    from the history (which keeps no audio)."""
    import numpy as np
    from PySide6.QtGui import QGuiApplication

    from app.chat_view import KEPT_AUDIO

    view = ChatView()
    qtbot.addWidget(view)
    for n in range(KEPT_AUDIO + 2):
        view.add_user(f"question {n}")
        view.reply_text(f"answer {n}")
        view.finish_reply(f"answer {n}", audio=(np.full(240, n, np.float32), 24_000))
    replies = [b for b in view.bubbles if b.role == "assistant"]
    assert [b.audio is None for b in replies] == [True, True] + [False] * KEPT_AUDIO
    assert view.last_audio() is replies[-1] and replies[-1].audio[0][0] == KEPT_AUDIO + 1

    menu = view._menu(replies[-1], replies[-1].rect().center())
    copy, save = menu.actions()
    assert save.text() == "Save audio…" and save.isEnabled()
    with qtbot.waitSignal(view.save_audio_requested) as asked:
        save.trigger()
    assert asked.args == [replies[-1]]
    copy.trigger()
    assert QGuiApplication.clipboard().text() == f"answer {KEPT_AUDIO + 1}"
    menu.close()
    menu = view._menu(replies[0], replies[0].rect().center())
    assert not menu.actions()[1].isEnabled() and "not kept" in menu.actions()[1].text()
    menu.close()


def test_a_short_message_makes_a_short_bubble_and_a_long_one_wraps_at_most_four_fifths_wide(qtbot):
    """The report saw one-line bubbles stretched across a 1,400-pixel window: a bubble is as wide as its text, up to
    WIDEST of the view, and a long one wraps inside that, tall enough for all its lines, also after the view narrows."""
    from app.chat_view import WIDEST

    view = ChatView()
    qtbot.addWidget(view)
    view.resize(1400, 500)
    view.show()
    short = view.add_user("Hi!")
    long = view.add_user("A question that goes on and on, " * 12)
    widest = view.viewport().width() * WIDEST
    qtbot.waitUntil(lambda: 0 < short.width() < 120 and widest - 2 <= long.width() <= widest)
    view.resize(500, 500)
    widest = view.viewport().width() * WIDEST
    qtbot.waitUntil(lambda: long.width() <= widest and long.height() >= long.heightForWidth(long.width()))
    assert long.label.height() >= long.label.heightForWidth(long.label.width())  # every line shows


def test_a_growing_reply_is_drawn_in_batches_and_keeps_its_highlight(qtbot, monkeypatch):
    """Tokens faster than REPLY_DRAW_MS are drawn together (each draw lays out the whole text again in the GUI
    thread), the text is always the newest, and a draw after a clause started keeps that clause highlighted."""
    from app.chat_view import REPLY_DRAW_MS

    view = ChatView()
    qtbot.addWidget(view)
    view.add_user("Count for me.")
    view.reply_text("One")
    bubble = view.bubbles[-1]
    draws = []
    real = bubble.label.setText
    monkeypatch.setattr(bubble.label, "setText", lambda shown: (draws.append(shown), real(shown)))
    text = "One"
    for _ in range(200):
        text += " two"
        view.reply_text(text)
    assert bubble.text == text and draws == []  # 200 tokens, no draw yet
    view.speaking_clause("One two two", 0)  # the first clause starts playing: drawn at once, highlighted
    view.reply_text(text + " three.")
    qtbot.wait(3 * REPLY_DRAW_MS)
    assert len(draws) == 2 and draws[-1].endswith("two three.") and "background-color" in draws[-1]
