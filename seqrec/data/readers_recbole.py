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

from seqrec.data.item_table import free_field_names
from seqrec.data.readers_io import check_time_range, make_dataset, read_lines, split_fields, to_float
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


def read_recbole(dir_or_prefix: Path, name: str | None = None, user_col: str | None = None,
                 item_col: str | None = None, time_col: str | None = None) -> RawDataset:
    """RecBole atomic `<name>.inter` (+ `<name>.item` when present) from a folder or prefix. The fields are
    RecBole's defaults (`user_id`, or `session_id`; `item_id`; `timestamp`) unless named, as RecBole's
    USER_ID_FIELD / ITEM_ID_FIELD / TIME_FIELD name them (the item field in both files)."""
    prefix = _find_prefix(Path(dir_or_prefix), name)
    inter_path = prefix.with_name(prefix.name + ".inter")
    if not inter_path.is_file():
        raise SeqrecError(f"{inter_path}: RecBole interaction file not found")
    body, types = read_atomic(inter_path)
    for given, flag in ((user_col, "user"), (item_col, "item"), (time_col, "time")):
        if given is not None and given not in types:
            raise SeqrecError(f"{inter_path}: no field {given!r} (the {flag} field); fields are {', '.join(types)}")
    named = {user_col or "user_id": "user", item_col or "item_id": "item", time_col or "timestamp": "timestamp"}
    rename = {f: t for f, t in named.items() if f in types}
    if user_col is None and "user_id" not in types and "session_id" in types:
        rename["session_id"] = "user"
    for need in ("user", "item"):
        if need not in rename.values():
            fields = ", ".join(types)
            raise SeqrecError(f"{inter_path}: no {need}_id field (--{need}-col names another); fields are {fields}")
    time_field = next((f for f, t in rename.items() if t == "timestamp"), None)
    if time_field is not None:
        types[time_field] = "float"
    clash = [f for f in types if f in rename.values() and f not in rename]  # e.g. `timestamp` beside --time-col ts
    if clash:
        log.warning("%s: field(s) %s left out: the fields read take their names", inter_path, ", ".join(clash))
        body, types = body.drop(clash), {f: t for f, t in types.items() if f not in clash}
    frame = body.select(_typed(body, types, inter_path)).rename(rename)
    if time_field is not None:
        check_time_range(frame["timestamp"], inter_path, time_field)
    items = None
    item_path = prefix.with_name(prefix.name + ".item")
    if item_path.is_file():
        items = _read_items(item_path, item_col or "item_id")
    log.debug("read %s: %d interactions", inter_path, frame.height)
    return make_dataset(frame, items, prefix.name, inter_path)


def _read_items(path: Path, item_field: str = "item_id") -> pl.DataFrame:
    body, types = read_atomic(path)
    if item_field not in types:
        raise SeqrecError(f"{path}: no {item_field} field; fields are {', '.join(types)}")
    names = {**_ITEM_RENAME, item_field: "item"}
    if item_field != "item_id":
        names.pop("item_id")
    targets = {}
    taken = {f for f in types if names.get(f, f) == f}
    for field in types:
        target = names.get(field, field)
        if target != field:
            target = field if target in taken else target
            taken.add(target)
        targets[field] = target
    free = free_field_names([t for f, t in targets.items() if f != item_field], str(path))  # `item`, `idx`: ours
    exprs = []
    for field, kind in types.items():
        target = targets[field] if field == item_field else free.get(targets[field], targets[field])
        col = pl.col(field).str.strip_chars()
        if target == "categories" and kind == "token_seq":
            col = col.str.replace_all(r"\s+", ", ")
        exprs.append(pl.when(col != "").then(col).alias(target))
    frame = body.select(exprs)
    return frame.select("item", *[c for c in frame.columns if c != "item"])


