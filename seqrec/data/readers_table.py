"""Generic table reader (CSV / TSV / Parquet / JSON lines) and the DIGINETICA session sample.

Columns are chosen by name. Times may be numeric (kept as Float64) or date /
datetime strings, parsed with `time_format` (strftime codes) or, by default, as
ISO 8601, and turned into epoch seconds (naive times are taken as UTC). User and
item ids are kept as strings exactly as written (CSV columns are read as text, so
"007" stays "007").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import polars as pl

from seqrec.data.readers_io import make_dataset, require_file
from seqrec.data.types import RawDataset
from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)

_SEPARATORS = {".csv": ",", ".tsv": "\t", ".tab": "\t", ".txt": "\t"}
_PARQUET = (".parquet", ".pq")
_JSONL = (".jsonl", ".ndjson")


@dataclass(frozen=True)
class TableFile:
    """A table on disk: CSV / TSV (`sep` set), Parquet or JSON lines (one object per line)."""

    path: Path
    kind: Literal["csv", "parquet", "jsonl"]
    sep: str | None = None

    @classmethod
    def of(cls, path: Path, sep: str | None = None, what: str = "table") -> TableFile:
        """The type comes from the suffix, unless a separator is given (then it is CSV-like)."""
        path = require_file(Path(path), what)
        suffix = path.suffix.lower()
        if suffix in _PARQUET:
            return cls(path, "parquet")
        if suffix in _JSONL:
            return cls(path, "jsonl")
        if sep is not None:
            if len(sep) != 1:
                raise SeqrecError(f"{path}: the separator must be one character, got {sep!r}")
            return cls(path, "csv", sep)
        if suffix not in _SEPARATORS:
            known = ", ".join([*_SEPARATORS, *_PARQUET, *_JSONL])
            raise SeqrecError(f"{path}: unknown table type {suffix!r} (known: {known}; or pass a separator)")
        return cls(path, "csv", _SEPARATORS[suffix])

    def columns(self) -> list[str]:
        try:
            if self.kind == "parquet":
                return list(pl.read_parquet_schema(self.path))
            if self.kind == "jsonl":
                return self._jsonl().columns
            return pl.read_csv(self.path, separator=self.sep or ",", n_rows=0, infer_schema=False).columns
        except (pl.exceptions.PolarsError, OSError) as err:
            raise SeqrecError(f"{self.path}: cannot read the header ({_first_line(err)})") from None

    def load(self, wanted: list[str], text_cols: Sequence[str] = ()) -> pl.DataFrame:
        """Only the wanted columns; `text_cols` are read from CSV as Utf8, others inferred."""
        try:
            if self.kind == "parquet":
                return pl.read_parquet(self.path, columns=wanted)
            if self.kind == "jsonl":
                return self._jsonl().select(wanted)
            return pl.read_csv(self.path, separator=self.sep or ",", columns=wanted,
                               schema_overrides={c: pl.Utf8 for c in text_cols},
                               infer_schema_length=None, null_values=[""])
        except (pl.exceptions.PolarsError, OSError) as err:
            raise SeqrecError(f"{self.path}: cannot read ({_first_line(err)})") from None

    def _jsonl(self) -> pl.DataFrame:
        """Every line an object; fields missing from a line are null."""
        return pl.read_ndjson(self.path, infer_schema_length=None)

    def row_label(self, index: int) -> str:
        """Where data row `index` (0-based) is: a line of the file (after a CSV header) or a Parquet row."""
        if self.kind == "parquet":
            return f"{self.path}, row {index + 1}"
        return f"{self.path}, line {index + (2 if self.kind == 'csv' else 1)}"


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


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
        numeric = None if time_format is not None else text.cast(pl.Float64, strict=False)
        if numeric is not None and numeric.null_count() == values.null_count():
            out = numeric  # plain numbers
        elif numeric is not None:
            try:
                out = text.str.to_datetime(time_unit="us", strict=False).dt.epoch("us").cast(pl.Float64) / 1e6
            except pl.exceptions.ComputeError:  # no ISO 8601 layout fits: the values that are not numbers are bad
                out = numeric
        else:
            parsed = text.str.strptime(pl.Datetime("us"), time_format, strict=False)
            out = parsed.dt.epoch("us").cast(pl.Float64) / 1e6
    else:
        raise SeqrecError(f"{table.path}: time column {values.name!r} has unsupported type {dtype}")
    bad = (out.is_null() & values.is_not_null()).arg_true()
    missing = values.is_null().arg_true()
    if bad.len() or missing.len():
        index = min([*bad.head(1).to_list(), *missing.head(1).to_list()])
        shown = values[index]
        hint = (
            f"format {time_format!r}" if time_format else "ISO 8601 or a number (pass time_format)"
        )
        raise SeqrecError(
            f"{table.row_label(index)}: time {values.name!r} value {shown!r} is not {hint}"
        )
    infinite = (~out.is_finite()).arg_true()
    if infinite.len():
        index = int(infinite[0])
        raise SeqrecError(f"{table.row_label(index)}: time {values.name!r} value {values[index]!r} "
                          "is not a finite number")
    check_time_range(out, table.path, values.name)
    return out


# Finite times are kept as they are: they order each user's events, whatever their unit. Only the
# time features (gap, hour of day) read them as seconds, so values outside the plausible range of
# epoch seconds are accepted with a warning that names the file and the range seen.
PLAUSIBLE_SECONDS = (0.0, 1e11)  # 1970 .. about year 5100; milliseconds since 1970 are above it


def check_time_range(seconds: pl.Series, path: Path, column: str) -> None:
    lo, hi = seconds.min(), seconds.max()
    if lo is None or hi is None:
        return
    if float(lo) < PLAUSIBLE_SECONDS[0] or float(hi) > PLAUSIBLE_SECONDS[1]:  # type: ignore[arg-type]
        log.warning("%s: time %r runs from %g to %g, outside epoch seconds (%g..%g); events are ordered by it "
                    "as given, but time features (gap, hour) would read it as seconds", path, column, lo, hi,
                    *PLAUSIBLE_SECONDS)


def read_table(
    path: Path,
    user_col: str,
    item_col: str,
    time_col: str | None = None,
    sep: str | None = None,
    time_format: str | None = None,
    extra_cols: Sequence[str] = (),
    name: str | None = None,
) -> RawDataset:
    """A CSV / TSV / Parquet / JSON-lines event log; the type comes from the suffix unless `sep` is given."""
    table = TableFile.of(Path(path), sep)
    path = table.path
    extra = [c for c in extra_cols if c not in (user_col, item_col, time_col)]
    wanted = list(dict.fromkeys([user_col, item_col, *([time_col] if time_col else []), *extra]))
    available = table.columns()
    missing = [c for c in wanted if c not in available]
    if missing:
        listed = ", ".join(map(repr, missing))
        raise SeqrecError(f"{path}: no column(s) {listed}; available: {', '.join(available)}")
    text_cols = [user_col, item_col] + ([time_col] if time_col else [])
    raw = table.load(wanted, text_cols)
    for col, role in ((user_col, "user"), (item_col, "item")):
        nulls = raw[col].is_null().arg_true()
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
    frame = pl.DataFrame(columns).with_columns(raw.select(extra))
    log.info("read %s: %d interactions", path, frame.height)
    return make_dataset(frame, None, name or path.stem, path)


def id_strings(values: pl.Series, table: TableFile) -> pl.Series:
    """Ids as strings exactly as written; JSON / Parquet numbers as integers when they are whole."""
    dtype = values.dtype
    if dtype.is_float():
        whole = values.is_null() | (values == values.floor())
        if whole.all():
            values = values.cast(pl.Int64)
    elif not (dtype.is_integer() or dtype == pl.Utf8):
        raise SeqrecError(f"{table.path}: id column {values.name!r} holds {dtype} values, not ids")
    return values.cast(pl.Utf8)


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
