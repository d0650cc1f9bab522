"""Reader for RecBole atomic files: `<name>.inter` and optional `<name>.item`.

Both are TAB-separated with a `field:type` header; types are token, token_seq,
float and float_seq. Interaction fields: `user_id` -> user (`session_id` when
there is no user_id), `item_id` -> item, `timestamp` -> timestamp; other fields
are kept (float -> Float64, float_seq -> List(Float64), token / token_seq -> Utf8).
Item fields: `item_id` -> item, `movie_title` / `title` -> title, `class` /
`categories` -> categories (a token_seq becomes "a, b, c"), `release_year` ->
year; every other item field is kept as Utf8 under its own name.
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from seqrec.data.readers_io import make_dataset, read_lines, split_fields, to_float
from seqrec.data.types import RawDataset
from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)

ATOMIC_TYPES = ("token", "token_seq", "float", "float_seq")
_INTER_RENAME = {"user_id": "user", "item_id": "item", "timestamp": "timestamp"}
_ITEM_RENAME = {
    "item_id": "item",
    "movie_title": "title",
    "title": "title",
    "class": "categories",
    "categories": "categories",
    "release_year": "year",
}


def read_atomic(path: Path) -> tuple[pl.DataFrame, dict[str, str]]:
    """One atomic file -> (Utf8 columns named by field plus `lineno`, field -> type)."""
    lines = read_lines(path)
    if lines.height == 0:
        raise SeqrecError(f"{path}: empty file (expected a 'field:type' header)")
    header_no, header = lines.row(0)
    types: dict[str, str] = {}
    for spec in header.split("\t"):
        field, _, kind = spec.strip().partition(":")
        if kind not in ATOMIC_TYPES:
            raise SeqrecError(
                f"{path}, line {header_no}: header field {spec!r} needs a type "
                f"({', '.join(ATOMIC_TYPES)}), as in 'item_id:token'"
            )
        if field in types:
            raise SeqrecError(f"{path}, line {header_no}: field {field!r} appears twice")
        types[field] = kind
    body = split_fields(lines.slice(1), path, "\t", list(types))
    return body, types


def _typed(body: pl.DataFrame, types: dict[str, str], path: Path) -> list[pl.Expr]:
    """Column expressions that give each atomic field its polars type."""
    exprs = []
    for field, kind in types.items():
        if kind == "float":
            exprs.append(to_float(body, field, path))
        elif kind == "float_seq":
            seq = pl.col(field).str.strip_chars().str.split(" ")
            exprs.append(seq.cast(pl.List(pl.Float64), strict=False).alias(field))
        else:
            exprs.append(pl.col(field))
    return exprs


def _find_prefix(dir_or_prefix: Path, name: str | None) -> Path:
    """`dir/name` such that `dir/name.inter` exists."""
    path = Path(dir_or_prefix)
    if path.suffix == ".inter" and path.is_file():
        return path.with_suffix("")
    if path.is_dir():
        if name is not None:
            return path / name
        if (path / f"{path.name}.inter").is_file():
            return path / path.name
        found = sorted(p for p in path.glob("*.inter") if p.stem.count(".") == 0)
        if len(found) == 1:
            return found[0].with_suffix("")
        names = ", ".join(p.name for p in found) or "none"
        raise SeqrecError(f"{path}: expected exactly one <name>.inter file, found {names}")
    if name is not None:
        return path.parent / name
    return path


def read_recbole(dir_or_prefix: Path, name: str | None = None) -> RawDataset:
    """RecBole atomic `<name>.inter` (+ `<name>.item` when present) from a folder or prefix."""
    prefix = _find_prefix(Path(dir_or_prefix), name)
    inter_path = prefix.with_name(prefix.name + ".inter")
    if not inter_path.is_file():
        raise SeqrecError(f"{inter_path}: RecBole interaction file not found")
    body, types = read_atomic(inter_path)
    rename = {f: t for f, t in _INTER_RENAME.items() if f in types}
    if "user_id" not in types and "session_id" in types:
        rename["session_id"] = "user"
    for need in ("user", "item"):
        if need not in rename.values():
            fields = ", ".join(types)
            raise SeqrecError(f"{inter_path}: no {need}_id field; fields are {fields}")
    if "timestamp" in types:
        types["timestamp"] = "float"
    frame = body.select(_typed(body, types, inter_path)).rename(rename)
    items = None
    item_path = prefix.with_name(prefix.name + ".item")
    if item_path.is_file():
        items = _read_items(item_path)
    log.info("read %s: %d interactions", inter_path, frame.height)
    return make_dataset(frame, items, prefix.name, inter_path)


def _read_items(path: Path) -> pl.DataFrame:
    body, types = read_atomic(path)
    if "item_id" not in types:
        raise SeqrecError(f"{path}: no item_id field; fields are {', '.join(types)}")
    exprs = []
    taken = {f for f in types if _ITEM_RENAME.get(f, f) == f}
    for field, kind in types.items():
        target = _ITEM_RENAME.get(field, field)
        if target != field:
            target = field if target in taken else target
            taken.add(target)
        col = pl.col(field).str.strip_chars()
        if target == "categories" and kind == "token_seq":
            col = col.str.replace_all(r"\s+", ", ")
        exprs.append(pl.when(col != "").then(col).alias(target))
    frame = body.select(exprs)
    return frame.select("item", *[c for c in frame.columns if c != "item"])
