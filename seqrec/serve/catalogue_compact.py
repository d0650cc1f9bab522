"""`seqrec compact-log FILE`: a catalogue log (`seqrec.serve.catalogue_log`) rewritten as the fewest lines
that replay to the same catalogue, while services keep it or not.

The compaction holds the file's exclusive lock from reading it to putting the new file in its place, so
no change is made meanwhile; the new file's catalogue line says which file and how many of its bytes the
new lines fold (`"compacted": {"from": [device, inode, bytes], "body": bytes, "lines": n}`). A process
that keeps the log finds its file replaced the next time it takes the lock: it reads the old file to its
end, and when that is what was folded it goes on after the folded lines in the new one; otherwise (the
file was compacted twice meanwhile) it applies the new file from its start, which gives the same
catalogue again (each item its last text at its own index)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from seqrec.errors import SeqrecError
from seqrec.serve.catalogue_file import check_head, line_bytes, pack_vectors, read_at, read_lines, same_file

# raw id -> (last text, its title when one other than the text was given, the text's encoder, its vector)
Texts = dict[str, tuple[str, str | None, str | None, np.ndarray | None]]
COMPACT_LINE_ITEMS = 10_000  # items per "items" line of a compacted log (a replay joins them into one batch)


def compact(path: Path | str) -> dict[str, int]:
    """Rewrite a catalogue log as the fewest lines that replay to the same catalogue: each item's last text
    (and its vector), in the order the items were first added, so that they get the same indices, then
    one removal of the items whose last change removed them. It assumes a log that replays (it cannot
    check ids against a run). Processes that keep the file wait for it, then follow the new file; a
    cut-short last line is dropped. The new file keeps the old one's mode and owner (a compaction that
    cannot keep the owner is refused: the services could no longer write it). -> counts before and after."""
    path = Path(path).resolve()
    with folded_log(path, "compact") as (fd, data, head, texts, removed, dropped):
        if head is None:
            if data.strip():
                raise SeqrecError(f"{path}: no catalogue line at its start (a log written before logs named "
                                  "their catalogue): it cannot be compacted")
            return _counts(data, data, texts, removed, dropped)  # nothing written yet
        folded = data[: data.rfind(b"\n") + 1]  # whole lines: a cut-short last one is left out
        if _already_compact(data):  # a new file would say the same: the processes need not move
            return _counts(data, data, texts, removed, dropped)
        old = os.fstat(fd)
        body = compacted(texts, removed)
        head = {k: v for k, v in head.items() if k != "compacted"} | {"compacted": {
            "from": [old.st_dev, old.st_ino, len(folded)], "body": len(body), "lines": body.count(b"\n") + 1,
            "total": _total(path, folded)}}
        out = line_bytes(head) + body
        replace_file(path, out, old)
    return _counts(data, out, texts, removed, dropped)


class Folded(NamedTuple):
    fd: int  # the log, open under its exclusive lock
    data: bytes  # its bytes (`settled`)
    head: dict[str, Any] | None  # its catalogue line
    texts: Texts  # `fold`'s
    removed: dict[str, bool]  # `fold`'s
    dropped: int  # 1 if a cut-short last line was left out


@contextlib.contextmanager
def folded_log(path: Path, doing: str) -> Iterator[Folded]:
    """The log at `path` under its exclusive lock, its bytes settled and folded; an OS error as a SeqrecError
    saying what could not be done (`doing` it)."""
    if not path.is_file():
        raise SeqrecError(f"{path}: no such catalogue log" if not path.exists()
                          else f"{path}: not a catalogue log (not a regular file)")
    try:
        fd = locked(path)
        try:
            data = settled(fd)
            yield Folded(fd, data, *fold_file(path, data))
        finally:
            os.close(fd)  # lets the lock go
    except (OSError, ValueError) as exc:
        raise SeqrecError(f"{path}: cannot {doing} the catalogue log ({getattr(exc, 'strerror', None) or exc})"
                          ) from None


def replace_file(path: Path, data: bytes, like: os.stat_result) -> None:
    """(Under the old file's exclusive lock.) Put a new file holding `data` in `path`'s place, with the mode
    and owner of `like` (the old file's): the processes that keep the old file wait for the lock, then find
    it replaced. A new file that cannot keep the owner is refused: the services could no longer write it."""
    temporary = path.with_name(path.name + ".replacing")
    try:
        with temporary.open("wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), like.st_mode & 0o7777)
            try:
                os.fchown(f.fileno(), like.st_uid, like.st_gid)
            except PermissionError:
                if (like.st_uid, like.st_gid) != (os.geteuid(), os.getegid()):
                    raise SeqrecError(f"{path} belongs to uid {like.st_uid}, gid {like.st_gid}: rewrite it as that "
                                      "user (a file of another owner could no longer be written by the "
                                      "services)") from None
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def locked(path: Path) -> int:
    """The log open for writing under its exclusive lock: the file the path names once the lock is held
    (another compaction may have replaced the one opened first)."""
    while True:
        fd = os.open(path, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        if same_file(path, fd):
            return fd
        os.close(fd)


def settled(fd: int) -> bytes:
    """(Under the exclusive lock.) The file's bytes, a last line that is whole but for its newline given it,
    as a writer would, so that the processes reading the file end where the compaction does."""
    data = read_at(fd, 0, os.fstat(fd).st_size)
    tail = data[data.rfind(b"\n") + 1:]
    if tail.strip():
        try:
            json.loads(tail)
        except ValueError:  # cut short: left out of the compaction, and of every reader's lines
            return data
        os.pwrite(fd, b"\n", len(data))
        os.fsync(fd)
        data += b"\n"
    return data


def _total(path: Path, folded: bytes) -> int:
    """The changes ever made to the log whose whole lines are `folded`: those a compacted first line stands
    for, and every change line after its compacted ones."""
    first = folded[: folded.find(b"\n") + 1]
    head = json.loads(first) if first.strip() else {}
    done = head.get("compacted") if isinstance(head, dict) else None
    if not isinstance(done, dict):
        return sum(1 for line in folded.split(b"\n") if line.strip()) - 1  # every line but the catalogue one
    after = folded[len(first) + int(done["body"]):]
    return int(done.get("total", done["lines"] - 1)) + sum(1 for line in after.split(b"\n") if line.strip())


def _already_compact(data: bytes) -> bool:
    """A compacted file with nothing appended after its compacted lines."""
    first = data[: data.find(b"\n") + 1]
    try:
        done = json.loads(first)["compacted"]
        return len(data) == len(first) + int(done["body"])
    except (ValueError, KeyError, TypeError):
        return False


def _counts(data: bytes, out: bytes, texts: dict[str, Any], removed: dict[str, bool], dropped: int) -> dict[str, int]:
    return {"lines_before": data.count(b"\n") + (not data.endswith(b"\n") and bool(data)),
            "lines_after": out.count(b"\n"), "bytes_before": len(data), "bytes_after": len(out),
            "items": len(texts), "removed": sum(removed.values()), "dropped": dropped}


def compacted(texts: Texts, removed: dict[str, bool]) -> bytes:
    """The changes of a folded log: the items in runs of one encoder (or none), one removal."""
    lines = []
    runs: list[tuple[str | None, list[tuple[str, str, str | None, np.ndarray | None]]]] = []
    for raw, (text, title, encoder, vector) in texts.items():
        kind = None if vector is None else encoder  # items with vectors of one encoder, or without any
        if not runs or runs[-1][0] != kind or len(runs[-1][1]) == COMPACT_LINE_ITEMS:
            runs.append((kind, []))
        runs[-1][1].append((raw, text, title, vector))
    for kind, run in runs:
        record: dict[str, Any] = {"op": "items", "items": {raw: text for raw, text, _, _ in run}}
        titles = {raw: title for raw, _, title, _ in run if title is not None}
        if titles:
            record["titles"] = titles
        if kind is not None:
            record["encoder"] = kind
            record["vectors"] = pack_vectors(torch.from_numpy(np.stack([v for _, _, _, v in run])))  # type: ignore[misc]
        lines.append(line_bytes(record))
    gone = [raw for raw, is_removed in removed.items() if is_removed]
    if gone:
        lines.append(line_bytes({"op": "remove", "ids": gone}))
    return b"".join(lines)


def fold_file(path: Path, data: bytes) -> tuple[dict[str, Any] | None, Texts, dict[str, bool], int]:
    """A log's changes folded: (its catalogue line, `fold`'s texts and removals, 1 if a cut-short last line
    was left out)."""
    lines = data.split(b"\n")
    dropped = 0
    try:
        json.loads(lines[-1].strip() or b"null")
    except ValueError:  # no newline after it, and not whole: cut short while being written
        lines, dropped = lines[:-1], 1
    head: dict[str, Any] | None = None
    changes: list[dict[str, Any]] = []
    for _, where, record in read_lines(path, lines, 1):
        if record["op"] == "catalogue":
            check_head(record, where, first=head is None and not changes)
            head = record
        else:
            changes.append(record)
    texts, removed = fold(changes)
    return head, texts, removed, dropped


def carried_to(first: bytes) -> str | None:
    """The run a log's first line says the log was carried over to (`seqrec carry-log`), if it says so."""
    try:
        return str(json.loads(first)["carried"]["run"])
    except (ValueError, KeyError, TypeError):
        return None


def placement(first: bytes, origin: tuple[int, int, int], log_id: str | None, changes: int
              ) -> tuple[int, int] | str | None:
    """Where a process goes on in the file whose first line is `first`, found in the place of the file `origin`
    (device, inode, bytes read) after reading `changes` changes of the log `log_id` there: (bytes, lines) of
    the new file when its compacted lines fold exactly what the process read, None to apply the new file
    from its start as one state (compacted again meanwhile: `catalogue_apply`), or what the file is when it
    is not a compaction of that log (carried over to another run, another log's, or one with fewer changes
    than were read: a backup put back?). A compacted file's first line, written before it took the path,
    never changes."""
    try:
        folded = json.loads(first)["compacted"]
        place = (list(folded["from"]), int(folded["body"]), int(folded["lines"]), int(folded["total"]))
        ours = json.loads(first).get("log") == log_id
    except (ValueError, KeyError, TypeError):
        place, ours = None, False
    if place is None or not ours or place[3] < changes:
        run = carried_to(first)
        if run:
            return (f"was carried over to the catalogue of {run} (seqrec carry-log): this process serves the run "
                    "before, and takes no more catalogue changes; restart it on the new run")
        return "was replaced by a file that is not a compaction of it: restart the service"
    return (place[1], place[2]) if place[0] == list(origin) else None


def fold(changes: list[dict[str, Any]]) -> tuple[Texts, dict[str, bool]]:
    """Changes (read lines) folded: raw id -> (last text, its title or None, encoder, vector) in the order of
    first addition, and raw id -> whether its last change removed it."""
    texts: Texts = {}
    removed: dict[str, bool] = {}
    for record in changes:
        if record["op"] == "remove":
            removed.update(dict.fromkeys(record["ids"], True))
            continue
        vectors = record.get("vectors") if "encoder" in record else None  # none of a named encoder: unused
        titles = record.get("titles", {})
        for row, (raw_id, text) in enumerate(record["items"].items()):
            texts[raw_id] = (text, titles.get(raw_id), record.get("encoder"), None if vectors is None else vectors[row])
            removed[raw_id] = False
    return texts, removed
