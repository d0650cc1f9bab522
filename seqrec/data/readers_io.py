"""Shared plumbing for the readers: lines, fields, JSON, id maps and user-facing errors.

Every text reader goes through `read_lines`, which keeps the 1-based line number
of each line next to it, so that any later check (field count, integer ids,
float values) can name the exact file and line of the first bad row without a
Python loop over the rows.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import polars as pl

from seqrec.data.types import Interactions, ItemTable, RawDataset
from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)

INT_PATTERN = r"^-?\d+$"


def line_error(path: Path, lineno: int, message: str) -> SeqrecError:
    """A one-line error naming the file and the 1-based line number."""
    return SeqrecError(f"{path}, line {lineno}: {message}")


def require_file(path: Path, what: str = "file") -> Path:
    """`path` when it is a regular file; else a one-line error (`what` names it: "file", "item table")."""
    path = Path(path)
    if path.is_dir():
        raise SeqrecError(f"{path}: {what} is a folder, not a file")
    if not path.is_file():
        problem = "not a regular file" if path.exists() else "no such file"
        raise SeqrecError(f"{path}: {problem}" + ("" if what in ("file", "table") else f" (the {what})"))
    return path


def read_text(path: Path, encoding: str = "utf-8") -> str:
    require_file(path)
    try:
        return path.read_text(encoding=encoding)
    except UnicodeDecodeError as err:
        raise SeqrecError(f"{path}: not {encoding} text (bad byte at offset {err.start})") from None
    except OSError as err:
        raise SeqrecError(f"{path}: cannot read ({err.strerror})") from None


def read_lines(path: Path, encoding: str = "utf-8") -> pl.DataFrame:
    """Non-blank lines of a text file: columns `lineno` (1-based) and `line` (no line end)."""
    text = read_text(path, encoding)
    lines = pl.Series("line", [text]).str.split("\n").explode()
    frame = pl.DataFrame(lines).with_row_index("lineno", offset=1)
    frame = frame.with_columns(pl.col("line").str.strip_chars_end("\r"))
    return frame.filter(pl.col("line").str.strip_chars() != "")


def split_fields(
    lines: pl.DataFrame, path: Path, sep: str, names: list[str], rest_in_last: bool = False
) -> pl.DataFrame:
    """Split `line` on `sep` into exactly `len(names)` Utf8 columns (plus `lineno`).

    With `rest_in_last`, the last field takes the remainder of the line (free text
    that may contain `sep`); otherwise a line with any other field count is an error.
    """
    n = len(names)
    parts = lines.select("lineno", pl.col("line").str.split(sep).alias("_parts"))
    count = pl.col("_parts").list.len()
    bad = parts.filter(count < n if rest_in_last else count != n)
    if bad.height:
        row = bad.row(0, named=True)
        shown = "TAB" if sep == "\t" else repr(sep)
        raise line_error(
            path,
            row["lineno"],
            f"expected {n} {shown}-separated fields ({', '.join(names)}), "
            f"found {len(row['_parts'])}",
        )
    cols = [pl.col("_parts").list.get(i).alias(name) for i, name in enumerate(names[:-1])]
    last = pl.col("_parts").list.slice(n - 1)
    cols.append((last.list.join(sep) if rest_in_last else last.list.first()).alias(names[-1]))
    return parts.select("lineno", *cols)


def check_ints(frame: pl.DataFrame, column: str, path: Path, what: str) -> None:
    """Raise at the first row whose `column` is not an integer."""
    bad = frame.filter(~pl.col(column).str.contains(INT_PATTERN))
    if bad.height:
        row = bad.row(0, named=True)
        raise line_error(path, row["lineno"], f"{what} {row[column]!r} is not an integer")


def to_float(frame: pl.DataFrame, column: str, path: Path) -> pl.Expr:
    """`column` (Utf8) as Float64; raises at the first value that is not a finite number (NaN and
    infinity included: they cannot order events, nor weigh them)."""
    values = pl.col(column).str.strip_chars().cast(pl.Float64, strict=False)
    bad = frame.filter(values.is_null() & (pl.col(column).str.strip_chars() != ""))
    if bad.height:
        row = bad.row(0, named=True)
        raise line_error(path, row["lineno"], f"{column} value {row[column]!r} is not a number")
    infinite = frame.filter(values.is_not_null() & ~values.is_finite())
    if infinite.height:
        row = infinite.row(0, named=True)
        raise line_error(path, row["lineno"], f"{column} value {row[column]!r} is not a finite number")
    return values.alias(column)


# Finite times are kept as they are: they order each user's events, whatever their unit. Only the
# time features (gap, hour of day) read them as seconds, so values outside the plausible range of
# epoch seconds are accepted with a warning that names the file and the range seen.
PLAUSIBLE_SECONDS = (0.0, 1e11)  # 1970 .. about year 5100; milliseconds since 1970 are above it


def check_time_range(seconds: pl.Series, path: Path, column: str) -> None:
    """Warn when a log's times lie outside epoch seconds (`PLAUSIBLE_SECONDS`); they are kept as given."""
    lo, hi = seconds.min(), seconds.max()
    if lo is None or hi is None:
        return
    if float(lo) < PLAUSIBLE_SECONDS[0] or float(hi) > PLAUSIBLE_SECONDS[1]:  # type: ignore[arg-type]
        log.warning("%s: time %r runs from %g to %g, outside epoch seconds (%g..%g); events are ordered by it "
                    "as given, but time features (gap, hour) would read it as seconds", path, column, lo, hi,
                    *PLAUSIBLE_SECONDS)


def read_json(path: Path) -> Any:
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise line_error(path, err.lineno, f"invalid JSON ({err.msg})") from None


def read_id_map(path: Path) -> pl.DataFrame:
    """A `raw_id<TAB>int` file (UniSRec item2index, LC-Rec item2id) -> columns raw, idx (Utf8)."""
    fields = split_fields(read_lines(path), path, "\t", ["raw", "idx"])
    fields = fields.with_columns(pl.col("raw", "idx").str.strip_chars())
    check_ints(fields, "idx", path, "index")
    for col in ("raw", "idx"):
        dup = fields.filter(pl.col(col).is_duplicated())
        if dup.height:
            row = dup.row(-1, named=True)
            raise line_error(path, row["lineno"], f"{col} {row[col]!r} appears more than once")
    return fields


def map_ids(
    frame: pl.DataFrame, column: str, id_map: pl.DataFrame, map_path: Path, where: str
) -> pl.DataFrame:
    """Replace int ids in `column` by their raw ids from `id_map`; every id must be mapped."""
    lookup = id_map.select(pl.col("idx").alias(column), pl.col("raw").alias("_raw"))
    out = frame.join(lookup, on=column, how="left", maintain_order="left")
    missing = out.filter(pl.col("_raw").is_null())
    if missing.height:
        value = missing[column][0]
        raise SeqrecError(f"{map_path}: no entry for {column} {value!r} used in {where}")
    return out.with_columns(pl.col("_raw").alias(column)).drop("_raw")


def make_dataset(
    frame: pl.DataFrame, items: pl.DataFrame | None, name: str, source: Path
) -> RawDataset:
    """Wrap frames into the reader contract, with a null Float64 timestamp when absent."""
    if "timestamp" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("timestamp"))
    front = ["user", "item", "timestamp"]
    frame = frame.select(*front, *[c for c in frame.columns if c not in front])
    item_table = ItemTable(items, str(source)) if items is not None else None
    return RawDataset(Interactions(frame, str(source)), item_table, name)
