"""Cold-item evaluation: targets never seen in training, reported apart from warm ones.

An item is *cold* for an evaluation split when it occurs in no training event
(no user's training prefix holds it, as input or as target), so an ID-based
model has never updated its vector. Two ways to get cold targets:

- `cold_mask(data)`: the cold items that a split already has (leave-one-out
  leaves some items only in validation or test);
- `cold_item_split(data, fraction, seed, dest)`: a new prepared dataset where a
  random `fraction` of the test-target items is removed from every training
  prefix (and from validation), so those targets are cold by construction.

`evaluate_cold_warm` ranks once and splits the ranks by the target's coldness.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from seqrec.config import EvalConfig
from seqrec.data.dataset import PreparedDataset, write_prepared
from seqrec.errors import SeqrecError
from seqrec.eval.evaluate import evaluate_ranks
from seqrec.eval.metrics import metrics_from_ranks
from seqrec.models.base import SequentialModel


def training_events(data: PreparedDataset) -> np.ndarray:
    """(E,) bool: the event is in its user's training prefix."""
    pos = np.arange(len(data.items)) - np.repeat(data.offsets[:-1], data.lengths)
    return pos < np.repeat(data.train_end(), data.lengths)


def cold_mask(data: PreparedDataset) -> np.ndarray:
    """(N+1,) bool: True for items that occur in no training event (index 0 is never cold)."""
    seen = np.zeros(data.n_items + 1, dtype=bool)
    seen[data.items[training_events(data)]] = True
    seen[0] = True
    return ~seen


def evaluate_cold_warm(model: SequentialModel, data: PreparedDataset, which: str, max_len: int,
                       cfg: EvalConfig, device: torch.device) -> dict[str, Any]:
    """Metrics over all, cold and warm targets of `which`, with their counts (`n_users` in each, and
    `n_cold`, `n_warm`); a kind with no target has only its count."""
    ranks = evaluate_ranks(model, data, which, max_len, cfg, device)
    users, pos = data.eval_positions(which)
    targets = data.items[data.offsets[users] + pos]
    cold = cold_mask(data)[targets]
    out: dict[str, Any] = {"n_cold": int(cold.sum()), "n_warm": int((~cold).sum())}
    for name, keep in (("all", np.ones_like(cold)), ("cold", cold), ("warm", ~cold)):
        out[name] = metrics_from_ranks(ranks[keep], cfg.ks) if keep.any() else {}
        out[name]["n_users"] = float(keep.sum())
    return out


def cold_item_split(data: PreparedDataset, fraction: float, seed: int, dest: Path,
                    name: str | None = None) -> PreparedDataset:
    """A copy of `data` (leave-one-out) whose randomly chosen `fraction` of test-target items never occur
    before a test target: their earlier events (training and validation) are removed. Users left with fewer
    than three events are dropped. Test targets themselves are kept, so every chosen item is a cold target.
    The copy is called `name` (default: the dataset's name + "-cold" + the percentage)."""
    if not 0 < fraction < 1:
        raise SeqrecError(f"cold fraction must be in (0, 1), got {fraction}")
    lengths = data.lengths
    if not np.array_equal(data.split, np.stack([lengths - 2, lengths - 1], axis=1)):  # a source's own split may be
        split = data.meta["options"].get("split", "?")
        raise SeqrecError(f"{data.path}: a cold-item split needs a leave-one-out dataset (each user's last event "
                          f"the test target, the one before it the validation target), not this {split} split "
                          "(prepare it with --split leave-one-out)")
    users, pos = data.eval_positions("test")
    test_flat = data.offsets[users] + pos
    candidates = np.unique(data.items[test_flat])
    rng = np.random.default_rng(seed)
    chosen = np.zeros(data.n_items + 1, dtype=bool)
    chosen[rng.choice(candidates, size=max(1, int(fraction * len(candidates))), replace=False)] = True
    is_test = np.zeros(len(data.items), dtype=bool)
    is_test[test_flat] = True
    keep = ~chosen[data.items] | is_test
    user_of = np.repeat(np.arange(data.n_users), data.lengths)
    lengths = np.bincount(user_of[keep], minlength=data.n_users)
    keep &= (lengths >= 3)[user_of]
    kept_users = np.flatnonzero(lengths >= 3)
    new_lengths = lengths[kept_users]
    offsets = np.concatenate([[0], np.cumsum(new_lengths)]).astype(np.int64)
    split = np.stack([new_lengths - 2, new_lengths - 1], axis=1).astype(np.int64)
    users_table = pl.read_parquet(data.path / "users.parquet").sort("idx")[kept_users.tolist()]
    users_table = users_table.with_columns(idx=pl.Series(np.arange(len(kept_users), dtype=np.int64)))
    return write_prepared(
        dest, name=name or f"{data.meta['name']}-cold{round(fraction * 100)}", source=str(data.path),
        items=data.items[keep], offsets=offsets, split=split,
        times=None if data.times is None else data.times[keep], item_table=data.item_table,
        users=users_table, events={},
        options={**data.meta["options"], "split": "leave-one-out, cold items", "cold_fraction": fraction,
                 "cold_seed": seed, "cold_items": int(chosen.sum())})
