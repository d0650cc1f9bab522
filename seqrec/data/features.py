"""Side features: the schema, their raw values, and the statistics fitted on the training split.

A feature is declared by a `FeatureSpec` (in the `[features]` config section, or
inferred from the dataset and logged for confirmation):

    level  "item"   a column of the item table (ml-100k `categories`, `year`)
           "event"  a value per interaction: `gap` (seconds since the user's previous event,
                    log1p), `hour` (hour of day, UTC), or an extra log column such as `rating`
    kind   "categorical" | "multi_categorical" (values joined by `sep`) | "continuous"

Raw values are derived at load, never stored twice: event values come from the
prepared timestamps and `events.parquet`, item values from `items.parquet`.

Fitting (`fit_features`) reads training events only (validation and test
targets excluded): the categorical vocabulary (a value never seen in training
maps to the reserved unknown index), the mean and standard deviation of each
continuous feature after its transform, and the quantile edges of bucketised
ones. Item-level values are weighted by training events, so an item seen only in
test changes no statistic. The fitted state is plain JSON saved with the model.

Indices of categorical features: 0 = padding (no value), 1 = unknown or missing,
2.. = the training vocabulary. Missing continuous values are NaN and are
encoded by a learned "missing" vector (see `seqrec.nn.features`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import polars as pl

from seqrec.data.counts import train_event_mask
from seqrec.data.dataset import PreparedDataset
from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)

PAD, UNKNOWN = 0, 1  # reserved categorical indices; the vocabulary starts at 2
DERIVED_EVENTS = ("gap", "hour")  # event features computed from timestamps
TEXT_COLUMNS = ("title", "description")  # free text: never inferred as a feature


@dataclass
class FeatureSpec:
    name: str
    level: Literal["item", "event"]
    kind: Literal["categorical", "multi_categorical", "continuous"]
    encoding: Literal["auto", "soft_one_hot", "linear", "bucket", "embedding"] = "auto"  # auto: soft one-hot
    # for continuous features, embedding for categorical ones
    size: int = 20  # soft one-hot: P embeddings; bucket: number of buckets
    transform: Literal["none", "log1p"] = "none"  # applied to continuous values before normalisation
    sep: str = ", "  # multi_categorical separator in the item table
    max_values: int = 8  # multi_categorical: values kept per item

    def __post_init__(self) -> None:
        where = f"features.fields[{self.name}]"
        continuous = self.kind == "continuous"
        if self.encoding == "auto":
            self.encoding = "soft_one_hot" if continuous else "embedding"
        if continuous == (self.encoding == "embedding"):
            raise SeqrecError(f"{where}: continuous features take soft_one_hot, linear or bucket; "
                              f"categorical ones take embedding (got {self.kind}, {self.encoding})")
        if self.size < 2 or self.max_values < 1:
            raise SeqrecError(f"{where}: size must be >= 2 and max_values >= 1")
        if self.level == "event" and self.kind == "multi_categorical":
            raise SeqrecError(f"{where}: event-level features have one value per event")


@dataclass
class FittedFeature:
    """A spec plus what was learned from the training split (JSON-serialisable)."""

    spec: FeatureSpec
    vocab: list[str] = field(default_factory=list)  # categorical: index 2 + i <-> vocab[i]
    mean: float = 0.0
    std: float = 1.0
    edges: list[float] = field(default_factory=list)  # bucket: size - 1 inner quantile edges
    width: int = 1  # values per item (multi_categorical)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> FittedFeature:
        return cls(**{**obj, "spec": FeatureSpec(**obj["spec"])})


# ---------------------------------------------------------------------------------------------- raw values


def event_values(name: str, times: np.ndarray | None, starts: np.ndarray,
                 columns: dict[str, np.ndarray]) -> np.ndarray:
    """(E,) float64 raw value of event feature `name` for consecutive events; NaN = missing.

    `starts` (E,) bool marks the first event of each user (its gap is missing). The same
    function serves a prepared dataset and a single raw history at inference."""
    if name in DERIVED_EVENTS:
        if times is None:
            raise SeqrecError(f"event feature {name!r} needs timestamps, and this data has none")
        if name == "hour":
            return np.floor(np.mod(times, 86400.0) / 3600.0)
        gap = np.diff(times, prepend=np.nan)
        return np.where(starts, np.nan, gap)
    if name not in columns:
        raise SeqrecError(f"event feature {name!r}: no such column in the log (have {sorted(columns)})")
    return np.asarray(columns[name], dtype=np.float64)


def dataset_event_values(data: PreparedDataset, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Raw values of event features over every event of a prepared dataset."""
    if not names:
        return {}
    starts = np.zeros(len(data.items), dtype=bool)
    starts[data.offsets[:-1][data.lengths > 0]] = True
    path = data.path / "events.parquet"
    extra = [n for n in names if n not in DERIVED_EVENTS]
    columns: dict[str, np.ndarray] = {}
    if extra and path.exists():
        frame = pl.read_parquet(path)
        columns = {c: frame[c].cast(pl.Float64, strict=False).to_numpy() for c in extra if c in frame.columns}
    return {n: event_values(n, data.times, starts, columns) for n in names}


