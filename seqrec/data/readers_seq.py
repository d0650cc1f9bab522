"""Readers for per-user sequence files and their item text.

- S3-Rec / P5 lines: `user item item ...` (whitespace separated, chronological).
- LC-Rec / LETTER JSON: `{user_idx: [item_idx, ...]}` and `{item_idx: {title, ...}}`.
- Item text helpers used by the catalog: Yelp (`Yelp.item.json`, LETTER index =
  S3-Rec item id - 1) and the Beauty / Sports pseudo-text of IDGenRec.

None of these sources has timestamps: `timestamp` is null and the row order (the
order of the file) is the chronological order.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import polars as pl

from seqrec.data.readers_io import (
    line_error,
    make_dataset,
    map_ids,
    read_id_map,
    read_json,
    read_lines,
    split_fields,
)
from seqrec.data.types import RawDataset
from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)

_S3REC_LINE = r"^\d+( \d+)+$"


def read_s3rec(txt_path: Path, name: str | None = None) -> RawDataset:
    """`user item1 item2 ...` per line (S3-Rec, P5 `sequential_data.txt`), integer ids."""
    path = Path(txt_path)
    lines = read_lines(path).with_columns(
        pl.col("line").str.strip_chars().str.replace_all(r"\s+", " ")
    )
    bad = lines.filter(~pl.col("line").str.contains(_S3REC_LINE))
    if bad.height:
        lineno, line = bad.row(0)
        tokens = line.split(" ")
        wrong = [t for t in tokens if not t.isdigit()]
        if wrong:
            raise line_error(path, lineno, f"id {wrong[0]!r} is not a non-negative integer")
        raise line_error(path, lineno, "expected a user id followed by at least one item id")
    tokens = pl.col("line").str.split(" ")
    frame = lines.select(
        tokens.list.first().alias("user"), tokens.list.slice(1).alias("item")
    ).explode("item")
    log.debug("read %s: %d users, %d interactions", path, lines.height, frame.height)
    return make_dataset(frame, None, name or path.stem, path)


def _text_value(value: Any, joiner: str) -> str | None:
    """One JSON field as text: lists joined, empty values as null."""
    if value is None:
        return None
    if isinstance(value, list):
        value = joiner.join(str(v) for v in value if v is not None and str(v).strip())
    text = str(value).strip()
    return text or None


def read_item_json(
    path: Path, id_offset: int = 0, rename: dict[str, str] | None = None
) -> pl.DataFrame:
    """`{item_idx: {field: text or list}}` -> item, then one Utf8 column per field.

    `categories` lists are joined with ", ", other lists with " ". Item ids become
    `int(idx) + id_offset` as strings (Yelp's LETTER file needs offset 1).
    """
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise SeqrecError(f"{path}: expected a JSON object {{item_id: {{field: text}}}}")
    keys = list(data.keys())
    if id_offset:
        bad = next((k for k in keys if not k.strip().lstrip("-").isdigit()), None)
        if bad is not None:
            raise SeqrecError(f"{path}: item key {bad!r} is not an integer")
        keys = [str(int(k) + id_offset) for k in keys]
    fields: list[str] = []
    for record in data.values():  # one pass per item, not per interaction
        fields.extend(f for f in record if f not in fields)
    columns: dict[str, list[str | None]] = {"item": list(keys)}
    for field in fields:
        joiner = ", " if field == "categories" else " "
        columns[field] = [_text_value(r.get(field), joiner) for r in data.values()]
    frame = pl.DataFrame(columns, schema={c: pl.Utf8 for c in columns})
    return frame.rename(rename or {})


def _sequences_frame(path: Path, data: Any) -> pl.DataFrame:
    """`{user: [item, ...]}` -> rows (user, item) in file order."""
    if not isinstance(data, dict):
        raise SeqrecError(f"{path}: expected a JSON object {{user_id: [item ids]}}")
    bad = next((u for u, seq in data.items() if not isinstance(seq, list)), None)
    if bad is not None:
        raise SeqrecError(f"{path}: the value for user {bad!r} is not a list of item ids")
    items = pl.Series("item", list(data.values()), strict=False)
    if items.dtype not in (pl.List(pl.Int64), pl.List(pl.Utf8), pl.List(pl.Null)):
        raise SeqrecError(f"{path}: item ids must be all integers or all strings")
    frame = pl.DataFrame(
        {"user": list(data.keys()), "item": items}, schema_overrides={"user": pl.Utf8}
    )
    frame = frame.explode("item").drop_nulls("item")
    return frame.with_columns(pl.col("item").cast(pl.Utf8))


def read_lcrec(
    inter_json: Path,
    item_json: Path | None = None,
    item2id: Path | None = None,
    user2id: Path | None = None,
    name: str | None = None,
) -> RawDataset:
    """LC-Rec / LETTER `X.inter.json` (+ optional `X.item.json`, `X.item2id`, `X.user2id`).

    With `item2id` (`ASIN<TAB>idx`) raw item ids are the ASINs, in the interactions
    and in the item table; likewise `user2id` for users. Item table columns are the
    JSON fields (title, description, brand, categories), categories joined by ", ".
    """
    path = Path(inter_json)
    frame = _sequences_frame(path, read_json(path))
    items = read_item_json(Path(item_json)) if item_json is not None else None
    if item2id is not None:
        id_map = read_id_map(Path(item2id))
        frame = map_ids(frame, "item", id_map, Path(item2id), path.name)
        if items is not None:
            items = map_ids(items, "item", id_map, Path(item2id), Path(str(item_json)).name)
    if user2id is not None:
        frame = map_ids(frame, "user", read_id_map(Path(user2id)), Path(user2id), path.name)
    log.debug("read %s: %d interactions", path, frame.height)
    stem = path.name.removesuffix(".json").removesuffix(".inter")
    return make_dataset(frame, items, name or stem, path)


def read_yelp_items(item_json: Path) -> pl.DataFrame:
    """LETTER `Yelp.item.json` -> item (S3-Rec id = LETTER idx + 1), title, categories."""
    return read_item_json(item_json, id_offset=1, rename={"description": "categories"})


def read_p5_pseudo_text(datamaps_json: Path, phase0_txt: Path) -> pl.DataFrame:
    """Beauty / Sports item table: item (S3-Rec id), asin, title.

    `title` holds IDGenRec's *generated pseudo-text* (a short textual ID such as
    "rene furterer complexe 5" that a model derived from item text), not the real
    product title, which is not available for these builds. Items without
    pseudo-text keep a null title.
    """
    maps_path, text_path = Path(datamaps_json), Path(phase0_txt)
    maps = read_json(maps_path)
    if not isinstance(maps, dict) or not isinstance(maps.get("id2item"), dict):
        raise SeqrecError(f"{maps_path}: expected a P5 datamaps object with an 'id2item' map")
    id2item = maps["id2item"]
    items = pl.DataFrame(
        {"item": list(id2item.keys()), "asin": [str(v) for v in id2item.values()]},
        schema={"item": pl.Utf8, "asin": pl.Utf8},
    )
    text = split_fields(read_lines(text_path), text_path, " ", ["asin", "title"], rest_in_last=True)
    title = pl.col("title").str.strip_chars()
    text = text.select("asin", pl.when(title != "").then(title).alias("title"))
    text = text.unique("asin", keep="first", maintain_order=True)
    return items.join(text, on="asin", how="left", maintain_order="left")
