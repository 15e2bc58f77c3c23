"""Conversation history on a real SQLite file: round trip, WAL, exports, delete, lock and disk-full errors."""

import json
import re
import sqlite3
import subprocess
import sys
import time

import pytest

from engine.errors import HistoryError, ParleyError
from engine.history import HistoryStore, Turn, history_path


@pytest.fixture
def store(tmp_path):
    with HistoryStore(tmp_path / "profile.sqlite3", timeout_s=0.2) as s:
        yield s


def bytes_on_disk(path) -> bytes:
    """The database and its -wal and -shm as they are on disk, read by another process: this one closing a
    file it opened would drop every SQLite lock it holds on it (POSIX locks are per process), letting the
    next program checkpoint and delete the -wal under an open store (www.sqlite.org/howtocorrupt.html 2.2)."""
    read = ("import pathlib, sys; p = pathlib.Path(sys.argv[1]); "
            "sys.stdout.buffer.write(b''.join(f.read_bytes() for f in p.parent.glob(p.name + '*')))")
    return subprocess.run([sys.executable, "-c", read, str(path)], capture_output=True, check=True).stdout


def _conversation(store) -> int:
    cid = store.new_conversation()
    store.add_turn(cid, Turn("user", "What is the  capital of France?", created_at=1000.0, metrics={"stt_ms": 120.5}))
    store.add_turn(cid, Turn("assistant", "Paris is the capital. It has many museums.",
                             heard_text="Paris is the capital.", interrupted=True, created_at=1001.0,
                             metrics={"ttfc_ms": 80.0, "llm_ttft_ms": 40.0}))
    return cid


def test_turns_round_trip_with_all_fields(store):
    """Every field of every turn comes back as written, in order, and the title is the first question."""
    cid = _conversation(store)
    conv = store.open_conversation(cid)
    assert conv.title == "What is the capital of France?"
    assert [t.role for t in conv.turns] == ["user", "assistant"]
    user, reply = conv.turns
    assert (user.text, user.heard_text, user.interrupted, user.created_at, dict(user.metrics)) == (
        "What is the  capital of France?", None, False, 1000.0, {"stt_ms": 120.5})
    assert (reply.heard_text, reply.interrupted, dict(reply.metrics)) == (
        "Paris is the capital.", True, {"ttfc_ms": 80.0, "llm_ttft_ms": 40.0})


def test_messages_use_what_was_heard_after_barge_in(store):
    """The LLM's view of an interrupted reply is only the part the user heard."""
    cid = _conversation(store)
    assert store.open_conversation(cid).messages() == [
        {"role": "user", "content": "What is the  capital of France?"},
        {"role": "assistant", "content": "Paris is the capital."},
    ]


def test_database_is_in_wal_mode(store, tmp_path):
    """The file is in WAL journal mode, as seen by an independent connection."""
    other = sqlite3.connect(tmp_path / "profile.sqlite3")
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    other.close()


def test_a_second_connection_sees_each_committed_turn(store, tmp_path):
    """Each add_turn is committed at once: another connection reads it without the store closing."""
    cid = store.new_conversation("t")
    other = sqlite3.connect(tmp_path / "profile.sqlite3")
    for n in range(1, 4):
        store.add_turn(cid, Turn("user", f"turn {n}"))
        assert other.execute("SELECT COUNT(*) FROM turns").fetchone()[0] == n
    other.close()


def test_reopening_the_file_gives_the_same_conversations(tmp_path):
    """Closing and reopening the store (a restart) lists and opens the same conversations."""
    path = tmp_path / "p.sqlite3"
    with HistoryStore(path) as s:
        cid = _conversation(s)
        before = s.open_conversation(cid)
    with HistoryStore(path) as s:
        assert [c.id for c in s.list_conversations()] == [cid]
        assert s.list_conversations()[0].turn_count == 2
        assert s.open_conversation(cid) == before


def test_list_is_most_recent_first(store):
    """list_conversations orders by last activity, newest first."""
    a = store.new_conversation("a")
    b = store.new_conversation("b")
    store.add_turn(a, Turn("user", "later", created_at=time.time() + 10))
    assert [c.title for c in store.list_conversations()] == ["a", "b"]
    assert b


def test_search_finds_every_word_in_the_title_or_any_turn_in_any_case(store):
    """search(query): the conversations holding every word of the query somewhere (title or any turn's text), matched
    by Unicode case folding (STRASSE finds Straße, ÉTÉ finds été); no words: every conversation."""
    street = store.new_conversation("Directions")
    store.add_turn(street, Turn("user", "Where is the Hauptstraße?"))
    store.add_turn(street, Turn("assistant", "Two blocks north, past the café."))
    summer = store.new_conversation("Holidays")
    store.add_turn(summer, Turn("user", "Plans for l'été?"))
    assert store.search("HAUPTSTRASSE") == {street}
    assert store.search("directions CAFÉ") == {street}  # the title's word and the reply's
    assert store.search("été") == {summer} and store.search("ÉTÉ plans") == {summer}
    assert store.search("café été") == set()  # each word is in a different conversation
    assert store.search("  ") == store.search("") == {street, summer}
    assert store.search("100%") == set() and store.search("_") == set()  # no wildcards: matched as written


