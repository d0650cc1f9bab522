"""What `seqrec tune` searches: each model's settings (`SPACES`), the base config's own point in that
space (the study's first trial), and how many trials run at a time when not told (`auto_jobs`)."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from seqrec.data.dataset import PreparedDataset


@dataclass(frozen=True)
class Param:
    """One searched setting: a categorical choice, or an int / float range (log-uniform when `log`)."""

    kind: Literal["categorical", "int", "float"]
    choices: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0
    log: bool = False

    def draw(self, trial: Any, name: str) -> Any:
        if self.kind == "categorical":
            return trial.suggest_categorical(name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(name, int(self.low), int(self.high))
        return trial.suggest_float(name, self.low, self.high, log=self.log)

    def holds(self, value: Any) -> bool:
        if self.kind == "categorical":
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return self.low <= value <= self.high and (self.kind == "float" or value == int(value))


Space = dict[str, Param]  # "section.key" -> what a trial draws


# weight averaging (train.ema, 0 = off): the hand-made SASRec recipes that validated best average their weights
EMA = Param("categorical", (0.0, 0.99, 0.997, 0.999))


def _transformer_space() -> Space:
    return {
        "model.d": Param("categorical", (32, 64, 128)),
        "model.n_layers": Param("int", low=1, high=3),
        "model.dropout": Param("float", low=0.1, high=0.6),
        "train.lr": Param("float", low=1e-4, high=3e-3, log=True),
        "train.weight_decay": Param("float", low=1e-6, high=0.3, log=True),
        "model.history_bias": Param("categorical", (False, True)),
        "model.norm_first": Param("categorical", (False, True)),
        "train.ema": EMA,
    }


SPACES: dict[str, Callable[[], Space]] = {
    "sasrec": _transformer_space,
    "bert4rec": lambda: {k: v for k, v in _transformer_space().items() if k != "model.history_bias"},
    "unisrec": lambda: {k: v for k, v in _transformer_space().items() if k != "model.d"},
    "gru4rec": lambda: {
        "model.d": Param("categorical", (32, 64, 128)),
        "model.dropout": Param("float", low=0.0, high=0.5),
        "train.lr": Param("float", low=1e-4, high=3e-3, log=True),
        "model.history_bias": Param("categorical", (False, True)),
        "train.ema": EMA,
    },
}


def get_setting(cfg: Any, dotted: str) -> Any:
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key, None)


def fits(values: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """Keep a sample valid: attention heads must divide d."""
    d = values.get("model.d", base.get("model", {}).get("d"))
    heads = base.get("model", {}).get("n_heads")
    if d is not None and heads and d % heads:
        values["model.n_heads"] = 1
    return values


def base_point(space: Space, base_cfg: Any, data: PreparedDataset) -> dict[str, Any]:
    """The base config's own value of each searched setting that the space can hold ("auto" ones decided
    from `data` as training would decide them); a setting outside its range is left out (the base trial keeps
    the base's value of it, undrawn)."""
    from seqrec.train.auto import resolve_auto

    decided = copy.deepcopy(base_cfg)
    resolve_auto(decided.model, data)
    point = {k: get_setting(decided, k) for k in space}
    return {k: v for k, v in point.items() if space[k].holds(v)}


def auto_jobs(threads: int, cores: int | None = None) -> tuple[int, str]:
    """How many trials run at a time when not told: as many as the cores hold at `train.threads` each; one
    when a trial takes torch's default (every core)."""
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if threads <= 0:
        return 1, f"train.threads is torch's default, every one of the {cores} cores: one trial at a time"
    jobs = max(1, cores // threads)
    return jobs, f"{cores} cores at train.threads={threads} each"
