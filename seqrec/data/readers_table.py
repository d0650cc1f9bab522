"""Generic table reader (CSV / TSV / Parquet / JSON lines) and the DIGINETICA session sample.

Columns are chosen by name. Times may be numeric (kept as Float64) or date /
datetime strings, parsed with `time_format` (strftime codes) or, without one, as
ISO 8601 only, and turned into epoch seconds (naive times are taken as UTC). No
other layout is guessed: 01/02/2020 may be the 1st of February or the 2nd of
January, so it needs `time_format`. User and item ids are kept as strings exactly
as written (CSV columns are read as text, so "007" stays "007").

A table already in memory (a polars or pandas DataFrame, from Python) is read as a file is, with the
same checks; its rows are named by number.

A file polars cannot read is reported at its first bad line: the first JSON line
that is not an object, the first CSV row with more fields than its header.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl

from seqrec.data.readers_io import check_time_range, line_error, make_dataset, require_file
from seqrec.data.readers_values import check_numbers, empty_ids, id_strings, json_kind, warn_null_like
from seqrec.data.types import RawDataset
from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)

SEPARATORS = {".csv": ",", ".tsv": "\t", ".tab": "\t", ".txt": "\t"}
PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
TableKind = Literal["csv", "parquet", "jsonl"]
FRAME = Path("<DataFrame>")  # how errors name a table given in memory
TAB_NAMES = ("\\t", "tab")  # a tab as typed on a command line: the escape `\t` (two characters) or the word


def separator(sep: str, path: Path) -> str:
    """One character; `\\t` and `tab` (any case) mean a tab."""
    if sep.lower() in TAB_NAMES:
        return "\t"
    if len(sep) != 1:
        raise SeqrecError(f"{path}: the separator must be one character (or \\t or tab for a tab), got {sep!r}")
    return sep


@dataclass(frozen=True)
class TableFile:
    """A table on disk: CSV / TSV (`sep` set), Parquet or JSON lines (one object per line); or one in memory
    (`frame`: a DataFrame given from Python)."""

    path: Path
    kind: Literal["csv", "parquet", "jsonl", "frame"]
    sep: str | None = None
    frame: pl.DataFrame | None = None

    @classmethod
    def of(cls, path: Path | Any, sep: str | None = None, what: str = "table",
           kind: TableKind | None = None) -> TableFile:
        """`kind` when given (a `--format`), else the type the suffix names: a separator makes it CSV-like.
        A suffix of another type than `kind` is refused: reading Parquet bytes as CSV helps nobody.
        A polars or pandas DataFrame is the table itself (`kind` and `sep` do not apply)."""
        frame = as_frame(path)
        if frame is not None:
            return cls(FRAME, "frame", frame=frame)
        path = require_file(Path(path), what)
        suffix = path.suffix.lower()
        named: TableKind | None = ("parquet" if suffix in PARQUET_SUFFIXES else "jsonl" if suffix in JSONL_SUFFIXES
                                   else "csv" if suffix in SEPARATORS else None)
        if kind is not None and named is not None and named != kind:
            raise SeqrecError(f"{path}: read as {kind}, but its suffix {suffix!r} names a {named} file; give the "
                              f"format that matches the file (or rename it)")
        kind = kind or named
        if kind in ("parquet", "jsonl"):
            if sep is not None:
                raise SeqrecError(f"{path}: a separator is for CSV / TSV files, not {kind}")
            return cls(path, kind)
        if sep is not None:
            return cls(path, "csv", separator(sep, path))
        if kind is None:
            known = ", ".join([*SEPARATORS, *PARQUET_SUFFIXES, *JSONL_SUFFIXES])
            raise SeqrecError(f"{path}: unknown table type {suffix!r} (known: {known}; or pass a separator)")
        return cls(path, "csv", SEPARATORS.get(suffix, ","))

    def columns(self) -> list[str]:
        if self.frame is not None:
            return self.frame.columns
        try:
            if self.kind == "parquet":
                return list(pl.read_parquet_schema(self.path))
            if self.kind == "jsonl":
                return self._jsonl().columns
            columns = pl.read_csv(self.path, separator=self.sep or ",", n_rows=0, infer_schema=False).columns
        except (pl.exceptions.PolarsError, OSError) as err:
            raise self._error(err, "cannot read the header" if self.kind == "csv" else "cannot read") from None
        if any("_duplicated_" in c for c in columns):  # polars renames a repeated header: say it instead
            self._refuse_repeated_header()
        return columns

    def _refuse_repeated_header(self) -> None:
        """An error naming a column the CSV header holds twice (when it does: polars' suffix may be a real name)."""
        with self.path.open(encoding="utf-8-sig", errors="replace", newline="") as fh:
            header = next(csv.reader(fh, delimiter=self.sep or ","), [])
        seen: set[str] = set()
        for name in header:
            if name in seen:
                raise SeqrecError(f"{self.path}: column {name!r} appears twice in the header; "
                                  "every column needs its own name")
            seen.add(name)

    def load(self, wanted: list[str], text_cols: Sequence[str] = ()) -> pl.DataFrame:
        """Only the wanted columns; `text_cols` are read from CSV as Utf8, others inferred."""
        if self.frame is not None:
            return self.frame.select(wanted)
        try:
            if self.kind == "parquet":
                return pl.read_parquet(self.path, columns=wanted)
            if self.kind == "jsonl":
                return self._jsonl().select(wanted)
            return pl.read_csv(self.path, separator=self.sep or ",", columns=wanted,
                               schema_overrides={c: pl.Utf8 for c in text_cols},
                               infer_schema_length=None, null_values=[""])
        except (pl.exceptions.PolarsError, OSError) as err:
            raise self._error(err, "cannot read") from None

    def _error(self, err: Exception, what: str) -> SeqrecError:
        """The first bad line of a file polars refused, when one is found; else polars' own first line.
        (A Python pass over the lines, on this error path only, that stops at the first bad one.)"""
        found = None
        if self.kind != "parquet":
            try:
                with self.path.open(encoding="utf-8", errors="replace", newline="") as lines:
                    found = _bad_json_line(lines) if self.kind == "jsonl" else _long_csv_row(lines, self.sep or ",")
            except OSError:
                pass
        if found is not None:
            return line_error(self.path, *found)
        return SeqrecError(f"{self.path}: {what} ({_first_line(err)})")

    def _jsonl(self) -> pl.DataFrame:
        """Every line an object; fields missing from a line are null."""
        return pl.read_ndjson(self.path, infer_schema_length=None)

    def row_label(self, index: int) -> str:
        """Where data row `index` (0-based) is: a line of the file (after a CSV header) or a Parquet row."""
        if self.kind in ("parquet", "frame"):
            return f"{self.path}, row {index + 1}"
        return f"{self.path}, line {index + (2 if self.kind == 'csv' else 1)}"


def as_frame(table: Any) -> pl.DataFrame | None:
    """A polars DataFrame for a polars or pandas one (pandas through polars' converter); None for a path."""
    if isinstance(table, pl.DataFrame):
        return table
    if type(table).__module__.split(".")[0] == "pandas" and hasattr(table, "columns"):
        try:
            return pl.from_pandas(table)
        except (ImportError, TypeError, ValueError, pl.exceptions.PolarsError) as err:
            raise SeqrecError(f"{FRAME}: the pandas DataFrame cannot be converted to polars "
                              f"({_first_line(err)})") from None
    if isinstance(table, (pl.LazyFrame, pl.Series)):
        raise SeqrecError(f"a table must be a path or a DataFrame, not a {type(table).__name__} (collect it first)")
    return None


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


_MIXABLE = {"a number", "a string", "null"}  # a field of numbers and strings is read as text; others do not mix


def _bad_json_line(lines: Iterable[str]) -> tuple[int, str] | None:
    """(line number, problem) of the first non-blank line that is not one JSON object, or whose field holds
    a kind of value (array, object, true/false) that the same field's earlier lines did not."""
    first: dict[str, tuple[int, str]] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            return lineno, f"not valid JSON ({err.msg} at character {err.colno})"
        if not isinstance(value, dict):
            return lineno, "not a JSON object (JSON lines hold one object per line)"
        for field, v in value.items():
            kind = json_kind(v)
            if kind == "null":
                continue
            seen = first.setdefault(field, (lineno, kind))
            if seen[1] != kind and not {seen[1], kind} <= _MIXABLE:
                return lineno, f"field {field!r} holds {kind}, but on line {seen[0]} it holds {seen[1]}"
    return None


def _long_csv_row(lines: Iterable[str], sep: str) -> tuple[int, str] | None:
    """(line number, problem) of the first row with more fields than the header (rows with fewer are
    read with nulls)."""
    reader = csv.reader(lines, delimiter=sep)
    header = next(reader, None)
    start = reader.line_num + 1
    for row in reader:
        if header is not None and len(row) > len(header):
            shown = "TAB" if sep == "\t" else repr(sep)
            return start, f"{len(row)} {shown}-separated fields, but the header has {len(header)}"
        start = reader.line_num + 1
    return None


# Without a time format only ISO 8601 is read (with "T" or a space before the time, optional seconds and
# fraction, optional Z / +hh:mm); day / month order is never guessed from the values.
ISO_LAYOUTS = ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%d %H:%M%#z",
               "%Y-%m-%d %H:%M:%S%.f%#z")
