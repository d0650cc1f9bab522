"""The live catalogue's changes on disk, so that a restarted service comes back with them.

`seqrec serve RUN --catalogue-log FILE` (or `Recommender.keep_log(FILE)`) replays FILE at start and
then appends one JSON line per change the service makes:

    {"op": "catalogue", "items": N, "fingerprint": "..."}  first line: the catalogue it was written for
    {"op": "items", "items": {"raw id": "text", ...}}     POST /items: added, or text replaced
    {"op": "remove", "ids": ["raw id", ...]}               DELETE /items/{id}, POST /items/remove

A change's line is written and flushed to the disk (fsync) under the catalogue's lock before the
change is applied, and taken back if applying it fails, so the file holds exactly the changes
made, in order, and each before its request is answered. Replaying gives the same catalogue: the
same raw ids under the same item indices, texts and removed items (an item's vector is its text
through the frozen encoder and adaptor again, so equal up to floating-point rounding). A run of
"items" lines is replayed as one batch for the text encoder, a run of "remove" lines as one removal.

A last line cut short (the process stopped while writing it; its change was never applied) is
dropped with a warning; a bad line anywhere else, a log written for another catalogue (the first
line's fingerprint of the run's item ids) or a second process writing the same file is an error.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from seqrec.errors import SeqrecError

if TYPE_CHECKING:
    from seqrec.serve.live import LiveCatalogue

log = logging.getLogger(__name__)


def catalogue_fingerprint(raw_ids: Sequence[str]) -> str:
    """The catalogue a log belongs to: its raw ids in index order."""
    return hashlib.sha256("\n".join(raw_ids).encode("utf-8", "surrogatepass")).hexdigest()[:20]


class CatalogueLog:
    """An append-only JSON-lines file of catalogue changes (module docstring)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None  # open for appending, and locked against other processes

    def replay(self, rec: LiveCatalogue, write: bool = True) -> tuple[int, int]:
        """Apply every change in the file to `rec`; with `write`, then hold the file for appending.
        -> (changes replayed, lines dropped: 0 or 1, a cut-short last one). Without `write` the file is
        only read (several worker processes replay it)."""
        ids = rec.catalogue.raw_ids
        base = {"op": "catalogue", "items": len(ids), "fingerprint": catalogue_fingerprint(ids)}
        data = self.path.read_bytes() if self.path.exists() else b""
        head, records, good_bytes, dropped = self._parse(data)
        if head is not None and head["fingerprint"] != base["fingerprint"]:
            raise SeqrecError(f"{self.path} was written for another catalogue ({head['items']:,} items, fingerprint "
                              f"{head['fingerprint']}; this run's: {base['items']:,} items, {base['fingerprint']}): "
                              "start this run with a new log")
        self._apply(rec, records)
        if write:
            self._open(data, good_bytes if dropped else None, base if not data.strip() else None)
        return len(records), dropped

    def _apply(self, rec: LiveCatalogue, records: list[tuple[int, dict[str, Any]]]) -> None:
        adding: dict[str, str] = {}  # a run of "items" lines, one batch for the encoder
        removing: list[str] = []  # a run of "remove" lines, one removal
        lines: list[int] = []  # the lines of the run
        for number, record in records:
            if record["op"] == "items":
                self._flush(rec, {}, removing, lines)
                adding.update(record["items"])  # a later text of the same id wins, as it did when served
            else:
                self._flush(rec, adding, [], lines)  # every item added before this line is known from here on
                unknown = [i for i in record["ids"] if i not in rec.catalogue.index]
                if unknown:
                    raise SeqrecError(f"{self.path}:{number}: unknown item id(s) {', '.join(map(repr, unknown[:5]))}")
                removing += record["ids"]
            lines.append(number)
        self._flush(rec, adding, removing, lines)

    def _flush(self, rec: LiveCatalogue, adding: dict[str, str], removing: list[str], lines: list[int]) -> None:
        """Apply a pending run of additions or of removals (one of the two is empty) and empty it."""
        if not (adding or removing):
            return
        try:
            if adding:
                rec.add_items(adding)
            if removing:
                rec.remove_items(removing)
        except SeqrecError as exc:
            where = f"{lines[0]}" if lines[0] == lines[-1] else f"{lines[0]}-{lines[-1]}"
            raise SeqrecError(f"{self.path}:{where}: {exc}") from None
        adding.clear()
        removing.clear()
        lines.clear()

    def _parse(self, data: bytes) -> tuple[dict[str, Any] | None, list[tuple[int, dict[str, Any]]], int, int]:
        """(the first line's catalogue record or None, (line number, change) for each change, the bytes up to
        the last good line, 1 if a cut-short last line was dropped)."""
        lines = data.split(b"\n")
        head: dict[str, Any] | None = None
        records: list[tuple[int, dict[str, Any]]] = []
        good_bytes = offset = 0
        for number, raw in enumerate(lines, 1):
            offset += len(raw) + 1
            if not raw.strip():
                continue
            where = f"{self.path}:{number}"
            try:
                record = json.loads(raw)
            except ValueError as exc:  # UnicodeDecodeError too
                if number == len(lines):  # no newline after it: cut short while being written
                    log.warning("%s: dropping a last line that was cut short (%s)", where, exc)
                    return head, records, good_bytes, 1
                raise SeqrecError(f"{where}: not JSON ({exc})") from None
            why = _invalid(record, first=head is None and not records)
            if why:
                raise SeqrecError(f"{where}: not a catalogue change: {why}")
            if record["op"] == "catalogue":
                head = record
            else:
                records.append((number, record))
            good_bytes = min(offset, len(data))
        return head, records, good_bytes, 0

    def _open(self, data: bytes, cut_at: int | None, head: dict[str, Any] | None) -> None:
        """Hold the file for appending: no other process may write it; a cut-short last line is cut off, a
        last line without its newline given one, and a new file starts with its catalogue line."""
        try:
            f = self.path.open("a+b")
        except OSError as exc:
            raise SeqrecError(f"{self.path}: cannot write the catalogue log ({exc.strerror})") from None
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise SeqrecError(f"{self.path}: another process is writing this catalogue log") from None
        if cut_at is not None:
            f.truncate(cut_at)
        elif data and not data.endswith(b"\n"):
            f.write(b"\n")
        if head is not None:
            f.write(_line(head))
        f.flush()
        os.fsync(f.fileno())
        self._file = f

    @contextlib.contextmanager
    def change(self, record: dict[str, Any]) -> Iterator[None]:
        """Around making a change: its line is on the disk before, and taken back if making it fails."""
        start = self._append(record)
        try:
            yield
        except BaseException:
            self._take_back(start)
            raise

    def _append(self, record: dict[str, Any]) -> int:
        """Write one change's line (on the disk when this returns) -> where it starts."""
        if self._file is None:
            raise SeqrecError(f"{self.path}: the catalogue log is not open for writing")
        line = _line(record)
        with self._lock:
            start = os.fstat(self._file.fileno()).st_size
            try:
                self._file.write(line)
                self._file.flush()
                os.fsync(self._file.fileno())
            except BaseException:
                self._file.truncate(start)  # no half line for the next one to run into
                raise
            return start

    def close(self) -> None:
        """Let the file go (another process may write it from now on)."""
        with self._lock:
            if self._file is not None:
                self._file.close()  # the lock goes with it
                self._file = None

    def _take_back(self, start: int) -> None:
        """Remove the line written at `start` (its change could not be made)."""
        if self._file is not None:
            with self._lock:
                self._file.truncate(start)
                os.fsync(self._file.fileno())


def _line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record) + "\n").encode()  # ASCII: any string, a lone surrogate too, round-trips


def _invalid(record: Any, first: bool) -> str | None:
    """What is wrong with a line's record, or None."""
    if not isinstance(record, dict) or record.get("op") not in ("catalogue", "items", "remove"):
        return 'expected {"op": "items", ...} or {"op": "remove", ...}'
    if record["op"] == "catalogue":
        ok = isinstance(record.get("fingerprint"), str) and isinstance(record.get("items"), int)
        return None if ok and first else ("a catalogue line must come first" if ok else "a bad catalogue line")
    if record["op"] == "items":
        items = record.get("items")
        if not isinstance(items, dict) or not all(isinstance(k, str) and k and isinstance(v, str) and v.strip()
                                                  for k, v in items.items()):
            return '"items" must map raw ids to texts that are not empty'
        return None
    ids = record.get("ids")
    return None if isinstance(ids, list) and all(isinstance(i, str) and i for i in ids) else '"ids" must list raw ids'
