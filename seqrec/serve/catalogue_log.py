"""The live catalogue's changes on disk: a restarted service comes back with them, and the processes that
serve one catalogue (`seqrec serve --workers N`, or services started apart on one file) share them.

`seqrec serve RUN --catalogue-log FILE` (or `Recommender.keep_log(FILE)`) replays FILE at start, then
appends one JSON line per change the process makes (its catalogue line first; the lines:
`seqrec.serve.catalogue_file`) and, while it serves (`follow`), applies the lines other processes append.

A writer holds the file's exclusive lock (flock) through the whole change: it first applies what other
processes appended since it last read, checks its change against that catalogue, writes the change's
line and flushes it to the disk (fsync), makes the change, and takes the line back if making it fails
(and then stops writing: the change may have been made in part). Readers read under the shared lock, so
no process reads a line whose change is still being made or is taken back, and apply what they read
after letting it go. Every change answered is in the file, in the order every process applies; a
process stopped between writing a line and answering leaves a change that no client saw answered.
An id unknown to a following process is looked for in the file before it is called unknown, so an item
added through one worker can be used in a history sent to another at once.

A compaction (`seqrec compact-log FILE`, `seqrec.serve.catalogue_compact`) rewrites the file as the fewest
lines that replay to the same catalogue and puts the new file in its place while processes keep it: a
process that finds its file replaced when it takes the lock reads the old one to its end and goes on in
the new one after the lines that fold the old (or, compacted twice meanwhile, takes what differs from the
new one's state: `seqrec.serve.catalogue_apply`); a file in its place that is not a compaction of it
ends the process's keeping it, as does one carried over to another run's catalogue for a deploy (`seqrec
carry-log`, `seqrec.serve.catalogue_carry`): its changes are then refused with a 503 and Retry-After, until
it is replaced by a process serving the new run.

A last line cut short (a process stopped while writing it; its change was never made) is dropped with a
warning by the next writer, and one whole but for its newline is given it; a bad line anywhere else, or a
log written for another catalogue (the first line's fingerprint of the run's item ids), is an error
naming the file and line, at start, and for a following process the end of following (`error`,
"degraded" in /health; its changes are refused with a 503 until it is restarted).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from seqrec.errors import SeqrecError
from seqrec.serve.catalogue_apply import apply_changes
from seqrec.serve.catalogue_compact import carried_to, fold, placement
from seqrec.serve.catalogue_file import (
    CatalogueLogBroken,
    CatalogueLogCarried,
    append_line,
    catalogue_fingerprint,
    check_head,
    line_bytes,
    read_at,
    read_lines,
    same_file,
    truncate,
    write_all,
)

if TYPE_CHECKING:
    from seqrec.serve.live import LiveCatalogue

log = logging.getLogger(__name__)

FOLLOW_INTERVAL_S = 0.02  # how often a following process looks for lines other processes appended


class CatalogueLog:
    """An append-only JSON-lines file of catalogue changes, shared by the processes that serve one
    catalogue (module docstring)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).resolve()  # a link to the log: its replacement is the target's
        self._lock = threading.Lock()  # this process's threads reach the file one at a time
        self._fd: int | None = None
        self._writable = False
        self._offset = 0  # the bytes read: whole lines
        self._seen = 0  # the file's size when it was last read (a cut-short tail is not read again)
        self._lines = 0  # the lines read
        self._changes = 0  # the changes read (whatever process made them)
        self._headed = False  # the catalogue line was read
        self._base: dict[str, Any] = {}  # the catalogue line of the catalogue served
        self.error: str | None = None  # why this process stopped keeping the file, if it did
        self.carried_to: str | None = None  # the run the file was carried over to (seqrec carry-log), if it was
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None
        self._pending: list[tuple[int, dict[str, Any]]] = []  # read from a file since replaced, not yet applied
        self.moves = 0  # the compacted files this process moved to
        self._closed = False  # `close` was called
        self._log_id: str | None = None  # the log's id (its first line), which its compactions keep
        self._refold = False  # reading a compacted file from its start: its changes are applied as one state

    @property
    def changes(self) -> int:
        """The changes made to the log as far as this process has read it (its own included; a compacted
        file's lines count as the changes they fold), the same in every process that is up to date."""
        return self._changes

    def replay(self, rec: LiveCatalogue, write: bool = True) -> tuple[int, int]:
        """Apply every change in the file to `rec`; with `write`, make the file ready for this process's
        changes too. -> (changes replayed, lines dropped: 0 or 1, a cut-short last one). Nothing is applied
        unless the whole file reads."""
        ids = rec.catalogue.raw_ids
        self._base = {"op": "catalogue", "items": len(ids), "fingerprint": catalogue_fingerprint(ids)}
        with rec.catalogue.lock, self._lock:  # one thread opens the file: a follower and a request may both ask
            if self._fd is not None or self._closed:
                return 0, 0
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT if write else os.O_RDONLY, 0o644)
            except FileNotFoundError:
                return 0, 0  # nothing to read (yet); `catch_up` looks again
            except OSError as exc:
                raise SeqrecError(f"{self.path}: cannot {'write' if write else 'read'} the catalogue log "
                                  f"({exc.strerror})") from None
            self._writable = write
            try:
                with self._flock(fcntl.LOCK_SH):
                    records, dropped = self._read(fix=False)
                if write:  # settle a cut-short last line and start a new file with its catalogue line
                    with self._flock(fcntl.LOCK_EX):
                        more, dropped = self._read(fix=True)
                    records += more
                self._apply(rec, records)  # the lines read are final: a writer takes back only its own
            except BaseException:
                self._close_files()
                raise
        return len(records), dropped

    def follow(self, rec: LiveCatalogue, interval_s: float = FOLLOW_INTERVAL_S) -> None:
        """From now on apply, in a background thread, the changes other processes append."""
        def loop() -> None:
            while not self._stop.wait(interval_s) and self.error is None:
                try:
                    self.catch_up(rec)
                except _Stopped:
                    return
                except Exception as exc:  # the thread says why it stopped; it must not die silently
                    self.error = self.error or f"stopped following {self.path}: {exc}"
                    (log.warning if self.carried_to else log.error)("%s", self.error)  # carried: a deploy
                    return

        self._follower = threading.Thread(target=loop, name="seqrec-catalogue-follow", daemon=True)
        self._follower.start()

    def catch_up(self, rec: LiveCatalogue) -> int:
        """Apply the changes other processes appended since this one last read the file -> how many."""
        if self.error is not None:
            return 0
        if self._fd is None:  # not there at start: looked for again (once the log is closed, never)
            return self.replay(rec, write=False)[0] if self.path.exists() and not self._closed else 0
        with rec.catalogue.lock, self._lock:  # first, another thread's catch-up (read, then applied) ends
            if self._fd is None or (os.fstat(self._fd).st_size == self._seen and not self._replaced()):
                return 0  # nothing new: the file not locked
            with self._flock(fcntl.LOCK_SH, stoppable=True):
                records, _ = self._read(fix=False)
            self._apply(rec, records)  # outside the file's lock: writers in other processes go on
            return len(records)

    @contextlib.contextmanager
    def change(self, rec: LiveCatalogue, record: dict[str, Any],
               check: Callable[[], object] | None = None) -> Iterator[None]:
        """(Under `rec`'s catalogue lock.) Around making a change: the changes other processes made are
        applied first and `check` run on the result, then the change's line is put on the disk; it is
        taken back if making the change fails (and this process stops writing: the change may have been
        made in part)."""
        with self._lock:
            if self.error is not None:
                raise (CatalogueLogCarried if self.carried_to else CatalogueLogBroken)(
                    self.error if "restart" in self.error else f"{self.error}; restart the service")
            if self._fd is None or not self._writable:
                raise SeqrecError(f"{self.path}: the catalogue log is not open for writing")
            with self._flock(fcntl.LOCK_EX):
                records, _ = self._read(fix=True)
                self._apply(rec, records)
                if check is not None:
                    check()
                start = self._append(line_bytes(record))
                try:
                    yield
                except BaseException as exc:
                    self._truncate(start)
                    self.error = f"a change failed after its line was written to {self.path} ({exc!r})"
                    log.error("%s; this process no longer changes the catalogue", self.error)
                    raise
                self._offset = self._seen = os.fstat(self._fd).st_size
                self._lines += 1
                self._changes += 1

    def close(self) -> None:
        """Stop following and let the file go."""
        self._stop.set()
        if self._follower is not None and self._follower is not threading.current_thread():
            self._follower.join(5.0)
        with self._lock:
            self._close_files()
            self._closed = True

    def _close_files(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None

    # ---- under self._lock ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _flock(self, how: int, stoppable: bool = False) -> Iterator[None]:
        """Hold the lock of the file the path names: one that replaced this process's file (a compaction) is
        moved to first. `stoppable`: give up (`_Stopped`) once `close` is called."""
        while True:
            self._take(how, stoppable)
            try:
                if not self._replaced():
                    break
                self._move()
            except BaseException:  # the lock taken is let go (after a move, the new file's: none, harmless)
                if self._fd is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                raise
        assert self._fd is not None
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _take(self, how: int, stoppable: bool) -> None:
        assert self._fd is not None
        if not stoppable:
            fcntl.flock(self._fd, how)
            return
        while True:
            try:
                fcntl.flock(self._fd, how | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if self._stop.wait(0.002):
                    raise _Stopped() from None

    def _move(self) -> None:
        """(Under the lock of a file the path no longer names.) Read it to its end (nothing is appended to it
        any more: every writer moves first), let it go, and open the one the path names, placed after the
        lines that fold the file left (`_place`)."""
        assert self._fd is not None
        self._pending += self._read_changes(fix=False)[0]
        old = os.fstat(self._fd)
        origin = (old.st_dev, old.st_ino, self._offset)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND if self._writable else os.O_RDONLY)
        except OSError as exc:
            why = "was removed" if exc.errno == errno.ENOENT else f"cannot be opened again ({exc.strerror})"
            self._fail(f"{self.path} {why} while this process kept it: restart the service")
        os.close(self._fd)  # lets its lock go; never None meanwhile (a follower would take that for no file yet)
        self._fd = fd
        self._place(origin)

    def _place(self, origin: tuple[int, int, int]) -> None:
        """Go on reading a file that replaced the one `origin` (device, inode, bytes read) names, where
        `catalogue_compact.placement` says; a file that is not a compaction of this log stops this process
        keeping it."""
        assert self._fd is not None
        first = read_at(self._fd, 0, 1 << 16)
        first = first[: first.find(b"\n") + 1]
        place = placement(first, origin, self._log_id, self._changes)
        if isinstance(place, str):
            self.carried_to = carried_to(first)
            self._fail(f"{self.path} {place}")
        self.moves += 1
        if place is not None:  # the changes this process read, folded: go on after them
            self._offset = self._seen = len(first) + place[0]
            self._lines = place[1]
            return
        log.info("%s was compacted again since this process read it: its state is taken from the new file",
                 self.path)
        self._offset = self._seen = self._lines = self._changes = 0
        self._headed, self._refold = False, True

    def _read(self, fix: bool) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """(Under the file's lock.) The changes read from a file since replaced, then those after `_offset`
        (`_read_lines`)."""
        pending, self._pending = self._pending, []
        records, dropped = self._read_changes(fix)
        return pending + records, dropped

    def _read_changes(self, fix: bool) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """`_read_lines`; a compacted file read from its start (`_place`) as one "state" change."""
        records, dropped = self._read_lines(fix)
        if self._refold and records:
            texts, removed = fold([record for _, record in records])
            records = [(records[0][0], {"op": "state", "texts": texts, "removed": removed})]
        self._refold = False
        return records, dropped

    def _read_lines(self, fix: bool) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """(Under the file's lock.) The changes in the lines after `_offset`. A last line without its
        newline is another process's that stopped while writing it: with `fix` (the exclusive lock held)
        it is given its newline when it is a whole change, else cut off (and counted); without, it is left
        for a writer to settle. With `fix`, an empty file gets its catalogue line.
        -> ((line number, change) for each change, lines cut off)."""
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size < self._offset:
            self._fail(f"{self.path} is shorter than when it was read: the catalogue log was changed by "
                       "something other than seqrec")
        data = read_at(self._fd, self._offset, size - self._offset)
        whole = data[: data.rfind(b"\n") + 1]
        tail = data[len(whole):]
        lines = whole.split(b"\n")[:-1]
        dropped, whole_tail = 0, False
        if tail.strip() and fix:
            try:
                json.loads(tail)
                lines.append(tail)  # whole JSON without its newline: a writer stopped before writing that byte
                whole_tail = True
            except ValueError as exc:  # UnicodeDecodeError too
                log.warning("%s:%d: dropping a last line that was cut short (%s)", self.path,
                            self._lines + len(lines) + 1, exc)
                self._truncate(self._offset + len(whole))
                tail, dropped = b"", 1
        records = self._parse(lines)  # a bad line stops here, before the file is touched
        if whole_tail:
            write_all(self._fd, b"\n")
            os.fsync(self._fd)
            whole, tail = whole + tail + b"\n", b""
        self._offset += len(whole)
        self._seen = self._offset + len(tail)
        self._lines += len(lines)
        self._changes += len(records)
        if fix and self._offset == 0:
            self._log_id = secrets.token_hex(8)  # kept by every compaction: a replaced file must carry it
            self._append(line_bytes({**self._base, "log": self._log_id}))
            self._offset = self._seen = os.fstat(self._fd).st_size
            self._lines, self._headed = 1, True
        return records, dropped

    def _replaced(self) -> bool:
        """Whether the path names another file than the one this process reads."""
        assert self._fd is not None
        return not same_file(self.path, self._fd)

    def _parse(self, lines: list[bytes]) -> list[tuple[int, dict[str, Any]]]:
        """(line number, change) for each change in whole lines read after `_lines`."""
        records: list[tuple[int, dict[str, Any]]] = []
        try:
            for number, where, record in read_lines(self.path, lines, self._lines + 1):
                if record["op"] == "catalogue":
                    self._check_catalogue(record, where, first=not (self._headed or self._changes or records))
                    self._headed = True
                else:
                    if not (self._headed or self._changes or records):
                        log.warning("%s: its first line does not name the catalogue it was written for (a log "
                                    "written by hand, or by an older seqrec): its changes are made without checking "
                                    "that they belong to this run's items", self.path)
                    records.append((number, record))
        except SeqrecError as exc:
            self._fail(str(exc))
        return records

    def _check_catalogue(self, record: dict[str, Any], where: str, first: bool) -> None:
        check_head(record, where, first)
        self._log_id = record.get("log")
        folded = record.get("compacted")
        if isinstance(folded, dict):  # its change lines stand for `total` changes: they count as those
            self._changes += int(folded.get("total", folded["lines"] - 1)) - (int(folded["lines"]) - 1)
        if record["fingerprint"] != self._base["fingerprint"]:
            self._fail(f"{self.path} was written for another catalogue ({record['items']:,} items, fingerprint "
                       f"{record['fingerprint']}; this run's: {self._base['items']:,} items, "
                       f"{self._base['fingerprint']}): carry it over to this run first (seqrec carry-log), or start "
                       "with a new log")

    def _fail(self, message: str) -> NoReturn:
        """A line this process cannot read: it stops keeping the file (its next reads would start again
        from the same place, and every later line depends on this one)."""
        self.error = message
        raise (CatalogueLogCarried if self.carried_to else CatalogueLogBroken)(message)

    def _apply(self, rec: LiveCatalogue, records: list[tuple[int, dict[str, Any]]]) -> None:
        if not records:
            return
        try:
            apply_changes(self.path, rec, records)
        except Exception as exc:  # applied in part: this process's catalogue no longer follows the file
            self.error = self.error or f"{self.path}: cannot apply its changes ({exc})"
            raise

    def _append(self, line: bytes) -> int:
        assert self._fd is not None
        return append_line(self._fd, line)

    def _truncate(self, size: int) -> None:
        assert self._fd is not None
        truncate(self._fd, size)


class _Stopped(Exception):
    """`close` was called while the follower waited for the file's lock."""
