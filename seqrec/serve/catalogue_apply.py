"""Applying the changes read from a catalogue log (`seqrec.serve.catalogue_log`) to a live catalogue: runs of
lines in batches, and a compacted file read from its start as only what differs from the catalogue."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from seqrec.errors import SeqrecError

if TYPE_CHECKING:
    from seqrec.serve.live import LiveCatalogue


def apply_changes(path: Path, rec: LiveCatalogue, records: list[tuple[int, dict[str, Any]]]) -> None:
    """Apply (line number, change) records read from the log at `path`: a run of "items" lines as one batch, a run
    of "remove" lines as one removal, a "state" (a compacted file read from its start) as what differs."""
    adding: dict[str, tuple[str, str | None, np.ndarray | None]] = {}  # a run of "items" lines, one batch
    removing: list[str] = []  # a run of "remove" lines, one removal
    lines: list[int] = []  # the lines of the run
    keys = _keys(rec) if any(r["op"] == "items" for _, r in records) else ()
    for number, record in records:
        if record["op"] == "state":
            _flush(path, rec, adding, removing, lines)
            _apply_state(rec, record)
            continue
        if record["op"] == "items":
            _flush(path, rec, {}, removing, lines)
            vectors = record.get("vectors") if record.get("encoder") in keys else None
            titles = record.get("titles", {})
            for row, (raw, text) in enumerate(record["items"].items()):  # a later text of an id wins
                adding[raw] = (text, titles.get(raw), None if vectors is None else vectors[row])
        else:
            _flush(path, rec, adding, [], lines)  # every item added before this line is known from here on
            unknown = [i for i in record["ids"] if i not in rec.catalogue.index]
            if unknown:
                raise SeqrecError(f"{path}:{number}: unknown item id(s) {', '.join(map(repr, unknown[:5]))}")
            removing += record["ids"]
        lines.append(number)
    _flush(path, rec, adding, removing, lines)

def _keys(rec: LiveCatalogue) -> tuple[str | None, ...]:
    """The encoder keys whose vectors a line's texts take: the run's encoder now, and the key of lines written
    before its files' bytes counted (`LiveCatalogue.encoder_key`)."""
    return rec.encoder_key(), rec.encoder_key(legacy=True)

def _apply_state(rec: LiveCatalogue, state: dict[str, Any]) -> None:
    """A folded file's state over the catalogue (`CatalogueLog._place`): only what differs, so that what this process
    already has stays as it is on the way: items new here (in the file's order: their indices), given
    another text or live again, then removals. (An item removed here whose text changed meanwhile is
    live between the two: a catalogue keeps a text only with its item recommendable.)"""
    keys = _keys(rec) if state["texts"] else ()
    cat = rec.catalogue

    def differs(raw: str, text: str, title: str | None) -> bool:
        if raw not in cat.index:
            return True
        idx = cat.index[raw]
        return (cat.texts.get(idx) != text or cat.title(idx) != (title or text)
                or (idx in cat.removed and not state["removed"][raw]))

    adding = {raw: (text, title, vector if encoder in keys else None)
              for raw, (text, title, encoder, vector) in state["texts"].items() if differs(raw, text, title)}
    if adding:
        rec.apply_items(adding)
    removing = [raw for raw, is_removed in state["removed"].items()
                if is_removed and rec.catalogue.index[raw] not in rec.catalogue.removed]
    if removing:
        rec.apply_removal(removing)

def _flush(path: Path, rec: LiveCatalogue, adding: dict[str, tuple[str, str | None, np.ndarray | None]],
           removing: list[str], lines: list[int]) -> None:
    """Apply a pending run of additions or of removals (one of the two is empty) and empty it."""
    if not (adding or removing):
        return
    try:
        if adding:
            rec.apply_items(adding)
        if removing:
            rec.apply_removal(removing)
    except SeqrecError as exc:
        where = f"{lines[0]}" if lines[0] == lines[-1] else f"{lines[0]}-{lines[-1]}"
        raise SeqrecError(f"{path}:{where}: {exc}") from None
    adding.clear()
    removing.clear()
    lines.clear()