TIME_FORMAT_HINT = ("ISO 8601 (2020-09-13, 2020-09-13T12:27:00) or a number; give any other layout with "
                    "--time-format, e.g. '%d/%m/%Y %H:%M' (day first) or '%m/%d/%Y' (month first): day / month "
                    "order is never guessed")


def iso_seconds(text: pl.Series) -> pl.Series:
    """ISO 8601 strings as epoch seconds (naive times as UTC); null where a value is in no ISO layout."""
    spaced = text.str.replace(r"^(\d{4}-\d{1,2}-\d{1,2})T", "${1} ")
    parsed = [spaced.str.strptime(pl.Datetime("us"), layout, strict=False).dt.epoch("us") for layout in ISO_LAYOUTS]
    return pl.select(pl.coalesce(parsed)).to_series().cast(pl.Float64) / 1e6


def to_epoch_seconds(values: pl.Series, time_format: str | None, table: TableFile) -> pl.Series:
    """Numbers as they are; datetimes / dates / strings as seconds since 1970-01-01 UTC."""
    dtype = values.dtype
    if dtype.is_numeric():
        out = values.cast(pl.Float64)
    elif dtype == pl.Date or isinstance(dtype, pl.Datetime):
        stamps = values.cast(pl.Datetime("us")) if dtype == pl.Date else values
        out = stamps.dt.epoch("us").cast(pl.Float64) / 1e6
    elif dtype == pl.Utf8:
        text = values.str.strip_chars()
        if time_format is not None:
            parsed = text.str.strptime(pl.Datetime("us"), time_format, strict=False)
            out = parsed.dt.epoch("us").cast(pl.Float64) / 1e6
        else:
            out = _numbers_or_iso(text, values, table)
    else:
        raise SeqrecError(f"{table.path}: time column {values.name!r} has unsupported type {dtype}")
    bad = (out.is_null() & values.is_not_null()).arg_true()
    missing = values.is_null().arg_true()
    if bad.len() or missing.len():
        index = min([*bad.head(1).to_list(), *missing.head(1).to_list()])
        if values[index] is None:
            raise SeqrecError(f"{table.row_label(index)}: empty time in column {values.name!r}")
        hint = f"in the --time-format layout {time_format!r}" if time_format else TIME_FORMAT_HINT
        raise SeqrecError(f"{table.row_label(index)}: time {values.name!r} value {values[index]!r} is not {hint}")
    infinite = (~out.is_finite()).arg_true()
    if infinite.len():
        index = int(infinite[0])
        raise SeqrecError(f"{table.row_label(index)}: time {values.name!r} value {values[index]!r} "
                          "is not a finite number")
    check_time_range(out, table.path, values.name)
    return out


