"""Typed configuration: one dataclass per concern, TOML files, dotted overrides.

A run config has the sections `[data]`, `[model]`, `[train]`, `[eval]` and the
optional `[features]` (side features, see `seqrec.data.features`); the
`[model]` section's `name` picks the model's own config class from the
registry. Every key is checked against the dataclass fields: an unknown key or
a value of the wrong type is a `SeqrecError` naming it.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from seqrec.data.features import FeaturesConfig
from seqrec.errors import SeqrecError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass
class DataConfig:
    """`[data]`: which prepared dataset, how much history, how training windows are cut."""

    dataset: str = ""  # a prepared-dataset folder, or a name under $SEQREC_HOME/prepared
    max_len: int = 50  # items of history the model sees
    # training windows: targets per window (0 = max_len, consecutive windows; smaller overlaps); "auto":
    # overlapping windows when histories run past max_len (seqrec.train.auto)
    stride: int | Literal["auto"] = "auto"
    # draw the window boundaries afresh each epoch (seqrec.data.batching.TrainBatches); "auto": when windows overlap
    jitter: bool | Literal["auto"] = "auto"
    train_fraction: float = 1.0  # learn from the training events of this share of the users (seeded); all are evaluated
    train_fraction_seed: int = 0  # which users data.train_fraction samples

    def __post_init__(self) -> None:
        if self.max_len < 1:
            raise SeqrecError(f"data.max_len must be >= 1, got {self.max_len}")
        if not 0 < self.train_fraction <= 1:
            raise SeqrecError(f"data.train_fraction must be in (0, 1], got {self.train_fraction}")
        if self.stride != "auto" and not 0 <= self.stride <= self.max_len:
            raise SeqrecError(f"data.stride must be in [0, max_len={self.max_len}], got {self.stride}")


@dataclass
class TrainConfig:
    """`[train]`: optimiser, epochs and early stopping, refit, weight averaging, device."""

    epochs: int = 200  # at most this many epochs (early stopping and time_budget_s end sooner)
    # "auto": 128, smaller only when a step would not fit the device's free memory (seqrec.train.auto)
    batch_size: int | Literal["auto"] = "auto"
    lr: float = 1e-3  # the optimiser's learning rate
    optimizer: Literal["adam", "adamw"] = "adam"  # adamw: decoupled weight decay
    weight_decay: float = 0.0  # L2 (adam) or decoupled (adamw) decay
    clip_grad: float = 5.0  # max gradient norm; 0 disables clipping
    patience: int = 10  # epochs without a better validation NDCG@10 before stopping
    bf16: bool = False  # bf16 autocast (CPU and CUDA)
    seed: int = 42  # weights, batches, dropout: the same seed gives the same run
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:1", ...
    threads: int = 0  # torch CPU threads; 0 leaves torch's default
    eval_every: int = 1  # validate every this many epochs (patience counts validations)
    progress: bool = True  # progress bars, on a terminal (not when the output goes to a file or pipe)
    time_budget_s: float = 0.0  # stop after this much training time, inside an epoch if need be; 0 = no limit
    refit: bool = False  # after choosing the epoch count on validation, retrain on train + valid events and test that
    ema: float = 0.0  # decay of an average of the weights, updated every step, that is validated and tested; 0 = off
    # sparse gradients for the item tables, only touched rows updated (seqrec.train.sparse); "auto": with a sampled
    # loss over a large catalogue (seqrec.train.auto)
    sparse_items: bool | Literal["auto"] = "auto"
    # fine-tuning a pre-trained model: the weights a x fine-tuned + (1 - a) x pre-trained are validated for each a
    # here and kept when one beats both ends (weight-space ensembling, WiSE-FT; seqrec.train.transfer); [] = off
    interpolate: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75])

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_every"):
            if getattr(self, name) != "auto" and getattr(self, name) < 1:
                raise SeqrecError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise SeqrecError(f"train.lr must be > 0, got {self.lr}")
        if not 0 <= self.ema < 1:
            raise SeqrecError(f"train.ema must be in [0, 1) (0 = off), got {self.ema}")
        if any(not 0 < a < 1 for a in self.interpolate):
            raise SeqrecError(f"train.interpolate: each weight of the fine-tuned model must be in (0, 1) (the ends "
                              f"are always candidates), got {self.interpolate}")
        self.interpolate = sorted(set(self.interpolate))


@dataclass
class EvalConfig:
    """`[eval]`: cut-offs K, whether seen items are filtered, batch and memory budget."""

    ks: list[int] = field(default_factory=lambda: [10, 50])  # the cutoffs K of Recall/NDCG/MRR@K
    filter_seen: bool = False  # remove already-seen items from the ranking (off: honest default)
    batch_size: int = 1024  # users encoded at once
    budget: int = 1 << 25  # scores held in memory at once while ranking

    def __post_init__(self) -> None:
        if not self.ks or any(k < 1 for k in self.ks):
            raise SeqrecError(f"eval.ks must be positive integers, got {self.ks}")
        self.ks = sorted(set(self.ks))


@dataclass
class RunConfig:
    """A whole run: `[data]`, `[model]` (the model's own config), `[train]`, `[eval]`, `[features]`."""

    data: DataConfig
    model: Any  # the model's own config dataclass (has a `name` field)
    train: TrainConfig
    eval: EvalConfig
    features: FeaturesConfig = field(default_factory=FeaturesConfig)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (what a run writes to config.json)."""
        return {
            "data": dataclasses.asdict(self.data),
            "model": dataclasses.asdict(self.model),
            "train": dataclasses.asdict(self.train),
            "eval": dataclasses.asdict(self.eval),
            "features": dataclasses.asdict(self.features),
        }


def _check_value(value: Any, tp: Any, where: str) -> Any:
    """Return `value` coerced to the annotation `tp`, or raise naming `where`."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise SeqrecError(f"{where}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_value(value, arg, where)
            except SeqrecError:
                continue
        raise SeqrecError(f"{where}: {value!r} does not fit {tp}")
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, list | tuple):
            raise SeqrecError(f"{where}: expected a list, got {value!r}")
        return [_check_value(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise SeqrecError(f"{where}: expected a table, got {value!r}")
        return build(tp, value, where)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool):
        if isinstance(value, bool) != (tp is bool) or not isinstance(value, tp):
            raise SeqrecError(f"{where}: expected {tp.__name__}, got {value!r}")
        return value
    raise TypeError(f"unsupported config annotation {tp} at {where}")


# Ranges of numeric settings, by field name, whichever config class holds them: a value outside
# is a one-line error naming it (before any tensor is built with it).
AT_LEAST_ONE = {"d", "d_ff", "n_layers", "n_heads", "n_experts", "n_negatives", "text_dim", "text_max_length",
                "window", "max_len", "epochs", "batch_size", "eval_every", "patience", "budget"}
NON_NEGATIVE = {"shared_negatives", "subsample", "weight_decay", "clip_grad", "time_budget_s", "stride", "threads",
                "seed", "train_fraction_seed"}  # numpy's generators take no negative seed
POSITIVE = {"temperature", "init_std", "lr"}
PROBABILITY = {"mask_prob", "last_mask_share", "gbce_t", "recency"}


def check_ranges(values: dict[str, Any], section: str) -> None:
    """Raise a `SeqrecError` naming the first numeric setting outside its range."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        where = f"{section}.{name}"
        if v != v or v in (float("inf"), float("-inf")):
            raise SeqrecError(f"{where} must be a finite number, got {v}")
        if name in AT_LEAST_ONE and v < 1:
            raise SeqrecError(f"{where} must be >= 1, got {v}")
        if name in NON_NEGATIVE and v < 0:
            raise SeqrecError(f"{where} must be >= 0, got {v}")
        if name in POSITIVE and v <= 0:
            raise SeqrecError(f"{where} must be > 0, got {v}")
        if name in PROBABILITY and not 0 <= v <= 1:
            raise SeqrecError(f"{where} must be in [0, 1], got {v}")
        if (name.endswith("dropout") or name.endswith("_drop")) and not 0 <= v < 1:
            raise SeqrecError(f"{where} must be in [0, 1), got {v}")


def build(cls: type, values: dict[str, Any], section: str) -> Any:
    """Instantiate dataclass `cls` from `values`, rejecting unknown keys, wrong types and values out of range."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise SeqrecError(
            f"unknown config key(s) {[f'{section}.{k}' for k in unknown]}; "
            f"valid keys in [{section}]: {', '.join(names)}"
        )
    kwargs = {k: _check_value(v, hints[k], f"{section}.{k}") for k, v in values.items()}
    check_ranges(kwargs, section)
    return cls(**kwargs)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`model.d=128` -> (["model", "d"], 128); the value is read as TOML, else as a string."""
    if "=" not in text:
        raise SeqrecError(f"override {text!r} must look like section.key=value")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if len(path) != 2 or not all(path):
        raise SeqrecError(f"override key {key!r} must look like section.key")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return path, value


def load_toml(path: Path | str) -> dict[str, Any]:
    """A TOML file as a dict; a missing or malformed file is a one-line error naming it."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise SeqrecError(f"config file not found: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SeqrecError(f"{path}: invalid TOML: {exc}") from None
    except OSError as exc:  # a folder, no permission, ...
        raise SeqrecError(f"{path}: cannot read the config file ({exc.strerror})") from None