def _find_sequential(dir_or_prefix: Path, name: str | None) -> tuple[Path, Path | None, Path | None]:
    """(`<name>.test.inter`, `<name>.valid.inter` or None, the item file or None)."""
    path = Path(dir_or_prefix)
    if path.is_file() and path.name.endswith(".test.inter"):
        folder, name = path.parent, path.name[: -len(".test.inter")]
    elif path.is_dir():
        folder = path
        if name is None:
            found = sorted(p.name[: -len(".test.inter")] for p in path.glob("*.test.inter"))
            if len(found) != 1:
                raise SeqrecError(f"{path}: expected exactly one <name>.test.inter file (RecBole's sequential "
                                  f"benchmark layout), found {', '.join(found) or 'none'}")
            name = found[0]
    else:
        raise SeqrecError(f"{path}: not a folder or a <name>.test.inter file")
    test = folder / f"{name}.test.inter"
    if not test.is_file():
        raise SeqrecError(f"{test}: RecBole sequential test file not found")
    valid = folder / f"{name}.valid.inter"
    item: Path | None = folder / f"{name}.item"
    if not (folder / f"{name}.item").is_file():  # e.g. Games-6k.*.inter beside Games.item
        items = sorted(folder.glob("*.item"))
        item = items[0] if len(items) == 1 else None
    return test, valid if valid.is_file() else None, item


def _sequence_rows(path: Path) -> pl.DataFrame:
    """lineno, user, history (list of item tokens, oldest first) and target of a sequential file."""
    body, types = read_atomic(path)
    needed = ("user_id", "item_id_list", "item_id")
    missing = [f for f in needed if f not in types]
    if missing:
        raise SeqrecError(f"{path}: no {', '.join(missing)} field(s); a sequential benchmark file has "
                          f"{', '.join(needed)} (fields here: {', '.join(types)})")
    rows = body.select(
        "lineno",
        pl.col("user_id").str.strip_chars().alias("user"),
        pl.col("item_id_list").str.strip_chars().str.split(" ").list.eval(
            pl.element().filter(pl.element() != "")).alias("history"),
        pl.col("item_id").str.strip_chars().alias("target"),
    )
    dup = rows.filter(pl.col("user").is_duplicated())
    if dup.height:
        row = dup.row(-1, named=True)
        raise SeqrecError(f"{path}, line {row['lineno']}: user {row['user']!r} has a second row")
    empty = rows.filter((pl.col("user") == "") | (pl.col("target") == ""))
    if empty.height:
        raise SeqrecError(f"{path}, line {empty['lineno'][0]}: empty user_id or item_id")
    return rows


def read_recbole_sequential(dir_or_prefix: Path, name: str | None = None) -> RawDataset:
    """RecBole's sequential benchmark files -> each user's full sequence (test history + test target).

    `<name>.test.inter` holds one row per user: `item_id_list` (the history, oldest first,
    truncated to the benchmark's maximum length) and `item_id` (the last item). When
    `<name>.valid.inter` is present, each of its targets must be the last item of the test
    history (the validation row is the test row shifted by one). Leave-one-out on the rebuilt
    sequences gives back the files' own validation and test targets. Histories at the maximum
    length may have lost their oldest items; how many is logged.
    """
    test, valid, item_path = _find_sequential(Path(dir_or_prefix), name)
    rows = _sequence_rows(test)
    if valid is not None:
        check = _sequence_rows(valid).join(rows.select("user", pl.col("history").list.last().alias("_last")),
                                           on="user", how="left")
        bad = check.filter(pl.col("_last").is_null() | (pl.col("_last") != pl.col("target")))
        if bad.height:
            row = bad.row(0, named=True)
            why = ("has no row in " + test.name) if row["_last"] is None else \
                f"has validation target {row['target']!r} but its test history ends with {row['_last']!r}"
            raise SeqrecError(f"{valid}, line {row['lineno']}: user {row['user']!r} {why}")
    longest = rows["history"].list.len().max()
    at_max = int((rows["history"].list.len() == longest).sum()) if longest else 0
    if longest and at_max:
        log.info("%s: %d of %d histories have the maximum length %d and may be truncated (oldest items lost)",
                 test, at_max, rows.height, longest)
    frame = rows.select("user", pl.concat_list("history", pl.col("target")).alias("item")).explode("item")
    items = _read_items(item_path) if item_path is not None else None
    log.debug("read %s: %d users, %d interactions", test, rows.height, frame.height)
    return make_dataset(frame, items, test.name[: -len(".test.inter")], test)