def test_export_text_reads_as_a_transcript(store):
    """The text export has the title and when it began, as a person writes it, then You/Parley lines, marking the
    interrupted reply with what of it was heard."""
    text = store.export_text(_conversation(store))
    lines = text.splitlines()
    assert lines[0] == "What is the capital of France?"
    assert re.fullmatch(r"\d{1,2} [A-Z][a-z]{2} \d{4}, \d\d:\d\d", lines[1])  # "5 Dec 2026, 05:22", local time
    assert "You: What is the  capital of France?" in lines
    assert "Parley: Paris is the capital. It has many museums." in lines
    assert "  [interrupted; heard up to: “Paris is the capital.”]" in lines
    cid = store.new_conversation()
    store.add_turn(cid, Turn("user", "Tell me a story."))
    store.add_turn(cid, Turn("assistant", "Once upon a time", heard_text="", interrupted=True))
    assert "  [interrupted before any of it was heard]" in store.export_text(cid).splitlines()


def test_export_json_has_every_field(store):
    """The JSON export parses and carries each turn's fields with ISO 8601 times."""
    doc = json.loads(store.export_json(_conversation(store)))
    assert doc["title"] == "What is the capital of France?"
    assert doc["turns"][1] == {
        "role": "assistant", "text": "Paris is the capital. It has many museums.",
        "heard_text": "Paris is the capital.", "interrupted": True, "as_written": False,
        "created_at": "1970-01-01T00:16:41.000Z", "metrics": {"ttfc_ms": 80.0, "llm_ttft_ms": 40.0},
    }


def test_typed_text_parley_said_is_marked_not_taken_for_a_reply(store):
    """A turn that said the user's typed text (Ctrl+Enter) reads as such in the exports and the round trip; the report
    found it saved as a plain "Parley:" reply."""
    cid = store.new_conversation()
    store.add_turn(cid, Turn("assistant", "Hello there, this is a test.", as_written=True))
    store.add_turn(cid, Turn("assistant", "A reply."))
    assert [t.as_written for t in store.open_conversation(cid).turns] == [True, False]
    lines = store.export_text(cid).splitlines()
    assert "Parley (said as you typed it): Hello there, this is a test." in lines and "Parley: A reply." in lines
    assert [t["as_written"] for t in json.loads(store.export_json(cid))["turns"]] == [True, False]


def test_a_history_from_before_as_written_opens_and_its_turns_are_replies(tmp_path):
    """A schema-1 file (written before turns said as typed were marked) gains the column on open, keeps its turns
    as replies, and takes marked ones from then on."""
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript("""
            CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, created_at REAL NOT NULL,
                                        updated_at REAL NOT NULL);
            CREATE TABLE turns (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL REFERENCES conversations(id)
                                ON DELETE CASCADE, role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
                                text TEXT NOT NULL, heard_text TEXT, interrupted INTEGER NOT NULL DEFAULT 0,
                                created_at REAL NOT NULL, metrics TEXT NOT NULL DEFAULT '{}');
            INSERT INTO conversations VALUES (1, 'Old', 1000.0, 1001.0);
            INSERT INTO turns (conversation_id, role, text, created_at)
                VALUES (1, 'assistant', 'Said long ago.', 1001.0);
            PRAGMA user_version = 1;
        """)
    with HistoryStore(path) as store:
        store.add_turn(1, Turn("assistant", "Typed today.", as_written=True))
        turns = store.open_conversation(1).turns
    assert [(t.text, t.as_written) for t in turns] == [("Said long ago.", False), ("Typed today.", True)]
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 2


def test_delete_removes_the_conversation_and_its_turns(store, tmp_path):
    """After delete the conversation is gone from the list, and its turns from the file."""
    cid = _conversation(store)
    keep = store.new_conversation("keep")
    store.delete_conversation(cid)
    assert [c.id for c in store.list_conversations()] == [keep]
    with pytest.raises(HistoryError, match=f"no conversation {cid}"):
        store.open_conversation(cid)
    other = sqlite3.connect(tmp_path / "profile.sqlite3")
    assert other.execute("SELECT COUNT(*) FROM turns").fetchone()[0] == 0
    other.close()


