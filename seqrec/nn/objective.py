"""The next-item objective shared by SASRec, BERT4Rec and GRU4Rec: one choice, written once.

Model configs carry the same five keys and hand them to `Objective`:

    loss         "ce" full softmax | "sampled_softmax" | "bce" | "gbce" | "auto" (decided from the
                 catalogue size and the machine by `seqrec.train.auto`; the full softmax when a
                 model is built without that decision)
    n_negatives  k negatives per positive (bce, gbce) or per batch (sampled_softmax)
    negatives    "uniform" | "popularity" (training-split counts, see `fit_data`)
    logq         subtract log Q(i) from every candidate logit (sampled_softmax)
    gbce_t       gSASRec calibration t in [0, 1] (gbce)

Negatives for "sampled_softmax" are shared by every row of the batch (one (k, D)
gather and an (M, k) matmul, so memory does not grow with the catalogue);
"bce" and "gbce" draw k negatives per positive as in SASRec and gSASRec.
Negatives equal to a row's positive are removed from its loss.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from seqrec.errors import SeqrecError
from seqrec.nn.losses import bce_negatives, full_ce, gbce, sampled_softmax, uniform_negatives

LOSSES = ("auto", "ce", "sampled_softmax", "bce", "gbce")


def check_loss_config(cfg: Any) -> None:
    """Validate the shared loss keys of a model config (called from its __post_init__)."""
    if cfg.loss not in LOSSES:
        raise SeqrecError(f"model.loss={cfg.loss!r} is not one of {list(LOSSES)}")
    if cfg.n_negatives < 1:
        raise SeqrecError(f"model.n_negatives must be >= 1, got {cfg.n_negatives}")
    if not 0.0 <= cfg.gbce_t <= 1.0:
        raise SeqrecError(f"model.gbce_t must be in [0, 1], got {cfg.gbce_t}")
    if getattr(cfg, "history_bias", False) is True and cfg.loss not in ("ce", "auto"):
        raise SeqrecError("model.history_bias needs model.loss='ce' (its offsets enter the full softmax)")
    if cfg.negatives == "popularity" and cfg.loss not in ("sampled_softmax", "bce", "gbce"):
        raise SeqrecError("model.negatives='popularity' needs a sampled loss (sampled_softmax, bce, gbce)")


class Objective(nn.Module):
    """Loss over item vectors W (N+1, D) for states h (M, D) and targets (M,) in 1..N.

    With popularity negatives it holds `counts` (N+1,), the training-split item counts,
    as a persistent buffer so a checkpoint carries its sampling distribution.
    """

    def __init__(self, cfg: Any, n_items: int) -> None:
        super().__init__()
        self.kind: str = "ce" if cfg.loss == "auto" else cfg.loss
        self.k: int = cfg.n_negatives
        self.popularity = cfg.negatives == "popularity"
        self.logq: bool = cfg.logq
        self.t: float = cfg.gbce_t
        self.n_items = n_items
        self.counts: torch.Tensor | None
        if self.popularity:
            self.register_buffer("counts", torch.zeros(n_items + 1))
        else:
            self.counts = None

    def set_counts(self, counts: np.ndarray) -> None:
        if self.counts is not None:
            self.counts.copy_(torch.as_tensor(counts, dtype=torch.float32))

    def log_q(self) -> torch.Tensor:
        """(N+1,) log sampling probability of each item; row 0 (padding) is never drawn."""
        device = self.counts.device if self.counts is not None else None
        q = torch.ones(self.n_items + 1, device=device)
        if self.counts is not None and float(self.counts[1:].sum()) > 0:
            q = self.counts + 1.0  # add-one: an item unseen in training can still be drawn
        q[0] = 0.0
        return torch.log(q / q.sum())

    def sample(self, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        if not self.popularity:
            return torch.randint(1, self.n_items + 1, shape, device=device)
        probs = self.log_q().exp()
        n = int(np.prod(shape))
        return torch.multinomial(probs, n, replacement=True).view(shape).to(device)

    def forward(self, h: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, target: torch.Tensor,
                history: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """`history`: (x, v, z) history offsets of each row (seqrec.nn.history), "ce" only."""
        if self.kind == "ce":
            return full_ce(h, W, b, target, history=history)
        assert history is None, "history offsets need the full softmax (check_loss_config)"
        if self.kind == "sampled_softmax":
            neg = self.sample((self.k,), h.device)
            if not self.logq:
                return sampled_softmax(h, W, b, target, neg)
            log_q = self.log_q().to(h.device)
            return sampled_softmax(h, W, b, target, neg, log_q[target], log_q[neg])
        neg = uniform_negatives(target, self.n_items, self.k)  # uniform over the other N - 1 items
        if self.popularity:  # a popularity draw equal to the positive is replaced by a uniform one
            drawn = self.sample((target.shape[0], self.k), h.device)
            neg = torch.where(drawn == target[:, None], neg, drawn)
        if self.kind == "bce":
            return bce_negatives(h, W, b, target, neg)
        return gbce(h, W, b, target, neg, self.t)
