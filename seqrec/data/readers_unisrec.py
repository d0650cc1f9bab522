"""Reader for UniSRec atomic files: full sequences rebuilt from leave-one-out rows.

Files (RecBole atomic, TAB separated), for a prefix `<name>`:
    <name>.train.inter, .valid.inter, .test.inter
                     header user_id:token  item_id_list:token_seq  item_id:token
    <name>.item2index (or .item2id)   ASIN<TAB>int                   (optional)
    <name>.user2index (or .user2id)   reviewerID<TAB>int             (optional)
    <name>.text      header item_id:token  text:token_seq, keyed by ASIN (optional)

Each row is (history, target). Train rows of a user are every earlier prefix, in
REVERSE chronological order in the file; histories are truncated (to 50 items
in UniSRec's build). A user's full sequence is rebuilt as

    history of the user's earliest row (its shortest train row; else the valid
    row; else the test row) + train targets oldest first + valid target + test target

and every row is then checked: its history must equal the items just before its
target in the rebuilt sequence. The result has a `split` column (train / valid /
test) with exactly one valid and one test event per user at the end.

Raw ids are the ASIN / reviewerID when the index files are present, else the
ints of the .inter files as strings. The `.text` string ("title. categories.
brand.", UniSRec's cleaned text) goes into the item table column `text`,
verbatim: it is the exact input UniSRec encodes, so it is not split into fields.
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from seqrec.data.readers_io import make_dataset, map_ids, read_id_map, read_lines, split_fields
from seqrec.data.readers_recbole import read_atomic
from seqrec.data.types import RawDataset
from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
_FIELDS = ("user_id", "item_id_list", "item_id")


def _find_prefix(dir_or_prefix: Path, name: str | None) -> Path:
    path = Path(dir_or_prefix)
    if path.is_dir():
        if name is not None:
            return path / name
        found = sorted(path.glob("*.test.inter"))
        if len(found) != 1:
            names = ", ".join(p.name for p in found) or "none"
            raise SeqrecError(f"{path}: expected exactly one <name>.test.inter file, found {names}")
        return path / found[0].name.removesuffix(".test.inter")
    for split in SPLITS:
        if path.name.endswith(f".{split}.inter"):
            return path.with_name(path.name.removesuffix(f".{split}.inter"))
    return path


def _sibling(prefix: Path, *suffixes: str) -> Path | None:
    for suffix in suffixes:
        candidate = prefix.with_name(prefix.name + suffix)
        if candidate.is_file():
            return candidate
    return None


def _read_rows(prefix: Path) -> pl.DataFrame:
    """All rows of the three files: user, hist, target, split, rank, file, lineno."""
    parts = []
    for rank, split in enumerate(SPLITS):
        path = prefix.with_name(f"{prefix.name}.{split}.inter")
        if not path.is_file():
            if split == "test":
                raise SeqrecError(f"{path}: UniSRec test file not found")
            continue
        body, types = read_atomic(path)
        missing = [f for f in _FIELDS if f not in types]
        if missing:
            raise SeqrecError(f"{path}: missing field(s) {missing}; fields are {', '.join(types)}")
        parts.append(
            body.select(
                pl.col("user_id").str.strip_chars().alias("user"),
                pl.col("item_id_list").str.extract_all(r"\S+").alias("hist"),
                pl.col("item_id").str.strip_chars().alias("target"),
                pl.lit(split).alias("split"),
                pl.lit(rank).alias("rank"),
                pl.lit(str(path)).alias("file"),
                pl.col("lineno").cast(pl.Int64),
            )
        )
    return pl.concat(parts)


def _order_rows(rows: pl.DataFrame) -> pl.DataFrame:
    """Sort each user's rows chronologically and number them (`k`); one valid/test each."""
    chrono = pl.when(pl.col("split") == "train").then(-pl.col("lineno")).otherwise(pl.col("lineno"))
    rows = (
        rows.with_row_index("_g")
        .with_columns(pl.col("_g").min().over("user").alias("_ufirst"))
        .sort(pl.col("_ufirst"), pl.col("rank"), chrono)
        .with_columns(pl.int_range(pl.len()).over("user").alias("k"))
    )
    again = rows.filter(
        (pl.col("split") != "train") & (pl.int_range(pl.len()).over("user", "split") > 0)
    )
    if again.height:
        row = again.row(0, named=True)
        raise SeqrecError(
            f"{row['file']}, line {row['lineno']}: user {row['user']} has more than one row"
        )
    return rows


