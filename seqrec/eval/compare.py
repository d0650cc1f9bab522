"""Runs side by side: `seqrec compare RUN [RUN ...]`.

Runs whose configs are the same but for the seed (`train.seed`, and settings that change how a run is
computed, not what: `train.progress`, `train.threads`), and that started from the same weights (a
fine-tuning's pre-trained run and what it took of it, `init_items_from`), form one group; each group's
metrics are the mean and the sample standard deviation over its runs. Runs evaluated under different
protocols (another dataset by fingerprint, split, cutoffs, seen-item filtering) are never put in one
group: the protocol is part of the key, and a group's label names the settings in which they differ."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqrec.errors import SeqrecError

# settings that do not change what a run computes, or that a group takes several of
NOT_IN_KEY = ("train.seed", "train.progress", "train.threads", "data.dataset")
PROTOCOL_KEYS = ("dataset_fingerprint", "split", "ks", "filter_seen", "max_len", "training_users")


@dataclass
class Group:
    """Runs that differ only in their seed."""

    settings: dict[str, Any]  # the flattened config (less NOT_IN_KEY) and protocol of every run in it
    runs: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)  # "test ndcg@10" -> one value per run

    def mean(self, name: str) -> float:
        return statistics.fmean(self.metrics[name])

    def std(self, name: str) -> float | None:
        """Sample standard deviation (None for a single run: it has none)."""
        values = self.metrics[name]
        return statistics.stdev(values) if len(values) > 1 else None


def _flat(config: dict[str, Any]) -> dict[str, Any]:
    return {f"{section}.{key}": json.dumps(value, sort_keys=True) for section, values in config.items()
            if isinstance(values, dict) for key, value in values.items()}


def _read(run: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    for name in ("config.json", "results.json"):
        if not (run / name).is_file():
            raise SeqrecError(f"{run}: no {name} (not a finished run: `seqrec train` writes both)")
    try:
        return json.loads((run / "config.json").read_text()), json.loads((run / "results.json").read_text())
    except ValueError as exc:
        raise SeqrecError(f"{run}: a damaged config.json or results.json ({exc})") from None


def compare_runs(runs: Sequence[Path | str]) -> tuple[list[Group], list[str]]:
    """The runs grouped by everything but their seed -> (groups in the order of their first run, the
    setting keys in which the groups differ: what names a group)."""
    if isinstance(runs, (str, Path)):
        raise SeqrecError(f"give a list of run folders to compare, not one: [{str(runs)!r}, ...]")
    if not runs:
        raise SeqrecError("give the run folders to compare")
    groups: dict[str, Group] = {}
    for run in map(Path, runs):
        config, results = _read(run)
        protocol = results.get("protocol", {})
        settings = {k: v for k, v in _flat(config).items() if k not in NOT_IN_KEY}
        settings.update({f"protocol.{k}": json.dumps(protocol.get(k), sort_keys=True) for k in PROTOCOL_KEYS})
        settings["protocol.history_bias"] = json.dumps(protocol.get("history_bias"))
        for key in ("origin", "init_items_from"):  # where its weights came from: a pre-trained run, how much of it
            settings[key] = json.dumps(results.get(key), sort_keys=True)
        key = json.dumps(settings, sort_keys=True)
        group = groups.setdefault(key, Group(settings))
        group.runs.append(str(run))
        group.seeds.append(int(config.get("train", {}).get("seed", 0)))
        for split in ("valid", "test"):
            for name, value in results.get(split, {}).items():
                if name != "n_users":
                    group.metrics.setdefault(f"{split} {name}", []).append(float(value))
    found = list(groups.values())
    for group in found:
        lengths = {len(v) for v in group.metrics.values()}
        if len(lengths) > 1:  # a run without test metrics (a tuner's trial) beside ones with them
            raise SeqrecError(f"{', '.join(group.runs)}: the runs do not all hold the same metrics (some were never "
                              "tested?)")
    keys = sorted({k for g in found for k in g.settings})
    differ = [k for k in keys if len({g.settings.get(k) for g in found}) > 1]
    return found, differ


LABEL_PARTS = 4  # a group's label names at most this many settings; `differences` holds them all


def differences(group: Group, differ: Sequence[str]) -> dict[str, Any]:
    """The settings that set a group apart from the others and that it has (model.name first: a setting
    of another model's alone is not one), as their values."""
    keys = sorted((k for k in differ if k in group.settings), key=lambda k: k != "model.name")
    return {k: json.loads(group.settings[k]) for k in keys}


def label(group: Group, differ: Sequence[str]) -> str:
    """What sets a group apart from the others, as key=value, the first LABEL_PARTS of them (its first run's
    folder name when nothing does)."""
    parts = [f"{k}={v}" for k, v in differences(group, differ).items()]
    more = f" (+{len(parts) - LABEL_PARTS} more)" if len(parts) > LABEL_PARTS else ""
    return ", ".join(parts[:LABEL_PARTS]) + more if parts else Path(group.runs[0]).name
