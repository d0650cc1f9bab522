"""The values of a log's columns, checked as a table is read (`seqrec.data.readers_table`): ids as strings
as written, less surrounding spaces (JSON true/false, arrays and objects refused), ids that often mean "missing" warned
about, event columns of numbers with a stray text value refused at its line."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import polars as pl

from seqrec.errors import SeqrecError

if TYPE_CHECKING:
    from seqrec.data.readers_table import TableFile

log = logging.getLogger(__name__)

NULL_LIKE = ("NA", "N/A", "n/a", "NaN", "nan", "null", "NULL", "None", "none")  # ids that may mean "missing"


def json_kind(value: object) -> str:
    """A JSON value's kind as a message names it."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object" if isinstance(value, dict) else "null"


def empty_ids(values: pl.Series) -> pl.Series:
    """The rows whose id is missing or spaces alone (what `id_strings` would make an empty id)."""
    return (values.is_null() | (values.cast(pl.Utf8).str.strip_chars() == "")).arg_true()


def id_strings(values: pl.Series, table: TableFile) -> pl.Series:
    """Ids as strings as written, less surrounding spaces (a log's and an item table's alike, so that `i7 ` in
    one is `i7` in the other); JSON / Parquet numbers as integers when they are whole. A JSON
    true/false, array or object is not an id (polars reads them as text in a column that also holds strings)."""
    dtype = values.dtype
    if table.kind == "jsonl" and dtype == pl.Utf8:
        _check_json_ids(values, table)
    if isinstance(dtype, (pl.Categorical, pl.Enum)):  # a DataFrame's category column (pandas "category")
        values = values.cast(pl.Utf8)
        dtype = values.dtype
    if dtype.is_float():
        whole = values.is_null() | (values == values.floor())
        if whole.all():
            values = values.cast(pl.Int64)
    elif not (dtype.is_integer() or dtype == pl.Utf8):
        raise SeqrecError(f"{table.path}: id column {values.name!r} holds {dtype} values, not ids")
    return values.cast(pl.Utf8).str.strip_chars()


def _check_json_ids(values: pl.Series, table: TableFile) -> None:
    """Rows whose id text looks like JSON true/false, an array or an object are checked against their line
    (only those: a string id "true" is an id)."""
    suspects = values.str.contains(r"^(true|false|\[.*\]|\{.*\})$").fill_null(False).arg_true().to_list()
    if not suspects:
        return
    wanted, row = set(suspects), -1
    with table.path.open(encoding="utf-8", errors="replace") as lines:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            row += 1
            if row in wanted:
                kind = json_kind(json.loads(line).get(values.name))
                if kind not in ("a string", "a number"):
                    raise SeqrecError(f"{table.path}, line {lineno}: id column {values.name!r} holds {kind}, "
                                      "not an id (a string or a number)")
            if row >= suspects[-1]:
                return


def warn_null_like(ids: pl.Series, role: str, column: str, table: TableFile) -> None:
    """An id such as "NA" or "null" is often an export's missing value: its rows would make one user (or item)
    of everything that had none. Kept (it may be a real id), with a warning naming it and its rows."""
    counts = ids.filter(ids.is_in(NULL_LIKE)).value_counts(sort=True)
    for value, n in counts.iter_rows():
        log.warning("%s: %d row(s) have the %s id %r in column %r, which often stands for a missing value; they "
                    "are kept as one %s (drop those rows first if it is missing)", table.path, n, role, value,
                    column, role)


def check_numbers(values: pl.Series, column: str, table: TableFile) -> None:
    """An event column read as text because a few of its values are not numbers (a rating of "good" among
    5s) would be dropped by the features that read numbers: the first such value is named. A column of text
    throughout (a category) is kept as it is; an empty value is missing."""
    if values.dtype != pl.Utf8:
        return
    numbers = values.str.strip_chars().cast(pl.Float64, strict=False)
    bad = (numbers.is_null() & values.is_not_null()).arg_true()
    if bad.len() and numbers.is_not_null().any():
        row = int(bad[0])
        raise SeqrecError(f"{table.row_label(row)}: column {column!r} holds {values[row]!r} among numbers; an event "
                          "value is a number (or empty: missing)")
