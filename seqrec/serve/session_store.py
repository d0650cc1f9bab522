"""Where sessions' events live: one SQLite database, in memory for one process, or a file that the
worker processes of `seqrec serve --workers N` share (so an event may reach any worker).

The store holds what a session is (its events: raw item id, time, event feature values) and enforces
its bounds (live sessions, events per session, idle time) for every process at once; each process
keeps only what it can rebuild from the store, its model caches (`seqrec.serve.sessions`).

A session is named by its id and one start (`token`, new whenever the id starts again after an end or
an expiry), so a cache of an ended session is never taken for its successor's. Events are
numbered 0, 1, ... in the order the store took them; an event's answer is computed on the events up
to its own, whichever process took the ones before it.

SQLite on a local file system only (its locks do not hold on a network file system), as for the
catalogue log. Times are wall-clock seconds (`time.time`), the one clock every process shares.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from seqrec.errors import SeqrecError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (sid TEXT PRIMARY KEY, token TEXT NOT NULL, n INTEGER NOT NULL,
                                     touched REAL NOT NULL);
CREATE INDEX IF NOT EXISTS sessions_touched ON sessions (touched);
CREATE TABLE IF NOT EXISTS events (token TEXT NOT NULL, pos INTEGER NOT NULL, item TEXT NOT NULL, time REAL,
                                   feature_values TEXT, PRIMARY KEY (token, pos)) WITHOUT ROWID;
"""


def _open(path: str | None, wait_s: float = 30.0) -> sqlite3.Connection:
    """A connection to the store, its schema in place. Worker processes starting together open one new file at
    once: switching it to WAL takes a lock SQLite does not wait for (its busy timeout does not cover it), so a
    "database is locked" there is tried again, for up to `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        db = None
        try:
            db = sqlite3.connect(path or ":memory:", timeout=wait_s, isolation_level=None, check_same_thread=False)
            if path:
                if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":  # set once, by the first to open it
                    db.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
                db.execute("PRAGMA synchronous=NORMAL")  # sessions are short-lived: no fsync per event
            db.executescript(_SCHEMA)
            return db
        except sqlite3.Error as exc:
            if db is not None:
                db.close()
            busy = isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))
            if not busy or time.monotonic() > deadline:
                raise SeqrecError(f"session store {path}: {exc}") from None
            time.sleep(0.02)


class SessionLimit(SeqrecError):
    """Too many live sessions (the service answers 429, Retry-After when the oldest idle one expires)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SessionFull(SeqrecError):
    """A session has reached its length bound (409: it takes no more events; start a new one)."""


class SessionEnded(SeqrecError):
    """A session ended (through another request or process) while one of its events was answered (409)."""


@dataclass(frozen=True)
class Event:
    item: str  # the raw item id
    time: float  # seconds; NaN where the event gave none
    values: dict[str, float]  # event feature values the event gave


class SessionStore:
    def __init__(self, path: str | None = None, max_sessions: int = 10_000, max_events: int = 1_000,
                 ttl_s: float = 1800.0) -> None:
        """`path`: the database file the processes share (created if absent); None keeps it in memory."""
        self.path, self.max_sessions, self.max_events, self.ttl_s = path, max_sessions, max_events, ttl_s
        self._db = _open(path)
        self._lock = threading.Lock()  # one connection, used from the service's threads in turn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A transaction that holds the database's write lock from its first read (so two processes
        never both take position n of one session)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # a failed COMMIT may have rolled back already
                    self._db.execute("ROLLBACK")
                raise

    def _expire(self, db: sqlite3.Connection, now: float) -> None:
        idle = now - self.ttl_s
        db.execute("DELETE FROM events WHERE token IN (SELECT token FROM sessions WHERE touched <= ?)", (idle,))
        db.execute("DELETE FROM sessions WHERE touched <= ?", (idle,))

    def append(self, sid: str, event: Event) -> tuple[str, int]:
        """Add `event` after the session's last one (starting the session if it is not live) ->
        (the session's token, the event's position)."""
        now = time.time()
        with self._write() as db:
            self._expire(db, now)
            row = db.execute("SELECT token, n FROM sessions WHERE sid = ?", (sid,)).fetchone()
            if row is None:
                live, oldest = db.execute("SELECT count(*), min(touched) FROM sessions").fetchone()
                if live >= self.max_sessions:
                    raise SessionLimit(f"too many live sessions ({self.max_sessions}); "
                                       "end one (DELETE /sessions/{id}) or wait for idle ones to expire",
                                       retry_after_s=oldest + self.ttl_s - now)
                row = (uuid.uuid4().hex, 0)
                db.execute("INSERT INTO sessions VALUES (?, ?, 0, ?)", (sid, row[0], now))
            token, n = row
            if n >= self.max_events:
                raise SessionFull(f"session {sid!r} has reached {self.max_events} events; start a new one")
            db.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                       (token, n, event.item, None if math.isnan(event.time) else event.time,
                        json.dumps(event.values) if event.values else None))
            db.execute("UPDATE sessions SET n = ?, touched = ? WHERE sid = ?", (n + 1, now, sid))
        return token, n

    def retract(self, token: str, pos: int) -> bool:
        """Take back event `pos` of the session started as `token` (its answer failed), if it is still the
        session's last event; False if the session has ended or taken another event since. A session whose
        first event is taken back ends: it holds no event, so it was never started."""
        with self._write() as db:
            if db.execute("UPDATE sessions SET n = ? WHERE token = ? AND n = ?", (pos, token, pos + 1)).rowcount:
                db.execute("DELETE FROM events WHERE token = ? AND pos = ?", (token, pos))
                if pos == 0:
                    db.execute("DELETE FROM sessions WHERE token = ? AND n = 0", (token,))
                return True
        return False

    def touch(self, sid: str) -> tuple[str, int]:
        """A live session's (token, number of events), its idle time reset; KeyError if none."""
        now = time.time()
        with self._write() as db:
            self._expire(db, now)
            row = db.execute("SELECT token, n FROM sessions WHERE sid = ?", (sid,)).fetchone()
            if row is None:
                raise KeyError(sid)
            db.execute("UPDATE sessions SET touched = ? WHERE sid = ?", (now, sid))
        return row[0], row[1]

    def events(self, token: str, start: int, stop: int) -> list[Event]:
        """Events start..stop-1 of the session started as `token` (fewer if it has ended since)."""
        with self._lock:
            rows = self._db.execute("SELECT item, time, feature_values FROM events WHERE token = ? AND pos >= ? "
                                    "AND pos < ? ORDER BY pos", (token, start, stop)).fetchall()
        return [Event(item, math.nan if t is None else t, json.loads(v) if v else {}) for item, t, v in rows]

    def end(self, sid: str) -> bool:
        """End a session now; False if it was not live."""
        with self._write() as db:
            self._expire(db, time.time())
            row = db.execute("SELECT token FROM sessions WHERE sid = ?", (sid,)).fetchone()
            if row is not None:
                db.execute("DELETE FROM events WHERE token = ?", row)
                db.execute("DELETE FROM sessions WHERE sid = ?", (sid,))
        return row is not None

    def __len__(self) -> int:
        """Live sessions (a read: idle ones are not counted, and are dropped by the next write)."""
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM sessions WHERE touched > ?",
                                        (time.time() - self.ttl_s,)).fetchone()[0])


def event(item: str, time_s: float | None, values: Mapping[str, float] | None) -> Event:
    return Event(item, math.nan if time_s is None else float(time_s),
                 {name: float(v) for name, v in (values or {}).items()})