def _numbers_or_iso(text: pl.Series, values: pl.Series, table: TableFile) -> pl.Series:
    """Numbers, or else ISO 8601 times, as seconds; null where a value is neither (the caller reports it).
    A column of both (some numbers, some dates) is refused: the two cannot be ordered together."""
    numeric = text.cast(pl.Float64, strict=False)
    if numeric.null_count() == values.null_count():
        return numeric
    iso = iso_seconds(text)
    if iso.null_count() == values.null_count():
        return iso
    both = numeric.fill_null(iso)
    if both.null_count() == values.null_count():  # each value a number or a date, and both kinds present
        num, date = int(numeric.is_not_null().arg_true()[0]), int(iso.is_not_null().arg_true()[0])
        raise SeqrecError(f"{table.row_label(num)}: time {values.name!r} value {values[num]!r} is a number, but "
                          f"{table.row_label(date).rsplit(', ', 1)[1]} holds the date {values[date]!r}; a time "
                          "column holds numbers or dates, not both")
    return both


def read_table(
    path: Path | str | pl.DataFrame,
    user_col: str,
    item_col: str,
    time_col: str | None = None,
    sep: str | None = None,
    time_format: str | None = None,
    extra_cols: Sequence[str] = (),
    name: str | None = None,
    kind: TableKind | None = None,
) -> RawDataset:
    """A CSV / TSV / Parquet / JSON-lines event log: of type `kind` when given, else the type the suffix names
    (CSV-like when `sep` is given); or a polars / pandas DataFrame holding the log (from Python)."""
    table = TableFile.of(path, sep, kind=kind)
    path = table.path
    if user_col == item_col:
        raise SeqrecError(f"{table.path}: the user and the item column are both {user_col!r}")
    extra = [c for c in extra_cols if c not in (user_col, item_col, time_col)]
    wanted = list(dict.fromkeys([user_col, item_col, *([time_col] if time_col else []), *extra]))
    available = table.columns()
    missing = [c for c in wanted if c not in available]
    if missing:
        raise SeqrecError(missing_columns(table, missing, available))
    text_cols = [user_col, item_col] + ([time_col] if time_col else [])
    raw = table.load(wanted, text_cols)
    for col, role in ((user_col, "user"), (item_col, "item")):
        nulls = empty_ids(raw[col])
        if nulls.len():
            raise SeqrecError(f"{table.row_label(int(nulls[0]))}: empty {role} id in column {col!r}")
    columns = {
        "user": id_strings(raw[user_col], table),
        "item": id_strings(raw[item_col], table),
        "timestamp": (
            to_epoch_seconds(raw[time_col], time_format, table)
            if time_col
            else pl.Series([None] * raw.height, dtype=pl.Float64)
        ),
    }
    for role in ("user", "item"):
        warn_null_like(columns[role], role, user_col if role == "user" else item_col, table)
    for col in extra:
        check_numbers(raw[col], col, table)
    frame = pl.DataFrame(columns).with_columns(raw.select(extra))
    log.debug("read %s: %d interactions", path, frame.height)
    return make_dataset(frame, None, name or path.stem, path)


