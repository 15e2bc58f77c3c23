"""The history database locked by another process or on a full disk, under the real conversation loop
(SmolLM2, the tiny TTS, the Player on the null sink): no turn is lost or doubled, and the caller is told."""

import sqlite3
import subprocess
import sys
import threading
from contextlib import contextmanager

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the README's install builds it)")

from engine.errors import HistoryError
from engine.history import HistoryStore, Turn
from engine.llm.chat import ChatModel, ChatOptions
from engine.llm.clauses import ClauseOptions
from engine.metrics import MetricsRecorder
from engine.dialogue import Dialogue, DialogueOptions
from engine.events import Notice, TurnFinished
from engine.voice_loop import VoiceLoop

WAIT_S = 120  # generous: the null sink runs slow and the machine is shared
CLAUSES = ClauseOptions(min_first_words=1, min_words=2)

# Another program writing the history file: it takes the write lock and holds it until told to let go.
_LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
db.execute("CREATE TABLE IF NOT EXISTS other_program (x)")
print("locked", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
db.close()
"""


@contextmanager
def locked(path):
    """The history file held by a second process for the duration of the block."""
    locker = subprocess.Popen([sys.executable, "-c", _LOCKER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout.readline().strip() == "locked"
        yield
    finally:
        locker.stdin.write("\n")
        locker.stdin.close()
        assert locker.wait(30) == 0


def turns_in_file(path):
    """(role, text) of every saved turn, read by a separate connection, in the order they were written."""
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT conversation_id, role, text FROM turns ORDER BY id").fetchall()
    finally:
        db.close()


@pytest.fixture(scope="module")
def chat(smollm2_path):
    return ChatModel(smollm2_path, ChatOptions(n_ctx=512, max_tokens=12, n_threads=1, temperature=0.0))


@pytest.fixture(scope="module")
def player(pulse_server):
    from engine.audio import Player

    pulse_server.ensure_running()  # an audio test may have killed it
    with Player() as player:
        yield player


@pytest.fixture
def dialogue(chat, short_tts, player, tmp_path):
    chat.clear_history()
    # a short wait for the lock keeps the test quick; the app's default is 2 s
    with HistoryStore(tmp_path / "history.sqlite3", timeout_s=0.2) as history:
        yield Dialogue(chat, short_tts, player, history, metrics=MetricsRecorder(),
                       options=DialogueOptions(speaker="ryan", tts_seed=1, clauses=CLAUSES))


def notices():
    """A turn's event callback that collects the errors of its Notices, and the list they go to."""
    seen = []
    return (lambda event: seen.append(event.error) if isinstance(event, Notice) else None), seen


def test_a_turn_while_another_process_holds_the_lock_is_saved_with_the_next_one(dialogue):
    """lock -> a typed turn (spoken, with a HistoryError notice naming the file) -> unlock -> the next turn:
    the file holds both turns' user and assistant messages, in order, once each."""
    path = dialogue.history.path
    hooks, seen = notices()
    first = dialogue.text_turn("Name a color.")  # creates the conversation while the file is free
    with locked(path):
        second = dialogue.text_turn("Name a fruit.", hooks)
        assert second.reply_text.strip() and second.heard_text  # the turn itself went on: spoken and heard
        assert seen and all(isinstance(e, HistoryError) for e in seen)
        assert str(path) in str(seen[0]) and "locked" in str(seen[0]) and "unsaved turns are kept" in str(seen[0])
        assert [t.text for _, t in dialogue.history.pending] == ["Name a fruit.", second.reply_text]
    third_hooks, after = notices()
    third = dialogue.text_turn("Name an animal.", third_hooks)
    assert after == [] and dialogue.history.pending == []
    cid = dialogue.conversation_id
    assert turns_in_file(path) == [
        (cid, "user", "Name a color."), (cid, "assistant", first.reply_text),
        (cid, "user", "Name a fruit."), (cid, "assistant", second.reply_text),
        (cid, "user", "Name an animal."), (cid, "assistant", third.reply_text),
    ]


def test_turns_spoken_before_the_conversation_could_be_created_are_kept(dialogue):
    """Locked from the first turn (no conversation can be started): its turn waits in memory and lands, in
    order, in the conversation the next turn creates."""
    path = dialogue.history.path
    hooks, seen = notices()
    with locked(path):
        dialogue.say("Good morning.", hooks)
        assert dialogue.conversation_id is None and len(seen) == 1 and "save 1 turn(s)" in str(seen[0])
    dialogue.say("Here is the news.")
    cid = dialogue.conversation_id
    assert turns_in_file(path) == [(cid, "assistant", "Good morning."), (cid, "assistant", "Here is the news.")]
    assert all(t.as_written for t in dialogue.history.open_conversation(cid).turns)  # said as typed, not replies
    assert len(dialogue.history.list_conversations()) == 1


def test_a_full_disk_keeps_the_turn_and_saves_it_when_there_is_room(dialogue):
    """SQLITE_FULL (the file may not grow, as on a full disk) while a turn ends: a notice says the disk is full,
    the turn is kept, and it is written once there is room, before the next turn."""
    path = dialogue.history.path
    dialogue.say("Short.")
    db = dialogue.history._db  # the store's own connection: max_page_count holds for it only
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")
    hooks, seen = notices()
    long_text = "A long answer, " + "word " * 2000 + "the end."
    dialogue.say(long_text, hooks)
    assert len(seen) == 1 and "disk is full; free some space" in str(seen[0])
    db.execute("PRAGMA max_page_count = 1073741823")  # space freed
    dialogue.say("After.")
    cid = dialogue.conversation_id
    assert [text for _, _, text in turns_in_file(path)] == ["Short.", long_text, "After."]
    assert {c for c, _, _ in turns_in_file(path)} == {cid}


def test_the_voice_loop_reports_the_locked_history_as_a_notice(dialogue):
    """A typed turn through the VoiceLoop while the file is locked finishes normally and emits a Notice
    carrying the HistoryError; the turn is saved once the file is free."""
    events, got = [], threading.Event()

    def collect(event):
        events.append(event)
        if isinstance(event, TurnFinished):
            got.set()

    loop = VoiceLoop(dialogue)  # no microphone: typed turns only
    loop.subscribe(collect)
    with locked(dialogue.history.path):
        loop.start()
        with loop:
            loop.submit_text("Say hello.", speak_only=True)
            assert got.wait(WAIT_S), f"no TurnFinished; events: {events}"
    notice = [e for e in events if isinstance(e, Notice)]
    assert len(notice) == 1 and isinstance(notice[0].error, HistoryError) and notice[0].message == str(notice[0].error)
    assert events.index(notice[0]) < next(i for i, e in enumerate(events) if isinstance(e, TurnFinished))
    dialogue.say("Goodbye.")
    assert [text for _, _, text in turns_in_file(dialogue.history.path)] == ["Say hello.", "Goodbye."]


def test_closing_saves_the_turns_held_while_the_file_was_locked(tmp_path):
    """Turns held back by another program's lock are written by close() once the lock is gone."""
    path = tmp_path / "history.sqlite3"
    history = HistoryStore(path, timeout_s=0.2)
    cid = history.new_conversation()
    with locked(path):
        with pytest.raises(HistoryError, match="locked"):
            history.add_turn(cid, Turn("user", "Held back."))
    history.close()
    assert turns_in_file(path) == [(cid, "user", "Held back.")]


def test_closing_while_still_locked_says_how_many_turns_were_not_saved(tmp_path):
    """close() while another program still holds the lock raises a HistoryError naming the file and the two
    unsaved turns (which stay in `pending`); the file is closed all the same."""
    path = tmp_path / "history.sqlite3"
    history = HistoryStore(path, timeout_s=0.2)
    cid = history.new_conversation()
    with locked(path):
        for text in ("First.", "Second."):
            with pytest.raises(HistoryError):
                history.add_turn(cid, Turn("user", text))
        with pytest.raises(HistoryError, match=r"2 turns could not be saved before closing.*locked") as closing:
            history.close()
    assert str(path) in str(closing.value) and [t.text for _, t in history.pending] == ["First.", "Second."]
    history.close()  # closed already: nothing more to try
    assert turns_in_file(path) == []