def _rebuild(rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(rows with target position `pos`, sequence rows user/item/split/pos/file/lineno)."""
    base = rows.filter(pl.col("k") == 0)
    lengths = base.select("user", pl.col("hist").list.len().alias("_blen"))
    rows = rows.join(lengths, on="user").with_columns((pl.col("_blen") + pl.col("k")).alias("pos"))
    keep = ["user", "_ufirst", "file", "lineno"]
    prefix = (
        base.select(*keep, pl.col("hist").alias("item"))
        .explode("item")
        .drop_nulls("item")
        .with_columns(
            pl.lit("train").alias("split"), pl.int_range(pl.len()).over("user").alias("pos")
        )
    )
    targets = rows.select(*keep, pl.col("target").alias("item"), "split", "pos")
    seq = pl.concat([prefix, targets], how="diagonal").sort("_ufirst", "pos")
    return rows, seq


def _check_histories(rows: pl.DataFrame, seq: pl.DataFrame) -> None:
    """Every row's history must be the items right before its target in `seq`."""
    hist = rows.select(
        pl.int_range(pl.len()).alias("_r"),
        "user",
        "file",
        "lineno",
        "rank",
        "pos",
        "hist",
        pl.col("hist").list.len().alias("_hlen"),
    )
    too_long = hist.filter(pl.col("_hlen") > pl.col("pos")).sort("rank", "lineno")
    if too_long.height:
        r = too_long.row(0, named=True)
        raise SeqrecError(
            f"{r['file']}, line {r['lineno']}: user {r['user']} lists {r['_hlen']} history items "
            f"but only {r['pos']} precede this target in the rebuilt sequence"
        )
    tokens = (
        hist.explode("hist")
        .drop_nulls("hist")
        .with_columns(pl.int_range(pl.len()).over("_r").alias("_j"))
        .with_columns((pl.col("pos") - pl.col("_hlen") + pl.col("_j")).alias("_at"))
    )
    lookup = seq.select("user", pl.col("pos").alias("_at"), pl.col("item").alias("_expected"))
    joined = tokens.join(lookup, on=["user", "_at"], how="left")
    bad = joined.filter(pl.col("hist") != pl.col("_expected")).sort("rank", "lineno", "_j")
    if bad.height:
        r = bad.row(0, named=True)
        raise SeqrecError(
            f"{r['file']}, line {r['lineno']}: history of user {r['user']} does not match the "
            f"sequence rebuilt from the train/valid/test files (history item {r['_j'] + 1} is "
            f"{r['hist']!r}, expected {r['_expected']!r})"
        )


def _read_text(path: Path) -> pl.DataFrame:
    lines = read_lines(path)
    if lines.height == 0:
        raise SeqrecError(
            f"{path}: empty file (expected an 'item_id:token<TAB>text:token_seq' header)"
        )
    header_no, header = lines.row(0)
    fields = [spec.strip().partition(":")[0] for spec in header.split("\t")]
    if fields[:1] != ["item_id"] or "text" not in fields:
        raise SeqrecError(
            f"{path}, line {header_no}: expected item_id and text fields, found {fields}"
        )
    body = split_fields(lines.slice(1), path, "\t", fields, rest_in_last=fields[-1] == "text")
    text = pl.col("text").str.strip_chars()
    return body.select(
        pl.col("item_id").str.strip_chars().alias("item"),
        pl.when(text != "").then(text).alias("text"),
    )


def read_unisrec(dir_or_prefix: Path, name: str | None = None) -> RawDataset:
    """UniSRec `<name>.{train,valid,test}.inter` (+ index and text files) -> full sequences."""
    prefix = _find_prefix(Path(dir_or_prefix), name)
    rows, seq = _rebuild(_order_rows(_read_rows(prefix)))
    _check_histories(rows, seq)
    where = f"{prefix.name}.*.inter"
    item_map_path = _sibling(prefix, ".item2index", ".item2id")
    if item_map_path is not None:
        seq = map_ids(seq, "item", read_id_map(item_map_path), item_map_path, where)
    user_map_path = _sibling(prefix, ".user2index", ".user2id")
    if user_map_path is not None:
        seq = map_ids(seq, "user", read_id_map(user_map_path), user_map_path, where)
    text_path = _sibling(prefix, ".text")
    items = _read_text(text_path) if text_path is not None else None
    if items is not None and item_map_path is None:
        log.warning("%s: no item2index file; text keys are matched to the raw ints", text_path)
    frame = seq.select("user", "item", "split")
    log.debug("read %s: %d users, %d interactions", where, frame["user"].n_unique(), frame.height)
    return make_dataset(frame, items, prefix.name, prefix.parent / where)
