"""The catalogue log's file (`seqrec.serve.catalogue_log`): its lines (what a change looks like, its
vectors packed), and reading and writing them whole.

    {"op": "catalogue", "items": N, "fingerprint": "...",   first line: the catalogue it was written for
     "log": "..."}                                         (and the log's id, which compactions keep)
    {"op": "items", "items": {"raw id": "text", ...},      POST /items: added, or text replaced,
     "encoder": "...", "vectors": "...",                   with the texts' frozen-encoder vectors
     "titles": {"raw id": "title", ...}}                   and the titles given (optional: the text otherwise)
    {"op": "remove", "ids": ["raw id", ...]}               DELETE /items/{id}, POST /items/remove

Replaying gives the same catalogue: the same raw ids under the same item indices, texts and removed
items. An "items" line carries its texts through the frozen text encoder (`vectors`: little-endian
float32, base64, one row per item; `encoder` names the encoder and its settings), so replaying it or
taking it from another process runs only the model's adaptor, not the text encoder, on the vectors the
writer had. A line without them (older logs) or from another encoder has its texts encoded again."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)


class CatalogueLogBroken(SeqrecError):
    """This process can no longer keep the catalogue log: its catalogue may differ from the file."""


class CatalogueLogCarried(CatalogueLogBroken):
    """The catalogue log was carried over to another run's catalogue (`seqrec carry-log`, a deploy): this
    process, serving the run before, is about to be replaced."""


def catalogue_fingerprint(raw_ids: Sequence[str]) -> str:
    """The catalogue a log belongs to: its raw ids in index order."""
    return hashlib.sha256("\n".join(raw_ids).encode("utf-8", "surrogatepass")).hexdigest()[:20]


def pack_vectors(vectors: torch.Tensor) -> str:
    """(n, D) vectors as an "items" line keeps them, bit for bit."""
    return base64.b64encode(vectors.detach().cpu().float().numpy().astype("<f4").tobytes()).decode("ascii")


def unpack_vectors(text: str, rows: int) -> np.ndarray:
    """`pack_vectors`'s (rows, D) float32 array; a SeqrecError if `text` is not that."""
    try:
        flat = np.frombuffer(base64.b64decode(text, validate=True), dtype="<f4")
    except (binascii.Error, ValueError):
        raise SeqrecError('"vectors" is not base64 float32') from None
    if rows == 0 or flat.size == 0 or flat.size % rows:
        raise SeqrecError(f'"vectors" holds {flat.size} floats, not a row for each of {rows} item(s)')
    return flat.reshape(rows, -1).astype(np.float32)


def read_lines(path: Path, lines: list[bytes], first: int) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line number, "file:line", record) for each line that is not blank, numbered from `first`: a change
    (its vectors unpacked) or a catalogue line; a SeqrecError naming the line for anything else."""
    for number, raw in enumerate(lines, first):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(raw)
        except ValueError as exc:  # UnicodeDecodeError too
            raise SeqrecError(f"{where}: not JSON ({exc})") from None
        if isinstance(record, dict) and record.get("op") == "catalogue":
            yield number, where, record
            continue
        why = invalid(record)
        if why:
            raise SeqrecError(f"{where}: not a catalogue change: {why}")
        if record["op"] == "items" and "vectors" in record:
            try:
                record["vectors"] = unpack_vectors(record["vectors"], len(record["items"]))
            except SeqrecError as exc:
                raise SeqrecError(f"{where}: {exc}") from None
        yield number, where, record


def check_head(record: dict[str, Any], where: str, first: bool) -> None:
    if not (isinstance(record.get("fingerprint"), str) and isinstance(record.get("items"), int)):
        raise SeqrecError(f"{where}: not a catalogue change: a bad catalogue line")
    if not first:
        raise SeqrecError(f"{where}: not a catalogue change: a catalogue line must come first")


def same_file(path: Path, fd: int) -> bool:
    try:
        a, b = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is out (a write may take fewer, on a nearly full disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def append_line(fd: int, line: bytes) -> int:
    """Write one line at the end of the file `fd` (opened to append), on the disk when this returns -> where it
    starts. A line not written whole is cut off again: no half line for the next one to run into."""
    start = os.fstat(fd).st_size
    try:
        write_all(fd, line)
        os.fsync(fd)
    except BaseException:
        truncate(fd, start)
        raise
    return start


def truncate(fd: int, size: int) -> None:
    os.ftruncate(fd, size)
    os.fsync(fd)


def read_at(fd: int, offset: int, n: int) -> bytes:
    """n bytes from offset (one pread returns at most about 2 GiB on Linux)."""
    parts = []
    while n > 0:
        part = os.pread(fd, min(n, 1 << 30), offset)
        if not part:
            break
        parts.append(part)
        offset += len(part)
        n -= len(part)
    return b"".join(parts)


def line_bytes(record: dict[str, Any]) -> bytes:
    return (json.dumps(record) + "\n").encode()  # ASCII: any string, a lone surrogate too, round-trips


def invalid(record: Any) -> str | None:
    """What is wrong with a change read from a line, or None."""
    if not isinstance(record, dict) or record.get("op") not in ("items", "remove"):
        return 'expected {"op": "items", ...} or {"op": "remove", ...}'
    if record["op"] == "items":
        items = record.get("items")
        if not isinstance(items, dict) or not items or not all(
                isinstance(k, str) and k and isinstance(v, str) and v.strip() for k, v in items.items()):
            return '"items" must map raw ids to texts that are not empty'
        if not isinstance(record.get("vectors", ""), str) or not isinstance(record.get("encoder", ""), str):
            return '"vectors" and "encoder" must be strings'
        titles = record.get("titles", {})
        if not isinstance(titles, dict) or not all(
                k in items and isinstance(v, str) and v.strip() for k, v in titles.items()):
            return '"titles" must map raw ids of "items" to titles that are not empty'
        return None
    ids = record.get("ids")
    return None if isinstance(ids, list) and all(isinstance(i, str) and i for i in ids) else '"ids" must list raw ids'
