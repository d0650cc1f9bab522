"""Generic table reader (CSV / TSV / Parquet) and the DIGINETICA session sample.

Columns are chosen by name. Times may be numeric (kept as Float64) or date /
datetime strings, parsed with `time_format` (strftime codes) or, by default, as
ISO 8601, and turned into epoch seconds (naive times are taken as UTC). User and
item ids are kept as strings exactly as written (CSV columns are read as text, so
"007" stays "007").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from seqrec.data.readers_io import make_dataset, require_file
from seqrec.data.types import RawDataset
from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)

_SEPARATORS = {".csv": ",", ".tsv": "\t", ".tab": "\t", ".txt": "\t"}
_PARQUET = (".parquet", ".pq")


def _separator(path: Path, sep: str | None) -> str | None:
    """The CSV separator, or None for Parquet."""
    suffix = path.suffix.lower()
    if suffix in _PARQUET:
        return None
    if sep is not None:
        if len(sep) != 1:
            raise SeqrecError(f"{path}: the separator must be one character, got {sep!r}")
        return sep
    if suffix not in _SEPARATORS:
        known = ", ".join([*_SEPARATORS, *_PARQUET])
        raise SeqrecError(
            f"{path}: unknown table type {suffix!r} (known: {known}; or pass a separator)"
        )
    return _SEPARATORS[suffix]


def _columns(path: Path, sep: str | None) -> list[str]:
    try:
        if sep is None:
            return list(pl.read_parquet_schema(path))
        return pl.read_csv(path, separator=sep, n_rows=0, infer_schema=False).columns
    except (pl.exceptions.PolarsError, OSError) as err:
        raise SeqrecError(f"{path}: cannot read the header ({str(err).splitlines()[0]})") from None


def _load(path: Path, sep: str | None, wanted: list[str], text_cols: list[str]) -> pl.DataFrame:
    """Only the wanted columns; `text_cols` are read from CSV as Utf8, others inferred."""
    try:
        if sep is None:
            return pl.read_parquet(path, columns=wanted)
        return pl.read_csv(
            path,
            separator=sep,
            columns=wanted,
            schema_overrides={c: pl.Utf8 for c in text_cols},
            infer_schema_length=None,
            null_values=[""],
        )
    except (pl.exceptions.PolarsError, OSError) as err:
        raise SeqrecError(f"{path}: cannot read ({str(err).splitlines()[0]})") from None


def _row_label(path: Path, sep: str | None, index: int) -> str:
    """Where row `index` (0-based data row) is: a CSV line (after the header) or a Parquet row."""
    return f"{path}, row {index + 1}" if sep is None else f"{path}, line {index + 2}"


def to_epoch_seconds(
    values: pl.Series, time_format: str | None, path: Path, sep: str | None
) -> pl.Series:
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
        raise SeqrecError(f"{path}: time column {values.name!r} has unsupported type {dtype}")
    bad = (out.is_null() & values.is_not_null()).arg_true()
    missing = values.is_null().arg_true()
    if bad.len() or missing.len():
        index = min([*bad.head(1).to_list(), *missing.head(1).to_list()])
        shown = values[index]
        hint = (
            f"format {time_format!r}" if time_format else "ISO 8601 or a number (pass time_format)"
        )
        raise SeqrecError(
            f"{_row_label(path, sep, index)}: time {values.name!r} value {shown!r} is not {hint}"
        )
    infinite = (~out.is_finite()).arg_true()
    if infinite.len():
        index = int(infinite[0])
        raise SeqrecError(f"{_row_label(path, sep, index)}: time {values.name!r} value {values[index]!r} "
                          "is not a finite number")
    check_time_range(out, path, values.name)
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
    """A CSV / TSV / Parquet event log; the type comes from the suffix unless `sep` is given."""
    path = require_file(Path(path), "table")
    separator = _separator(path, sep)
    extra = [c for c in extra_cols if c not in (user_col, item_col, time_col)]
    wanted = list(dict.fromkeys([user_col, item_col, *([time_col] if time_col else []), *extra]))
    available = _columns(path, separator)
    missing = [c for c in wanted if c not in available]
    if missing:
        listed = ", ".join(map(repr, missing))
        raise SeqrecError(f"{path}: no column(s) {listed}; available: {', '.join(available)}")
    text_cols = [user_col, item_col] + ([time_col] if time_col else [])
    raw = _load(path, separator, wanted, text_cols)
    for col, role in ((user_col, "user"), (item_col, "item")):
        nulls = raw[col].is_null().arg_true()
        if nulls.len():
            where = _row_label(path, separator, int(nulls[0]))
            raise SeqrecError(f"{where}: empty {role} id in column {col!r}")
    columns = {
        "user": raw[user_col].cast(pl.Utf8),
        "item": raw[item_col].cast(pl.Utf8),
        "timestamp": (
            to_epoch_seconds(raw[time_col], time_format, path, separator)
            if time_col
            else pl.Series([None] * raw.height, dtype=pl.Float64)
        ),
    }
    frame = pl.DataFrame(columns).with_columns(raw.select(extra))
    log.info("read %s: %d interactions", path, frame.height)
    return make_dataset(frame, None, name or path.stem, path)


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
