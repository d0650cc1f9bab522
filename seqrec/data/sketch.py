"""A small, stable sample of a dataset's (user, item) events by their raw ids, to tell whether two prepared
datasets hold the same events whatever options prepared them (k-core, dedupe, split, id order).

    h(e)   = mix(blake2b(raw user), blake2b(raw item))            64 bits, the same on any machine
    sketch = the K smallest distinct h(e) of the dataset          (a bottom-K sample of its events)

Two sketches estimate how much of one dataset's events the other holds (`contained`): of A's
sampled hashes below B's largest (the range in which B's sketch holds every hash B has), the share
that B's sketch holds. A pre-training run's data card keeps its domains' sketches, so that a zero-shot
use refuses a target re-prepared from a domain it learnt from (a new fingerprint, the same events).
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl

from seqrec.data.dataset import PreparedDataset

K = 512  # hashes kept: a share estimated from a few hundred samples is good to about +-0.05
MIN_SAMPLES = 20  # fewer hashes in the common range than this: no estimate (datasets of very unequal sizes)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _hashes(raw: list[str]) -> np.ndarray:
    return np.array([int.from_bytes(hashlib.blake2b(r.encode(), digest_size=8).digest(), "little") for r in raw],
                    dtype=np.uint64)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every bit of the input moves every bit of the output."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def events_sketch(data: PreparedDataset, k: int = K) -> list[str]:
    """The `k` smallest distinct event hashes of `data` (every event, any split), as hex strings."""
    users = pl.read_parquet(data.path / "users.parquet").sort("idx")["user"].cast(pl.Utf8).to_list()
    items = ["", *data.item_table.sort("idx")["item"].cast(pl.Utf8).to_list()]  # row 0: padding
    user_of_event = np.repeat(np.arange(data.n_users), data.lengths)
    with np.errstate(over="ignore"):
        h = _mix(_hashes(users)[user_of_event] * _GOLDEN ^ _hashes(items)[data.items])
    return [f"{v:016x}" for v in np.unique(h)[:k]]


def contained(a: list[str], b: list[str]) -> float | None:
    """About what share of the events sketched by `a` the dataset sketched by `b` holds; None where the two
    sketches share too small a range to say (`MIN_SAMPLES`)."""
    if not a or not b:
        return None
    top = max(b) if len(b) >= K else "g"  # a sketch of fewer than K hashes is every hash of its dataset
    below = [x for x in a if x <= top]
    if len(below) < MIN_SAMPLES:
        return None
    held = set(b)
    return sum(x in held for x in below) / len(below)
