"""Conversation history: one SQLite file per profile (stdlib sqlite3, WAL), written one turn per transaction.

The pipeline adds each turn as it ends, so a crash loses nothing already said; the app lists, reopens,
deletes and exports conversations, and erases them all in place (`erase_all()`: the file is never
unlinked under a connection). A turn that cannot be written (database locked, disk full, the file not
opened yet) is kept in memory and written before the next one, by `retry_pending()`, or at `close()`, its
conversation made first if it could not be yet (ConversationRef); a store made with `open_later` also starts
without the file (held elsewhere, read-only) and opens it at the first call that can.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType

from engine.errors import HistoryError
from engine.settings import data_dir

__all__ = ["Conversation", "ConversationRef", "ConversationSummary", "HistoryStore", "Turn", "erase_history",
           "history_path"]

ROLES = ("system", "user", "assistant")
SCHEMA_VERSION = 2  # 2: turns.as_written
_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created_at REAL NOT NULL,   -- unix seconds
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
    text TEXT NOT NULL,          -- what was written (the LLM's whole reply, or the transcript)
    heard_text TEXT,             -- what was actually spoken before a barge-in, else NULL
    interrupted INTEGER NOT NULL DEFAULT 0,
    as_written INTEGER NOT NULL DEFAULT 0,  -- an assistant turn that said the user's typed text, not a reply
    created_at REAL NOT NULL,
    metrics TEXT NOT NULL DEFAULT '{}'   -- JSON: latency figures of this turn (engine/metrics.py)
);
CREATE INDEX IF NOT EXISTS turns_by_conversation ON turns (conversation_id, id);
"""
_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def history_path(profile: str = "default", root: Path | None = None) -> Path:
    """The history file of a profile: <root>/<profile>.sqlite3; root defaults to Parley's data folder.

    Raises:
        HistoryError: the profile name is not 1-64 letters, digits, '_', '.', '-' (it names a file).
    """
    if not _PROFILE_NAME.fullmatch(profile) or ".." in profile:
        raise HistoryError(
            f"profile name {profile!r} cannot name a file; use 1-64 letters, digits, '_', '.' or '-'"
        )
    if root is None:
        root = data_dir() / "history"
    return Path(root) / f"{profile}.sqlite3"


@dataclass(frozen=True)
class Turn:
    """One message of a conversation.

    role: "system", "user" or "assistant".
    text: what was said or written in full.
    heard_text: for an assistant turn cut off by barge-in, the part the user actually heard.
    interrupted: True when the user barged in on this turn.
    as_written: an assistant turn that said the user's typed text as written (Ctrl+Enter, `Dialogue.say`), not
        a reply of the LLM's.
    created_at: unix seconds.
    metrics: latency figures for the turn (names and units as in engine/metrics.py).
    """

    role: str
    text: str
    heard_text: str | None = None
    interrupted: bool = False
    as_written: bool = False
    created_at: float = field(default_factory=time.time)
    metrics: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; valid roles: {', '.join(ROLES)}")
        object.__setattr__(self, "metrics", MappingProxyType(dict(self.metrics)))

    @property
    def spoken_text(self) -> str:
        """What the conversation really contains: the heard part of an interrupted turn, else text."""
        return self.heard_text if self.interrupted and self.heard_text is not None else self.text


@dataclass(frozen=True)
class ConversationSummary:
    """A row of the conversation list."""

    id: int
    title: str
    created_at: float
    updated_at: float
    turn_count: int


@dataclass(frozen=True)
class Conversation:
    """A conversation with all its saved turns, oldest first."""

    id: int
    title: str
    created_at: float
    updated_at: float
    turns: tuple[Turn, ...]

    def messages(self) -> list[dict[str, str]]:
        """The turns as chat messages ({"role", "content"}), as the LLM should see them after barge-in."""
        return [{"role": t.role, "content": t.spoken_text} for t in self.turns]


class ConversationRef:
    """The conversation a run of turns is saved to, as the Dialogues that say them hold it: `id` is the store's, or
    None until the store could make it (its file could not be written yet). Turns added to one are saved together,
    in order, however long the file stays unwritable; a Dialogue carrying the conversation on takes the same ref."""

    def __init__(self, id: int | None = None):
        self.id = id

    def __repr__(self) -> str:
        return f"ConversationRef({self.id})"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def erase_history(path: Path) -> None:
    """Erase every conversation in a history file, in place (HistoryStore.erase_all), where no store of this
    process holds it open; a file that does not exist has nothing to erase (and is not made).

    Raises:
        HistoryError: the file is locked, not writable or not a history (the message says what is left).
    """
    if Path(path).exists():
        with HistoryStore(path) as store:
            store.erase_all()