def missing_columns(table: TableFile, missing: list[str], available: list[str]) -> str:
    """The message for columns a table lacks."""
    return (f"{table.path}: no column(s) {', '.join(map(repr, missing))}; available: "
            f"{', '.join(map(repr, available))}{separator_hint(table, available)}")


def separator_hint(table: TableFile, columns: list[str], flag: str = "--sep") -> str:
    """Where a CSV header was read as one column holding another separator: a note that names both, and the
    command-line option that sets it."""
    if table.kind != "csv" or len(columns) != 1:
        return ""
    others = [c for c in (",", "\t", ";", "|") if c in columns[0] and c != table.sep]
    if not others:
        return ""
    def shown(c: str | None) -> str:
        return "TAB" if c == "\t" else repr(c)
    return (f" (the header was read as one column: it is separated by {shown(others[0])}, not "
            f"{shown(table.sep)}; give it with {flag} {'tab' if others[0] == chr(9) else repr(others[0])}, "
            "or sep= from Python)")


def read_diginetica(path: Path, name: str | None = None) -> RawDataset:
    """DIGINETICA item views (`session_id;user_id;item_id;timeframe;eventdate`).

    user = session_id (the sample's user_id is mostly NA); timestamp = eventdate
    (a date, as epoch seconds) + timeframe / 1000 (a millisecond offset in the session).
    """
    path = Path(path)
    data = read_table(
        path,
        user_col="session_id",
        item_col="item_id",
        time_col="eventdate",
        sep=";",
        time_format="%Y-%m-%d",
        extra_cols=("timeframe",),
        name=name or path.stem,
    )
    frame = data.interactions.frame
    offset = frame["timeframe"].cast(pl.Float64, strict=False)
    bad = (offset.is_null()).arg_true()
    if bad.len():
        index = int(bad[0])
        raise SeqrecError(
            f"{path}, line {index + 2}: timeframe {frame['timeframe'][index]!r} is not a number"
        )
    frame = frame.with_columns((pl.col("timestamp") + offset / 1000.0).alias("timestamp"))
    return make_dataset(frame.drop("timeframe"), None, data.name, path)