def _item_column(table: pl.DataFrame, spec: FeatureSpec) -> pl.Series:
    if spec.name not in table.columns:
        raise SeqrecError(f"item feature {spec.name!r}: no such item column (have {table.columns})")
    col = table.sort("idx")[spec.name]
    if spec.kind == "continuous":
        return col.cast(pl.Utf8).cast(pl.Float64, strict=False) if col.dtype == pl.Utf8 else col.cast(pl.Float64)
    return col.cast(pl.Utf8)


def _categories(values: pl.Series, spec: FeatureSpec) -> list[list[str]]:
    if spec.kind == "multi_categorical":
        split = values.str.split(spec.sep).list.eval(pl.element().str.strip_chars()).to_list()
        return [[v for v in row if v] if row else [] for row in split]
    return [[v] if v is not None else [] for v in values.to_list()]


# ---------------------------------------------------------------------------------------------- fitting


def _fit_continuous(fitted: FittedFeature, train_values: np.ndarray) -> None:
    spec = fitted.spec
    x = train_values[np.isfinite(train_values)]
    x = np.log1p(np.maximum(x, 0.0)) if spec.transform == "log1p" else x
    if len(x) == 0:
        raise SeqrecError(f"feature {spec.name!r} has no value in the training split")
    fitted.mean = float(x.mean())
    std = float(x.std())
    fitted.std = std if std > 1e-12 else 1.0  # a constant feature normalises to 0
    if spec.encoding == "bucket":
        fitted.edges = np.unique(np.quantile(x, np.linspace(0, 1, spec.size + 1)[1:-1])).tolist()


def _fit_categorical(fitted: FittedFeature, train_rows: list[list[str]]) -> None:
    vocab = sorted({v for row in train_rows for v in row})
    fitted.vocab = vocab
    fitted.width = max(1, min(fitted.spec.max_values, max((len(r) for r in train_rows), default=1)))


