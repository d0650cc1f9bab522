"""Ranking metrics from the 1-based rank of each user's single held-out item.

With one relevant item per user:
    Recall@K = 1[rank <= K]                      (equals HitRate@K)
    NDCG@K   = 1[rank <= K] / log2(rank + 1)     (ideal DCG is 1)
    MRR@K    = 1[rank <= K] / rank
Each is averaged over users.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

METRICS = ("recall", "ndcg", "mrr")


def metrics_from_ranks(ranks: np.ndarray, ks: Iterable[int]) -> dict[str, float]:
    """Mean Recall/NDCG/MRR at each K; `ranks` are 1-based (1 = top)."""
    ranks = np.asarray(ranks, dtype=np.float64)
    if ranks.ndim != 1 or ranks.size == 0:
        raise ValueError("ranks must be a non-empty 1-D array")
    if (ranks < 1).any():
        raise ValueError("ranks are 1-based; got a rank below 1")
    out: dict[str, float] = {}
    for k in ks:
        hit = ranks <= k
        out[f"recall@{k}"] = float(hit.mean())
        out[f"ndcg@{k}"] = float(np.where(hit, 1.0 / np.log2(ranks + 1.0), 0.0).mean())
        out[f"mrr@{k}"] = float(np.where(hit, 1.0 / ranks, 0.0).mean())
    return out
