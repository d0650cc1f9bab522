"""The live catalogue's changes on disk, so that a restarted service comes back with them.

`seqrec serve RUN --catalogue-log FILE` (or `Recommender.keep_log(FILE)`) replays FILE at start and
then appends one JSON line per change the service applies:

    {"op": "items", "items": {"raw id": "text", ...}}     POST /items: added, or text replaced
    {"op": "remove", "ids": ["raw id", ...]}               DELETE /items/{id}

A line is written and flushed to the disk (fsync) before the request that made the change is
answered, under the catalogue's lock, so the file holds the changes in the order they were applied.
Replaying gives the same catalogue: the same raw ids under the same item indices, texts and removed
items (an item's vector is its text through the frozen encoder and adaptor again, so equal up to
floating-point rounding). A run of "items" lines is replayed as one batch for the text encoder, and
a run of "remove" lines as one removal. A last line cut short (the process stopped while writing it; its
request was never answered) is dropped with a warning; a bad line anywhere else is an error that
names the file and line.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqrec.errors import SeqrecError

if TYPE_CHECKING:
    from seqrec.serve.recommender import Recommender

log = logging.getLogger(__name__)


class CatalogueLog:
    """An append-only JSON-lines file of catalogue changes (module docstring)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def replay(self, rec: Recommender) -> tuple[int, int]:
        """Apply every change in the file to `rec` -> (lines, lines dropped: 0 or 1, a cut-short last one)."""
        if not self.path.exists():
            return 0, 0
        records, good_bytes, dropped = self._read()
        adding: dict[str, str] = {}  # a run of "items" lines, one batch for the encoder
        removing: list[str] = []  # a run of "remove" lines, one pass over the catalogue
        for where, record in records:
            if record["op"] == "items":
                self._flush(rec, {}, removing)
                adding.update(record["items"])  # a later text of the same id wins, as it did when served
                continue
            self._flush(rec, adding, [])  # every item added before this line is known from here on
            unknown = [i for i in record["ids"] if i not in rec.catalogue.index]
            if unknown:
                raise SeqrecError(f"{where}: unknown item id(s) {', '.join(map(repr, unknown[:5]))}")
            removing += record["ids"]
        self._flush(rec, adding, removing)
        with self.path.open("r+b") as f:  # the next line must start on a line of its own
            if dropped:
                f.truncate(good_bytes)
            elif good_bytes and not self.path.read_bytes().endswith(b"\n"):
                f.seek(0, os.SEEK_END)
                f.write(b"\n")
        return len(records), dropped

    def _flush(self, rec: Recommender, adding: dict[str, str], removing: list[str]) -> None:
        """Apply a pending run of additions or of removals (one of the two is empty) and empty it."""
        if adding:
            try:
                rec.add_items(adding)
            except SeqrecError as exc:
                raise SeqrecError(f"{self.path}: replaying {len(adding)} item(s): {exc}") from None
            adding.clear()
        if removing:
            rec.remove_items(removing)
            removing.clear()

    def _read(self) -> tuple[list[tuple[str, dict[str, Any]]], int, int]:
        """(where, record) for each line, the bytes up to the last good line, and 1 if a cut-short last
        line was dropped."""
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        records: list[tuple[str, dict[str, Any]]] = []
        good_bytes = offset = 0
        for number, raw in enumerate(lines, 1):
            offset += len(raw) + 1
            if not raw.strip():
                continue
            where = f"{self.path}:{number}"
            last = all(not rest.strip() for rest in lines[number:])
            try:
                record = _checked(json.loads(raw))
            except (ValueError, UnicodeDecodeError) as exc:
                if last and not data.endswith(b"\n"):  # cut short while being written: never acknowledged
                    log.warning("%s: dropping a last line that was cut short (%s)", where, exc)
                    return records, good_bytes, 1
                raise SeqrecError(f"{where}: not a catalogue change ({exc})") from None
            records.append((where, record))
            good_bytes = min(offset, len(data))
        return records, good_bytes, 0

    def append_items(self, items: Mapping[str, str]) -> None:
        self._append({"op": "items", "items": dict(items)})

    def append_removed(self, ids: Sequence[str]) -> None:
        self._append({"op": "remove", "ids": list(ids)})

    def _append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        with self._lock, self.path.open("ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def _checked(record: Any) -> dict[str, Any]:
    """A record of the two kinds, or ValueError saying what is wrong with it."""
    if not isinstance(record, dict) or record.get("op") not in ("items", "remove"):
        raise ValueError('expected {"op": "items", ...} or {"op": "remove", ...}')
    if record["op"] == "items":
        items = record.get("items")
        if not isinstance(items, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in items.items()):
            raise ValueError('"items" must map raw ids to texts')
    elif not isinstance(record.get("ids"), list) or not all(isinstance(i, str) for i in record["ids"]):
        raise ValueError('"ids" must be a list of raw ids')
    return record