def with_model_train_defaults(model_cls: type, given: dict[str, Any]) -> dict[str, Any]:
    """`given` (a `[train]` table) over the model's own training defaults: the `TRAIN_DEFAULTS` of its
    config class, groups of settings that go together (an optimiser and its weight decay), each applied
    only when the table sets none of its keys to another value, so that `optimizer = "adam"` never
    inherits the decay chosen for AdamW (while `optimizer = "adamw"`, the group's own, keeps it)."""
    merged: dict[str, Any] = {}
    for group in getattr(model_cls, "TRAIN_DEFAULTS", ()):
        if all(given.get(key, value) == value for key, value in group.items()):
            merged.update(group)
    return {**merged, **given}


def saved_config(path: Path, overrides: Sequence[str] = ()) -> RunConfig:
    """A run's config.json, resolved as the run trained with it (`resolve(..., model_defaults=False)`)."""
    from seqrec.data.io import read_json

    raw = read_json(path)
    if not isinstance(raw, dict):
        raise SeqrecError(f"{path}: not a run config (expected a JSON object)")
    if isinstance(raw.get("train"), dict):  # saved before the key existed: what that run trained with
        raw["train"].setdefault("sparse_items", False)
    return resolve(raw, overrides, model_defaults=False)


def resolve(raw: dict[str, Any], overrides: Sequence[str] = (), model_defaults: bool = True) -> RunConfig:
    """Merge dotted overrides into a raw TOML dict and build the typed RunConfig. `model_defaults=False`
    for a run's saved config: a key it lacks (written before the key existed) takes the plain `[train]`
    default, as the run did, not a model's training default added since."""
    from seqrec.registry import model_config_class

    if not isinstance(raw, dict):
        raise SeqrecError(f"a config is a table of sections, got {raw!r}")
    if isinstance(overrides, str):
        raise SeqrecError(f"overrides are a list of section.key=value strings: give [{overrides!r}]")
    sections = ("data", "model", "train", "eval", "features")
    not_tables = [k for k, v in raw.items() if k in sections and not isinstance(v, dict)]
    if not_tables:
        raise SeqrecError(f"config section [{not_tables[0]}] must be a table, got {raw[not_tables[0]]!r}")
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for text in overrides:
        (section, key), value = parse_override(text)
        raw.setdefault(section, {})[key] = value
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise SeqrecError(f"unknown config section(s) {unknown}; valid: data, model, train, eval, features")
    model_raw = dict(raw.get("model", {}))
    name = model_raw.get("name", "sasrec")
    model_raw["name"] = name
    model_cls = model_config_class(name)
    return RunConfig(
        data=build(DataConfig, raw.get("data", {}), "data"),
        model=build(model_cls, model_raw, "model"),
        train=build(TrainConfig, with_model_train_defaults(model_cls, raw.get("train", {})) if model_defaults
                    else raw.get("train", {}), "train"),
        eval=build(EvalConfig, raw.get("eval", {}), "eval"),
        features=build(FeaturesConfig, raw.get("features", {}), "features"),
    )