def test_erase_all_leaves_no_word_in_the_files_and_the_store_goes_on(store, tmp_path):
    """erase_all(): every conversation and the pending turns go; not a byte of their text is left in the
    database, its -wal or -shm; another connection, open all along, sees it empty; new turns are saved."""
    path = tmp_path / "profile.sqlite3"
    other = sqlite3.connect(path)
    for i in range(20):  # enough pages that the file would keep free ones
        cid = _conversation(store)
        store.add_turn(cid, Turn("user", f"the vault code is zebra-{i} " * 40))
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # one more turn does not fit: it is pending
    with pytest.raises(HistoryError):
        store.add_turn(cid, Turn("user", "pending zebra " * 500))
    store._db.execute("PRAGMA max_page_count = 1073741823")
    assert b"zebra" in bytes_on_disk(path)
    store.erase_all()
    assert store.list_conversations() == [] and store.pending == []
    assert b"zebra" not in bytes_on_disk(path) and b"capital of France" not in bytes_on_disk(path)
    assert path.with_name(path.name + "-wal").stat().st_size == 0
    assert other.execute("SELECT COUNT(*) FROM conversations").fetchone() == (0,)
    cid = store.new_conversation()
    store.add_turn(cid, Turn("user", "After."))
    assert other.execute("SELECT text FROM turns").fetchall() == [("After.",)]
    other.close()


def test_erase_all_on_a_locked_file_deletes_nothing(store, tmp_path):
    """Another program holding the write lock: erase_all() raises a HistoryError saying nothing was deleted,
    and the conversations and the pending turn are all still there."""
    cid = _conversation(store)
    locker = sqlite3.connect(tmp_path / "profile.sqlite3", isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    with pytest.raises(HistoryError):
        store.add_turn(cid, Turn("user", "Kept."))
    with pytest.raises(HistoryError, match=r"cannot delete all history \(nothing was deleted\).*locked"):
        store.erase_all()
    locker.execute("ROLLBACK")
    locker.close()
    assert [t.text for _, t in store.pending] == ["Kept."]
    store.retry_pending()
    assert [t.text for t in store.open_conversation(cid).turns][-1] == "Kept."


def test_erase_all_while_another_program_reads_says_the_file_is_not_rewritten_yet(store, tmp_path):
    """A reader keeping its snapshot stops the -wal being emptied: the HistoryError says the conversations are
    deleted but some words may still be in the file; erasing again once it is done leaves none."""
    path = tmp_path / "profile.sqlite3"
    _conversation(store)
    reader = sqlite3.connect(path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM turns").fetchall()
    with pytest.raises(HistoryError, match="every conversation was deleted, but the file could not be rewritten "
                                           r"\(another program is still reading it\)"):
        store.erase_all()
    assert store.list_conversations() == []
    reader.execute("COMMIT")
    reader.close()
    store.erase_all()
    assert b"capital of France" not in bytes_on_disk(path)


def test_locked_database_gives_a_clear_error_and_keeps_the_turn(store, tmp_path):
    """While another connection holds an exclusive lock, add_turn fails within its timeout, naming the
    file and the fix; the turn is kept and written once the lock is gone."""
    cid = _conversation(store)
    locker = sqlite3.connect(tmp_path / "profile.sqlite3", isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    start = time.monotonic()
    with pytest.raises(HistoryError) as err:
        store.add_turn(cid, Turn("user", "and Germany?"))
    assert time.monotonic() - start < 5
    assert isinstance(err.value, ParleyError)
    assert "profile.sqlite3" in str(err.value) and "locked" in str(err.value)
    assert "unsaved turns are kept" in str(err.value)
    assert [t.text for _, t in store.pending] == ["and Germany?"]
    assert store.open_conversation(cid).turns[-1].text == "and Germany?"  # still part of the conversation
    locker.execute("ROLLBACK")
    locker.close()
    store.add_turn(cid, Turn("assistant", "Berlin."))
    assert store.pending == []
    assert [t.text for t in store.open_conversation(cid).turns][-2:] == ["and Germany?", "Berlin."]


def test_full_disk_gives_a_clear_error_and_loses_no_earlier_turn(store, tmp_path):
    """When SQLite reports the disk full, the error says so; earlier turns stay and the new one is kept."""
    cid = _conversation(store)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # the file may not grow: SQLITE_FULL, as on a full disk
    with pytest.raises(HistoryError, match="disk is full; free some space"):
        store.add_turn(cid, Turn("assistant", "x" * 100_000))
    assert len(store.pending) == 1
    store._db.execute("PRAGMA max_page_count = 1073741823")
    assert store.retry_pending() == 1
    with HistoryStore(tmp_path / "profile.sqlite3") as again:
        assert [len(t.text) for t in again.open_conversation(cid).turns] == [31, 42, 100_000]


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path):
    """Opening random bytes raises HistoryError naming the file and saying to move it aside."""
    path = tmp_path / "broken.sqlite3"
    path.write_bytes(b"\x13\x37 not sqlite at all " * 100)
    with pytest.raises(HistoryError, match=r"broken\.sqlite3.*move it aside"):
        HistoryStore(path)


_OPEN_READ_ONLY = """
import sys
from engine.errors import HistoryError
from engine.history import HistoryStore
try:
    HistoryStore(sys.argv[1])
except HistoryError as e:
    print(e)
"""


def test_a_read_only_history_file_is_a_clear_error_and_stays_as_it_was(tmp_path):
    """A history file (and folder) the user may not write: opening it is a HistoryError that names the
    file and says to make it writable, and the file's conversations are untouched."""
    import shutil

    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    path = tmp_path / "profile" / "history.sqlite3"
    with HistoryStore(path) as store:
        store.add_turn(store.new_conversation(), Turn("user", "Kept as it was."))
    before = path.read_bytes()
    path.chmod(0o444)
    path.parent.chmod(0o555)
    try:
        # without these capabilities root too is held to the file's permission bits
        child = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c",
                                _OPEN_READ_ONLY, str(path)], capture_output=True, text=True, timeout=60)
    finally:
        path.parent.chmod(0o755)
        path.chmod(0o644)
    assert child.returncode == 0 and "Traceback" not in child.stderr, child.stderr
    assert str(path) in child.stdout and "readonly database" in child.stdout and "writable" in child.stdout
    assert path.read_bytes() == before
    with HistoryStore(path) as store:
        (conversation,) = store.list_conversations()
        assert [t.text for t in store.open_conversation(conversation.id).turns] == ["Kept as it was."]


