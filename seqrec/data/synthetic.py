"""Generated interaction logs with the shape of real ones, for cost curves and load tests.

    item popularity   Zipf: P(item of rank r) ∝ r^-zipf_s over `n_items` (rank 1 most popular)
    history lengths   log-normal in shape (`length_sigma`: larger, a longer tail), scaled so that they
                      sum to `n_interactions`, each in [min_len, max_len]
    order             each user's events one `gap_s`-scale exponential gap apart, from a random start;
                      with probability `repeat_p` an event returns to an item the user had

Nothing here is learnable on purpose beyond popularity: the log is for measuring cost, not quality.
`generate_log(...)` returns the polars frame (user, item as strings; timestamp as float seconds);
`RawDataset` wrapping is `generated_dataset(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from seqrec.data.types import Interactions, RawDataset
from seqrec.errors import SeqrecError


@dataclass(frozen=True)
class LogShape:
    n_interactions: int
    n_users: int
    n_items: int
    zipf_s: float = 1.05
    length_sigma: float = 1.0
    min_len: int = 3
    max_len: int = 5000
    repeat_p: float = 0.0
    gap_s: float = 3600.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_users < 1 or self.n_items < 2:
            raise SeqrecError("a generated log needs at least one user and two items")
        if self.n_interactions < self.n_users * self.min_len:
            raise SeqrecError(f"{self.n_interactions} interactions cannot give {self.n_users} users "
                              f"{self.min_len} events each")
        if not 0 <= self.repeat_p < 1 or self.zipf_s <= 0:
            raise SeqrecError("repeat_p must be in [0, 1) and zipf_s > 0")


def history_lengths(shape: LogShape, rng: np.random.Generator) -> np.ndarray:
    """(n_users,) lengths, log-normal in shape, each in [min_len, max_len], summing to n_interactions."""
    raw = rng.lognormal(0.0, shape.length_sigma, shape.n_users)
    extra_total = shape.n_interactions - shape.min_len * shape.n_users
    weights = raw
    extra = np.floor(weights / weights.sum() * extra_total).astype(np.int64)
    extra = np.minimum(extra, shape.max_len - shape.min_len)
    short = extra_total - int(extra.sum())  # what flooring and capping left: one more event for the longest
    room = (shape.max_len - shape.min_len) - extra
    order = np.argsort(-weights, kind="stable")
    while short > 0:
        take = np.minimum(room[order], 1)
        take[np.cumsum(take) > short] = 0
        if not take.any():
            raise SeqrecError(f"{shape.n_interactions} interactions do not fit {shape.n_users} users of at most "
                              f"{shape.max_len} events")
        extra[order] += take
        room[order] -= take
        short -= int(take.sum())
    return shape.min_len + extra


def zipf_items(shape: LogShape, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n,) item indices 0..n_items-1 drawn by Zipf popularity; indices are shuffled ranks, so the id
    says nothing about popularity."""
    weights = np.arange(1, shape.n_items + 1, dtype=np.float64) ** -shape.zipf_s
    cdf = np.cumsum(weights)
    ranks = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
    return rng.permutation(shape.n_items)[np.minimum(ranks, shape.n_items - 1)]


def generate_log(shape: LogShape) -> pl.DataFrame:
    """The log: one row per event, users in order, each user's events in time order."""
    rng = np.random.default_rng(shape.seed)
    lengths = history_lengths(shape, rng)
    n = int(lengths.sum())
    items = zipf_items(shape, n, rng)
    users = np.repeat(np.arange(shape.n_users), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pos = np.arange(n) - np.repeat(starts, lengths)
    if shape.repeat_p > 0:  # an event copies one of the user's earlier items
        back = (rng.random(n) < shape.repeat_p) & (pos > 0)
        source = np.flatnonzero(back)
        earlier = np.repeat(starts, lengths)[source] + (rng.random(len(source)) * pos[source]).astype(np.int64)
        items[source] = items[earlier]
    gaps = rng.exponential(shape.gap_s, n)
    gaps[pos == 0] = 0.0
    since_first = np.cumsum(gaps)
    since_first -= np.repeat(since_first[starts], lengths)
    times = np.repeat(rng.uniform(1.5e9, 1.7e9, shape.n_users), lengths) + since_first
    return pl.DataFrame({"user": users, "item": items, "timestamp": times}).with_columns(
        pl.col("user").cast(pl.Utf8), pl.col("item").cast(pl.Utf8))


def generated_dataset(shape: LogShape, name: str = "generated") -> RawDataset:
    return RawDataset(Interactions(generate_log(shape), f"generated:{shape}"), None, name)
