"""Streaming full ranking over all items.

The rank of a target is 1 + the number of *other* items whose score is at least
the target's: ties never favour the target, so a model that scores everything
alike gets the worst rank. Padding (index 0) never competes. With
`filter_seen`, items of the user's history other than the target are removed
from the competition.

Memory is bounded by `budget` floats whatever the number of users: users are
processed in chunks of `max(1, budget // n_items)` rows, each row holding the
scores of every item, and only ranks are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from seqrec.nn.history import add_offsets

DEFAULT_BUDGET = 1 << 25  # 32M float scores (128 MiB) live at once


@dataclass(frozen=True)
class RankRequest:
    """One chunk of users: their state vectors, targets and (optional) histories.

    h        (B, D) float   sequence states
    target   (B,)   long    held-out item index in 1..N
    history  (B, L) long    the users' histories (0 = pad): excluded when filtering seen items
    offsets  (B, L) float   what each history position adds to its item's score (models with a
                            learned history bias, `seqrec.nn.history`), or None
    """

    h: torch.Tensor
    target: torch.Tensor
    history: torch.Tensor | None = None
    offsets: torch.Tensor | None = None


def rank_targets(
    h: torch.Tensor,
    target: torch.Tensor,
    item_emb: torch.Tensor,
    item_bias: torch.Tensor | None = None,
    history: torch.Tensor | None = None,
    filter_seen: bool = False,
    offsets: torch.Tensor | None = None,
) -> torch.Tensor:
    """1-based ranks of `target` among all items for each row of `h`.

    h (B, D), target (B,), item_emb (N+1, D) with row 0 = padding, item_bias (N+1,);
    offsets (B, L) are added to the scores of the history items (B, L) first.
    """
    scores = h @ item_emb.T  # (B, N+1)
    if item_bias is not None:
        scores = scores + item_bias
    scores = scores.float()
    if offsets is not None:
        assert history is not None, "offsets belong to history positions"
        add_offsets(scores, history, offsets)
    rows = torch.arange(scores.shape[0], device=scores.device)
    target_score = scores[rows, target].clone()  # (B,)
    scores[:, 0] = -torch.inf
    if filter_seen and history is not None:
        scores.scatter_(1, history, -torch.inf)
    scores[rows, target] = -torch.inf  # the target never counts against itself
    finite = bool(torch.isfinite(target_score).all())
    if finite and scores.shape[1] < (1 << 24):
        # In place, without a second (B, N) tensor: with IEEE subnormals, a - b >= 0 exactly when a >= b,
        # and float32 counts are exact below 2^24 items.
        beaten_by = scores.sub_(target_score[:, None]).ge_(0).sum(dim=1).long()
    else:
        beaten_by = (scores >= target_score[:, None]).sum(dim=1)
    # A NaN target score is a broken model, not a lucky one: worst rank.
    worst = torch.full_like(beaten_by, item_emb.shape[0] - 2)
    beaten_by = torch.where(torch.isnan(target_score), worst, beaten_by)
    return beaten_by + 1


def user_chunk_size(n_items: int, budget: int = DEFAULT_BUDGET) -> int:
    return max(1, min(8192, budget // max(1, n_items + 1)))


def stream_ranks(
    requests: Iterator[RankRequest],
    item_emb: torch.Tensor,
    item_bias: torch.Tensor | None = None,
    filter_seen: bool = False,
    on_chunk: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Concatenated ranks over every chunk of users; only ranks are kept."""
    out: list[np.ndarray] = []
    for req in requests:
        ranks = rank_targets(req.h, req.target, item_emb, item_bias, req.history, filter_seen, req.offsets)
        out.append(ranks.cpu().numpy())
        if on_chunk is not None:
            on_chunk(len(ranks))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
