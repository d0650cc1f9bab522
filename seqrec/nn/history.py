"""A learned score offset for items the user already has, by how recently they occurred.

    score(i | s_1..s_l) = base(i) + sum_{j <= l, s_j = i} beta[l - j]      beta: (max_len,), starts at 0

Whether users come back to what they had is a property of the data: they re-listen
to music and re-order groceries, but the Amazon review builds hold no repeated item at
all. A dot-product model with tied embeddings has no direct way to say "not this one
again": the state after an item sits close to that item's own vector, so the last item
tends to top its own ranking (on Beauty it is in the top 10 for most test users). This
module learns the answer from the training sequences instead of leaving it to a
seen-item filter at serving time: beta goes strongly negative on data without repeats,
positive where repeats are common, and it is the same at training, evaluation and
serving, so no protocol changes. `model.history_bias`: "auto" by default (`seqrec.train.auto`:
on wherever the loss is the full softmax).

Shapes: B batch, L window, M positions with a target, D model width.
"""

from __future__ import annotations

import torch
from torch import nn

# beta = SCALE * theta: Adam moves theta by about lr per step, and beta has to travel several
# logits within the first epoch or two to matter, so it learns at SCALE x the model's rate.
SCALE = 10.0


class HistoryBias(nn.Module):
    def __init__(self, max_len: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.theta = nn.Parameter(torch.zeros(max_len))

    def beta(self) -> torch.Tensor:
        """(max_len,) offset by recency: beta[0] for the newest history item."""
        return self.theta * SCALE

    def offsets(self, items: torch.Tensor) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, L) offset that each position adds to its item's score
        for the next item after the whole row (0 at padding)."""
        width = items.shape[1]
        recency = torch.arange(width - 1, -1, -1, device=items.device).clamp(max=self.max_len - 1)
        return self.beta()[recency].expand_as(items) * (items != 0)

    def training_rows(self, states: torch.Tensor, items: torch.Tensor, W: torch.Tensor | None,
                      b: torch.Tensor | None, keep: torch.Tensor, item_vecs: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What `seqrec.nn.losses.full_ce` needs for each training position t (a row with a target):
        the history items x (M, L) it has seen (s <= t; 0 elsewhere), their offsets v (M, L) and their
        base logits z (M, L) under states (B, L, D), item vectors W (N+1, D) and bias b (N+1,)
        (`item_vecs`: the (B, L, D) vectors of `items` instead of W, as pre-training has them)."""
        width = items.shape[1]
        t = torch.arange(width, device=items.device)
        seen = (t[None, :] <= t[:, None]) & (items != 0)[:, None, :]  # (B, L_t, L_s)
        recency = (t[:, None] - t[None, :]).clamp(0, self.max_len - 1)  # (L_t, L_s)
        v = (self.beta()[recency] * seen)[keep]  # (M, L)
        x = (items[:, None, :] * seen)[keep]  # (M, L)
        if item_vecs is None:
            assert W is not None
            item_vecs = W[items]
        z = states @ item_vecs.transpose(1, 2)  # (B, L_t, L_s): base logit of each history item
        if b is not None:
            z = z + b[items][:, None, :]
        return x, v, z[keep].float()


def distinct_offsets(x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For history items x (M, L; 0 = none) with offsets v (M, L): the total offset of each position's
    item (an item may repeat: its offsets add up) and a mask that keeps one position per distinct item."""
    valid = x != 0
    same = (x[:, :, None] == x[:, None, :]) & valid[:, :, None]  # (M, L, L)
    total = (same.to(v.dtype) @ v[:, :, None]).squeeze(-1)
    earlier = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).tril(-1)
    return total, valid & ~(same & earlier).any(-1)


def add_offsets(scores: torch.Tensor, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """scores (B, N+1) += each history position's offset on its item (in place; repeats add up)."""
    return scores.scatter_add_(1, items, offsets.to(scores.dtype))


def window_scores(states: torch.Tensor, windows: torch.Tensor, offsets: torch.Tensor, vectors: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """Serving: (B, L) exact scores of each window's items, h . v_i + b_i + the offsets of every position
    holding i, at each item's first position in its window; -inf at padding and later repeats."""
    total, keep = distinct_offsets(windows, offsets.float())
    scores = (vectors[windows] * states.float()[:, None, :]).sum(-1) + total
    if bias is not None:
        scores = scores + bias[windows]
    return scores.masked_fill(~keep, -torch.inf)
