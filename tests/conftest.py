"""Shared fixtures: a tiny generated dataset with learnable structure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from seqrec.data.dataset import PreparedDataset
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.data.types import Interactions, ItemTable, RawDataset

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

# Tiny tensors gain nothing from intra-op threads, and on a shared machine they lose a lot to
# oversubscription (a 40x slowdown measured on a loaded 2-core box).
torch.set_num_threads(1)


def synthetic_log(n_users: int = 60, n_items: int = 30, seed: int = 0) -> RawDataset:
    """Users walk the catalogue in steps of +1 (mod n) from a random start: the next item is learnable."""
    rng = np.random.default_rng(seed)
    users, items, times = [], [], []
    for u in range(n_users):
        start, length = rng.integers(n_items), rng.integers(5, 15)
        for t in range(length):
            users.append(f"u{u}")
            items.append(f"i{(start + t) % n_items}")
            times.append(float(1000 * u + t))
    frame = pl.DataFrame({"user": users, "item": items, "timestamp": times})
    table = pl.DataFrame({"item": [f"i{i}" for i in range(n_items)],
                          "title": [f"Item number {i}" for i in range(n_items)]})
    return RawDataset(Interactions(frame, "synthetic"), ItemTable(table, "synthetic"), "synthetic")


@pytest.fixture
def tiny_dataset(tmp_path: Path) -> PreparedDataset:
    return prepare(synthetic_log(), PrepareOptions(), tmp_path / "prepared" / "synthetic")