def fit_features(specs: Sequence[FeatureSpec], data: PreparedDataset) -> list[FittedFeature]:
    """Statistics of every feature from the training events of `data` only."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise SeqrecError(f"feature names must be unique, got {names}")
    train = train_event_mask(data)
    events = dataset_event_values(data, [s.name for s in specs if s.level == "event"])
    out = []
    for spec in specs:
        fitted = FittedFeature(spec)
        if spec.level == "event":
            values = events[spec.name][train]
            if spec.kind == "continuous":
                _fit_continuous(fitted, values)
            else:
                _fit_categorical(fitted, [[_num_key(v)] if np.isfinite(v) else [] for v in values])
        else:
            column = _item_column(data.item_table, spec)
            train_items = data.items[train].astype(np.int64) - 1  # events -> item rows (idx 1..N)
            if spec.kind == "continuous":
                _fit_continuous(fitted, column.to_numpy()[train_items])
            else:
                rows = _categories(column, spec)
                _fit_categorical(fitted, [rows[i] for i in np.unique(train_items)])
        out.append(fitted)
    return out


def _num_key(v: float) -> str:
    """The vocabulary key of a numeric categorical value (3.0 -> "3")."""
    return f"{v:g}"


# ---------------------------------------------------------------------------------------------- encoding


def categorical_index(fitted: FittedFeature, rows: list[list[str]]) -> np.ndarray:
    """(n, width) int64 indices: 0 pad, 1 unknown (also a row with no value), 2.. vocabulary."""
    lookup = {v: i + 2 for i, v in enumerate(fitted.vocab)}
    out = np.zeros((len(rows), fitted.width), dtype=np.int64)
    for r, row in enumerate(rows):  # one pass per item, at fit/load time only (not per event)
        idx = [lookup.get(v, UNKNOWN) for v in row[: fitted.width]] or [UNKNOWN]
        out[r, : len(idx)] = idx
    return out


def item_tables(fitted: Sequence[FittedFeature], item_table: pl.DataFrame) -> dict[str, np.ndarray]:
    """Per item-level feature, its value for every row 0..N+1 (0 = padding, N+1 = a masked/unknown item).

    Categorical: (N+2, width) indices; continuous: (N+2,) raw values (NaN = missing)."""
    out = {}
    for f in fitted:
        if f.spec.level != "item":
            continue
        column = _item_column(item_table, f.spec)
        if f.spec.kind == "continuous":
            out[f.spec.name] = np.concatenate([[np.nan], column.to_numpy(), [np.nan]])
        else:
            codes = categorical_index(f, _categories(column, f.spec))
            pad = np.zeros((1, f.width), dtype=np.int64)
            unknown = np.full((1, f.width), PAD, dtype=np.int64)
            unknown[0, 0] = UNKNOWN
            out[f.spec.name] = np.concatenate([pad, codes, unknown])
    return out


# ---------------------------------------------------------------------------------------------- inference


def infer_features(data: PreparedDataset, encoding: str = "soft_one_hot") -> list[FeatureSpec]:
    """A schema guessed from what the dataset holds; the caller shows it for confirmation."""
    enc: Any = encoding
    specs: list[FeatureSpec] = []
    if data.times is not None:
        specs.append(FeatureSpec("gap", "event", "continuous", enc, transform="log1p"))
        hours = event_values("hour", data.times, np.zeros(len(data.times), dtype=bool), {})
        if len(np.unique(hours)) > 1:  # dates without a time of day (diginetica) carry no hour
            specs.append(FeatureSpec("hour", "event", "categorical", "embedding"))
    path = data.path / "events.parquet"
    if path.exists():
        frame = pl.read_parquet(path)
        specs += [FeatureSpec(c, "event", "continuous", enc) for c in frame.columns
                  if frame[c].dtype.is_numeric()]
    table = data.item_table
    for col in table.columns:
        if col in ("idx", "item", *TEXT_COLUMNS):
            continue
        values = table[col]
        if values.dtype.is_numeric() or values.cast(pl.Float64, strict=False).null_count() == values.null_count():
            specs.append(FeatureSpec(col, "item", "continuous", enc))
        elif values.cast(pl.Utf8).str.contains(", ").any():
            specs.append(FeatureSpec(col, "item", "multi_categorical", "embedding"))
        elif values.n_unique() <= max(2, table.height // 2):
            specs.append(FeatureSpec(col, "item", "categorical", "embedding"))
    return specs


def describe(specs: Sequence[FeatureSpec]) -> str:
    """The schema as the TOML that declares it."""
    lines = []
    for s in specs:
        lines += ["[[features.fields]]", f'name = "{s.name}"', f'level = "{s.level}"', f'kind = "{s.kind}"',
                  f'encoding = "{s.encoding}"']
        if s.transform != "none":
            lines.append(f'transform = "{s.transform}"')
        if s.encoding in ("soft_one_hot", "bucket"):
            lines.append(f"size = {s.size}")
        if s.kind == "multi_categorical":
            lines += [f'sep = "{s.sep}"', f"max_values = {s.max_values}"]
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- config


@dataclass
class FeaturesConfig:
    """The `[features]` config section."""

    fields: list[FeatureSpec] = field(default_factory=list)
    infer: bool = False  # no fields given: infer a schema from the dataset (logged as TOML)
    encoding: Literal["soft_one_hot", "linear", "bucket"] = "soft_one_hot"  # of inferred continuous fields
    fusion: Literal["sum", "concat"] = "sum"

    def __post_init__(self) -> None:
        self.fields = [FeatureSpec(**f) if isinstance(f, dict) else f for f in self.fields]


@dataclass
class FeatureInputs:
    """What a model's feature block is built from: fitted fields, fusion, and per-item value tables
    (absent when loading a checkpoint, whose buffers hold them)."""

    fields: list[FittedFeature]
    fusion: str = "sum"
    tables: dict[str, np.ndarray] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"fusion": self.fusion, "fields": [f.to_json() for f in self.fields]}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> FeatureInputs:
        return cls([FittedFeature.from_json(f) for f in obj["fields"]], obj["fusion"])


def feature_inputs(cfg: FeaturesConfig, data: PreparedDataset) -> FeatureInputs | None:
    """Fit the configured (or inferred) schema on `data`'s training split; None when there is none."""
    specs = cfg.fields
    if not specs and cfg.infer:
        specs = infer_features(data, cfg.encoding)
        log.info("inferred feature schema for %s (put it in [features] to change it):\n%s",
                 data.meta["name"], describe(specs))
    if not specs:
        return None
    fitted = fit_features(specs, data)
    return FeatureInputs(fitted, cfg.fusion, item_tables(fitted, data.item_table))