def test_unknown_role_and_bad_profile_names_are_refused():
    """A role outside system/user/assistant, or a profile name that is a path, is refused by name."""
    with pytest.raises(ValueError, match="unknown role 'bot'; valid roles: system, user, assistant"):
        Turn("bot", "hi")
    with pytest.raises(HistoryError, match=r"profile name '\.\./x'"):
        history_path("../x")


def test_history_path_is_one_file_per_profile(tmp_path):
    """Each profile gets its own file under the root."""
    assert history_path("work", tmp_path) == tmp_path / "work.sqlite3"
    assert history_path("home", tmp_path) != history_path("work", tmp_path)


def test_a_store_opened_later_says_why_it_cannot_open_yet_and_opens_at_its_first_use_once_it_can(tmp_path):
    """open_later: a file another program holds at start makes no error there but open_error (naming the file
    and the lock); each call tries again, failing while it is held, and works once it is free."""
    path = tmp_path / "profile.sqlite3"
    HistoryStore(path).close()
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    store = HistoryStore(path, timeout_s=0.2, open_later=True)
    try:
        assert str(path) in str(store.open_error) and "locked" in str(store.open_error)
        with pytest.raises(HistoryError, match="locked"):
            store.new_conversation()
        with pytest.raises(HistoryError, match="locked"):
            store.list_conversations()
        locker.execute("ROLLBACK")
        locker.close()
        cid = store.new_conversation()
        store.add_turn(cid, Turn("user", "Saved once it was free."))
        assert store.open_error is None
    finally:
        store.close()
    with HistoryStore(path) as again:
        assert [t.text for t in again.open_conversation(cid).turns] == ["Saved once it was free."]
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    never_opened = HistoryStore(path, timeout_s=0.2, open_later=True)
    never_opened.close()
    locker.execute("ROLLBACK")
    locker.close()
    with pytest.raises(HistoryError, match="closed"):  # closed before it could open: it does not open later
        never_opened.list_conversations()


def test_turns_of_a_conversation_not_made_yet_wait_and_make_it_with_the_first_write(tmp_path):
    """A ConversationRef whose conversation the file could not make yet: its turns wait in `pending`, beside another
    conversation's, and the next write that can makes it (titled by its first user turn) and saves them in order;
    a second ref makes a conversation of its own."""
    from engine.history import ConversationRef
    from tests.test_history_faults import locked

    path = tmp_path / "h.sqlite3"
    with HistoryStore(path, timeout_s=0.1) as store:
        saved = store.new_conversation("saved")
        first, second = ConversationRef(), ConversationRef()
        with locked(path):
            for ref, text in ((first, "Hello."), (saved, "Later."), (first, "Still here?")):
                with pytest.raises(HistoryError, match="unsaved turns are kept"):
                    store.add_turn(ref, Turn("user", text))
            assert first.id is None and [t.text for _, t in store.pending] == ["Hello.", "Later.", "Still here?"]
        store.add_turn(second, Turn("user", "A new one."))
        assert store.pending == [] and None not in (first.id, second.id) and first.id != second.id
        assert [t.text for t in store.open_conversation(first.id).turns] == ["Hello.", "Still here?"]
        assert store.open_conversation(first.id).title == "Hello."
        assert [t.text for t in store.open_conversation(saved).turns] == ["Later."]
        assert [t.text for t in store.open_conversation(second.id).turns] == ["A new one."]
