"""`seqrec compact-log FILE`: a catalogue log (`seqrec.serve.catalogue_log`) rewritten as the fewest lines
that replay to the same catalogue, while no process keeps it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seqrec.errors import SeqrecError
from seqrec.serve.catalogue_file import (
    check_head,
    hold_users,
    let_users_go,
    line_bytes,
    pack_vectors,
    read_at,
    read_lines,
)

COMPACT_LINE_ITEMS = 10_000  # items per "items" line of a compacted log (a replay joins them into one batch)


def compact(path: Path | str) -> dict[str, int]:
    """Rewrite a catalogue log as the fewest lines that replay to the same catalogue: each item's last text
    (and its vector), in the order the items were first added, so that they get the same indices, then
    one removal of the items whose last change removed them. It assumes a log that replays (it cannot
    check ids against a run). Only while no process keeps the file (`SeqrecError` otherwise); a cut-short
    last line is dropped. The new file keeps the old one's mode and, where allowed, its owner.
    -> counts before and after."""
    path = Path(path).resolve()
    if not path.is_file():
        raise SeqrecError(f"{path}: no such catalogue log")
    users, created = hold_users(path, wait=False)
    temporary = path.with_name(path.name + ".compacting")
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a writer of an older seqrec, which takes no `.users` lock, waits
            data = read_at(fd, 0, os.fstat(fd).st_size)
            head, texts, removed, dropped = _fold(path, data)
            out = _compacted(head, texts, removed)
            with temporary.open("wb") as f:
                f.write(out)
                f.flush()
                old = os.fstat(fd)
                os.fchmod(f.fileno(), old.st_mode & 0o7777)
                with contextlib.suppress(PermissionError):
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
                os.fsync(f.fileno())
            os.replace(temporary, path)  # a writer that waited finds its file replaced and stops
            folder = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:
        temporary.unlink(missing_ok=True)
        raise SeqrecError(f"{path}: cannot compact the catalogue log ({getattr(exc, 'strerror', None) or exc})"
                          ) from None
    finally:
        let_users_go(path, users, created)
    return {"lines_before": data.count(b"\n") + (not data.endswith(b"\n") and bool(data)),
            "lines_after": out.count(b"\n"), "bytes_before": len(data), "bytes_after": len(out),
            "items": len(texts), "removed": sum(removed.values()), "dropped": dropped}


def _compacted(head: dict[str, Any] | None, texts: dict[str, tuple[str, str | None, np.ndarray | None]],
               removed: dict[str, bool]) -> bytes:
    """The lines of a folded log: its catalogue line, the items in runs of one encoder (or none), one removal."""
    lines = [] if head is None else [line_bytes(head)]
    runs: list[tuple[str | None, list[tuple[str, str, np.ndarray | None]]]] = []
    for raw, (text, encoder, vector) in texts.items():
        kind = None if vector is None else encoder  # items with vectors of one encoder, or without any
        if not runs or runs[-1][0] != kind or len(runs[-1][1]) == COMPACT_LINE_ITEMS:
            runs.append((kind, []))
        runs[-1][1].append((raw, text, vector))
    for kind, run in runs:
        record: dict[str, Any] = {"op": "items", "items": {raw: text for raw, text, _ in run}}
        if kind is not None:
            record["encoder"] = kind
            record["vectors"] = pack_vectors(torch.from_numpy(np.stack([v for _, _, v in run])))  # type: ignore[misc]
        lines.append(line_bytes(record))
    gone = [raw for raw, is_removed in removed.items() if is_removed]
    if gone:
        lines.append(line_bytes({"op": "remove", "ids": gone}))
    return b"".join(lines)


def _fold(path: Path, data: bytes) -> tuple[dict[str, Any] | None, dict[str, tuple[str, str | None, np.ndarray | None]],
                                            dict[str, bool], int]:
    """A log's changes folded: (its catalogue line, raw id -> (last text, encoder, vector) in the order of first
    addition, raw id -> whether its last change removed it, 1 if a cut-short last line was left out)."""
    lines = data.split(b"\n")
    dropped = 0
    try:
        json.loads(lines[-1].strip() or b"null")
    except ValueError:  # no newline after it, and not whole: cut short while being written
        lines, dropped = lines[:-1], 1
    head: dict[str, Any] | None = None
    texts: dict[str, tuple[str, str | None, np.ndarray | None]] = {}
    removed: dict[str, bool] = {}
    for _, where, record in read_lines(path, lines, 1):
        if record["op"] == "catalogue":
            check_head(record, where, first=head is None and not removed)
            head = record
        elif record["op"] == "remove":
            removed.update(dict.fromkeys(record["ids"], True))
        else:
            vectors = record.get("vectors") if "encoder" in record else None  # none of a named encoder: unused
            for row, (raw_id, text) in enumerate(record["items"].items()):
                texts[raw_id] = (text, record.get("encoder"), None if vectors is None else vectors[row])
                removed[raw_id] = False
    return head, texts, removed, dropped