class HistoryStore:
    """The history of one profile, in one SQLite file; safe to share between threads (the app's worker
    reads it while the voice loop's turn thread writes), each call holding one lock.

        with HistoryStore(history_path("default")) as history:
            cid = history.new_conversation()
            history.add_turn(cid, Turn("user", "What time is it?"))

    Args:
        path: the .sqlite3 file; created with its folder if missing.
        timeout_s: how long a write waits for another program's lock before HistoryError.
        open_later: a file that cannot be opened now (another program holds it, it is read-only) does not
            raise: `open_error` says why, and every call opens it first, raising HistoryError until it
            can; turns added meanwhile are kept and saved once it can.
    Raises:
        HistoryError: the file cannot be opened or is not a Parley history database (unless open_later).
    """

    def __init__(self, path: Path | str, timeout_s: float = 2.0, *, open_later: bool = False):
        self.path = Path(path)
        self.timeout_s = timeout_s
        self._pending: list[tuple[ConversationRef, Turn]] = []  # turns not yet written, oldest first
        self._closed = False
        self._lock = threading.RLock()  # one call at a time: a transaction never interleaves with another
        self._db: sqlite3.Connection | None = None
        self.open_error: HistoryError | None = None  # why the file could not be opened yet (open_later)
        try:
            self._connection()
        except HistoryError:
            if not open_later:
                raise

    def _connection(self) -> sqlite3.Connection:
        """The open connection, opening the file first if it is not yet (raises HistoryError if it cannot)."""
        with self._lock:
            if self._db is None:
                if self._closed:  # never opened, then closed: a late call must not open the file now
                    raise HistoryError(f"{self.path}: this history store is closed")
                try:
                    self._db = self._open()
                    self.open_error = None
                except HistoryError as e:
                    self.open_error = e
                    raise
            return self._db

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we open transactions ourselves, one per turn
            db = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as e:
            raise HistoryError(f"{self.path}: cannot open the history database ({e}); "
                               "check the folder exists and is writable") from e
        try:
            db.execute("PRAGMA foreign_keys = ON")
            # SQLite's own case-insensitive matching (LIKE) knows ASCII letters only; search() needs all of Unicode's
            db.create_function("casefold", 1, lambda s: None if s is None else s.casefold(), deterministic=True)
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise HistoryError(f"{self.path}: SQLite refused WAL mode (got {mode!r}); "
                                   "is the file on a network drive?")
            # FULL: a committed turn survives a power cut too, not only a crash of Parley
            db.execute("PRAGMA synchronous = FULL")
            # what is deleted is overwritten with zeros, not left readable in the file's free pages
            db.execute("PRAGMA secure_delete = ON")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise HistoryError(
                    f"{self.path}: history schema version {version} is newer than this Parley's "
                    f"({SCHEMA_VERSION}); update Parley or use another profile"
                )
            if version == 1:  # a history from before turns said as written were marked: none of them is
                db.executescript("BEGIN; ALTER TABLE turns ADD COLUMN as_written INTEGER NOT NULL DEFAULT 0; COMMIT;")
            db.executescript(f"BEGIN; {_SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")
        except sqlite3.DatabaseError as e:
            db.close()
            raise self._error("open", e) from e
        except HistoryError:
            db.close()
            raise
        return db

    # -- lifetime

    def close(self):
        """Write the pending turns (one more try), then close the file. Safe to call twice.

        Raises:
            HistoryError: the pending turns still cannot be written (locked, disk full); the message
                says how many. The file is closed anyway; `pending` still holds them.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.retry_pending()
            except HistoryError as e:
                n = len(self._pending)
                raise HistoryError(
                    f"{self.path}: {n} turn{'s' if n != 1 else ''} could not be saved before closing "
                    f"({e.__cause__ or e}); another program holds the file or the disk is full"
                ) from e
            finally:
                if self._db is not None:
                    self._db.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc):
        self.close()

    # -- writing

    @property
    def pending(self) -> list[tuple[ConversationRef, Turn]]:
        """Turns that could not be written yet, as (their conversation, turn), oldest first."""
        return list(self._pending)

    def new_conversation(self, title: str = "") -> int:
        """Start a conversation; an empty title becomes the first user turn's text. Returns its id."""
        with self._transaction("start a conversation"):
            return self._insert_conversation(title)

    def _insert_conversation(self, title: str) -> int:
        now = time.time()
        cur = self._db.execute("INSERT INTO conversations (title, created_at, updated_at) VALUES (?, ?, ?)",
                               (title, now, now))
        return cur.lastrowid

    def add_turn(self, conversation: int | ConversationRef, turn: Turn):
        """Write one turn (after any pending ones) in one transaction, to a conversation of the store (its id), or
        to a ConversationRef, whose conversation is made with its first turn that can be written.

        Raises:
            HistoryError: locked, disk full or not opened yet: the turn is kept in `pending` and written on the
                next add_turn or retry_pending(), so nothing is lost while Parley runs. Or no conversation has
                that id (then nothing is kept).
        """
        with self._lock:
            if not isinstance(conversation, ConversationRef):  # an id: its turns waiting already are its ref's
                conversation = next((ref for ref, _ in self._pending if ref.id == conversation),
                                    ConversationRef(conversation))
            if conversation.id is not None and not self._known(conversation.id):
                raise HistoryError(f"no conversation {conversation.id} in {self.path}; start one with "
                                   "new_conversation()")
            self._pending.append((conversation, turn))
            self.retry_pending()

    def _known(self, conversation_id: int) -> bool:
        """Whether the file holds that conversation; True where it cannot be read now (the turn then waits)."""
        try:
            return bool(self._read("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)))
        except HistoryError:
            return True

    def retry_pending(self) -> int:
        """Write the pending turns, making the conversations not made yet; returns how many turns were written.
        Raises HistoryError as add_turn."""
        with self._lock:
            if not self._pending:
                return 0
            made = []  # refs given an id in this transaction: none, if it rolls back
            try:
                with self._transaction(f"save {len(self._pending)} turn(s)"):
                    for ref, turn in self._pending:
                        if ref.id is None:
                            ref.id = self._insert_conversation("")
                            made.append(ref)
                        self._write_turn(ref.id, turn)
            except HistoryError:
                for ref in made:
                    ref.id = None
                raise
            written, self._pending = len(self._pending), []
            return written

    def _write_turn(self, conversation_id: int, turn: Turn):
        row = self._db.execute("SELECT title FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:  # deleted by another window since add_turn checked: nothing to attach it to
            return
        self._db.execute(
            "INSERT INTO turns (conversation_id, role, text, heard_text, interrupted, as_written, created_at, metrics)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, turn.role, turn.text, turn.heard_text, int(turn.interrupted), int(turn.as_written),
             turn.created_at, json.dumps(dict(turn.metrics))),
        )
        title = row[0] or (" ".join(turn.text.split())[:60] if turn.role == "user" else "")
        self._db.execute(
            "UPDATE conversations SET updated_at = ?, title = ? WHERE id = ?", (turn.created_at, title, conversation_id)
        )

    def delete_conversation(self, conversation_id: int):
        """Delete a conversation and its turns (a missing id is not an error)."""
        with self._lock:
            with self._transaction("delete a conversation"):
                self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
            self._pending = [(ref, t) for ref, t in self._pending if ref.id != conversation_id]

    def erase_all(self):
        """Delete every conversation and the turns not saved yet, in place, then rewrite the file (VACUUM)
        and empty its -wal, so no word of them is left in the history's files. The file stays and the
        store goes on working; other connections to it (another Parley) see it empty.

        Raises:
            HistoryError: locked by another program or not writable: nothing was deleted. Or the
                conversations were deleted but the file could not be rewritten (a reader still holds
                the -wal, the disk is full): the message says so; erasing again finishes it.
        """
        with self._lock:
            with self._transaction("delete all history (nothing was deleted)"):
                self._db.execute("DELETE FROM turns")
                self._db.execute("DELETE FROM conversations")
            self._pending = []
            try:
                self._db.execute("VACUUM")
                # TRUNCATE: the -wal, which still holds the old pages, is emptied once no reader needs it
                busy = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            except sqlite3.Error as e:
                raise self._not_rewritten(str(e)) from e
            if busy:
                raise self._not_rewritten("another program is still reading it")

    def _not_rewritten(self, cause: str) -> HistoryError:
        return HistoryError(
            f"{self.path}: every conversation was deleted, but the file could not be rewritten ({cause}), so some "
            "of their words may still be in it; close other Parley windows or free disk space, then delete all "
            "history again"
        )

    # -- reading

    def list_conversations(self) -> list[ConversationSummary]:
        """All conversations, most recently updated first."""
        rows = self._read(
            "SELECT c.id, c.title, c.created_at, c.updated_at, COUNT(t.id) FROM conversations c"
            " LEFT JOIN turns t ON t.conversation_id = c.id GROUP BY c.id ORDER BY c.updated_at DESC, c.id DESC"
        )
        return [ConversationSummary(*row) for row in rows]

    def search(self, query: str) -> set[int]:
        """Ids of the conversations holding every word of `query` in their title or their saved turns' text, in
        any case; every conversation for a query of no words."""
        words = query.casefold().split()
        holds = ("(instr(casefold(c.title), ?) OR EXISTS (SELECT 1 FROM turns t WHERE t.conversation_id = c.id"
                 " AND instr(casefold(t.text), ?)))")
        where = " WHERE " + " AND ".join([holds] * len(words)) if words else ""
        rows = self._read(f"SELECT c.id FROM conversations c{where}", tuple(w for w in words for _ in range(2)))
        return {row[0] for row in rows}

    def open_conversation(self, conversation_id: int) -> Conversation:
        """A conversation with its turns, pending ones included (they are part of it, just unsaved).

        Raises:
            HistoryError: no such conversation.
        """
        head = self._read("SELECT id, title, created_at, updated_at FROM conversations WHERE id = ?",
                          (conversation_id,))
        if not head:
            ids = [s.id for s in self.list_conversations()][:20]
            raise HistoryError(f"no conversation {conversation_id} in {self.path}; it has: {ids or 'none'}")
        rows = self._read(
            "SELECT role, text, heard_text, interrupted, as_written, created_at, metrics FROM turns"
            " WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        )
        turns = [Turn(r, t, h, bool(i), bool(w), c, json.loads(m)) for r, t, h, i, w, c, m in rows]
        turns += [t for ref, t in list(self._pending) if ref.id == conversation_id]
        return Conversation(*head[0], turns=tuple(turns))

    def export_text(self, conversation_id: int) -> str:
        """A conversation as plain text: a title line, when it began (local time), then one "You:" / "Parley:"
        paragraph per turn ("Parley (said as you typed it):" for typed text Parley said); an interrupted reply says
        how much of it was heard."""
        conv = self.open_conversation(conversation_id)
        names = {"system": "System", "user": "You", "assistant": "Parley"}
        began = datetime.fromtimestamp(conv.created_at)
        lines = [conv.title or f"Conversation {conv.id}", f"{began.day} {began:%b %Y, %H:%M}", ""]
        for t in conv.turns:
            line = f"{names[t.role]}{' (said as you typed it)' if t.as_written else ''}: {t.text}"
            if t.interrupted:
                line += (f"\n  [interrupted; heard up to: “{t.heard_text}”]" if t.heard_text else
                         "\n  [interrupted before any of it was heard]")
            lines += [line, ""]
        return "\n".join(lines)

    def export_json(self, conversation_id: int) -> str:
        """A conversation as JSON: {id, title, created_at, updated_at, turns: [...]}; times in ISO 8601 UTC."""
        conv = self.open_conversation(conversation_id)
        doc = {
            "id": conv.id,
            "title": conv.title,
            "created_at": _iso(conv.created_at),
            "updated_at": _iso(conv.updated_at),
            "turns": [
                {"role": t.role, "text": t.text, "heard_text": t.heard_text, "interrupted": t.interrupted,
                 "as_written": t.as_written, "created_at": _iso(t.created_at), "metrics": dict(t.metrics)}
                for t in conv.turns
            ],
        }
        return json.dumps(doc, ensure_ascii=False, indent=2)

    # -- plumbing

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            with self._lock:
                return self._connection().execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            raise self._error("read the history", e) from e

    def _transaction(self, what: str):
        return _Transaction(self, what)

    def _error(self, what: str, e: sqlite3.Error) -> HistoryError:
        msg = str(e).lower()
        if "locked" in msg or "busy" in msg:
            fix = (f"another program holds the history database (waited {self.timeout_s:g} s); "
                   "close other Parley windows; unsaved turns are kept and saved on the next turn")
        elif "full" in msg:
            fix = "the disk is full; free some space; unsaved turns are kept and saved on the next turn"
        elif "not a database" in msg or "malformed" in msg:
            fix = "the file is damaged; move it aside and Parley starts a new history"
        else:
            fix = "check the file and its folder are writable"
        return HistoryError(f"{self.path}: cannot {what}: {e}; {fix}")


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any error; sqlite errors become HistoryError."""

    def __init__(self, store: HistoryStore, what: str):
        self._store, self._what = store, what

    def __enter__(self):
        self._store._lock.acquire()  # released in __exit__
        try:
            # IMMEDIATE takes the write lock up front, so a lock held elsewhere fails here, not mid-write
            self._store._connection().execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            self._store._lock.release()
            raise self._store._error(self._what, e) from e
        except HistoryError:
            self._store._lock.release()
            raise

    def __exit__(self, exc_type, exc, tb):
        try:
            return self._end(exc_type, exc)
        finally:
            self._store._lock.release()

    def _end(self, exc_type, exc):
        db = self._store._db
        if exc_type is None:
            try:
                db.execute("COMMIT")
                return False
            except sqlite3.Error as e:
                exc = e
        if db.in_transaction:
            db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise self._store._error(self._what, exc) from exc
        return False
