"""item2vec: Neural Item Embedding for Collaborative Filtering (Barkan & Koenigstein, 2016),
i.e. word2vec's skip-gram with negative sampling (Mikolov et al., NeurIPS 2013) with
users' training sequences as sentences.

    L = -log sigma(u_c · v_o) - sum_{j=1..k} log sigma(-u_c · v_j),   j ~ Pn(i) ∝ count(i)^0.75

over (centre c, context o) pairs at distance <= r in a sequence, r ~ U{1..window}
per centre (word2vec's dynamic window). Frequent items are dropped before pairing
with word2vec's rule, keep(i) = (sqrt(f_i / t) + 1) t / f_i, f_i the item's share
of training events. u (input vectors) is the item table; v (output vectors) is
used by training only.

Negatives: word2vec draws k per pair, which costs a (P, k, D) gather and a
batched product of tiny matrices. With `shared_negatives = S > 0` (the default)
one set of S negatives is drawn per batch and shared by every pair, each
weighted k / S, so the expected loss is word2vec's and the negative term is one
matrix product. Since the negatives are shared, a centre's negative term is the
same for all of its pairs and is computed once per centre position ((C, S), not
(P, S), with P about 2 x window x C). A negative equal to a pair's context is
removed from that pair's loss.

A user's state is the recency-weighted mean of the input vectors of the history,
h = sum_l w_l u_{s_l} / sum_l w_l with w_l = recency^(age of s_l), scored against
the input vectors by dot product or cosine (`scoring`). Item counts come from the
training split (`fit_data`) and are kept as a buffer, so checkpoints carry them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from seqrec.data.batching import Batch
from seqrec.data.counts import train_item_counts
from seqrec.data.dataset import PreparedDataset
from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel


def compact_left(seq: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Drop the items where `keep` is False and left-pad again: (B, L) -> (B, L), order kept."""
    keep = keep & (seq != 0)
    order = torch.argsort(keep.to(torch.int8), dim=1, stable=True)  # dropped first, kept after, in order
    return torch.gather(seq * keep, 1, order)


def skipgram_pairs(seq: torch.Tensor, window: int, dynamic: bool,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(centre item, context item, centre's flat position in seq), each (P,), for every skip-gram pair of
    left-padded (B, L) sentences; padding never pairs."""
    radius = (torch.randint(1, window + 1, seq.shape, device=seq.device, generator=generator) if dynamic
              else torch.full_like(seq, window))
    where = torch.arange(seq.numel(), device=seq.device).view(seq.shape)
    centres, contexts, places = [], [], []
    for o in range(1, min(window, seq.shape[1] - 1) + 1):  # one vectorised step per distance
        a, b = seq[:, :-o], seq[:, o:]
        for c, x, r, at in ((a, b, radius[:, :-o], where[:, :-o]), (b, a, radius[:, o:], where[:, o:])):
            ok = (c != 0) & (x != 0) & (r >= o)
            centres.append(c[ok])
            contexts.append(x[ok])
            places.append(at[ok])
    return torch.cat(centres), torch.cat(contexts), torch.cat(places)


def sgns_loss(u: torch.Tensor, v_pos: torch.Tensor, v_neg: torch.Tensor, neg_valid: torch.Tensor,
              weight: float = 1.0) -> torch.Tensor:
    """Skip-gram negative-sampling loss; u, v_pos (P, D); negatives per pair, v_neg (P, k, D), or shared by
    every pair, v_neg (S, D); neg_valid (P, k) or (P, S) bool; `weight` multiplies each negative's term."""
    pos = F.softplus(-(u * v_pos).sum(-1))  # -log sigma(u·v)
    logits = u @ v_neg.T if v_neg.dim() == 2 else (v_neg @ u.unsqueeze(-1)).squeeze(-1)
    neg = F.softplus(logits) * neg_valid  # -log sigma(-u·v_j)
    return (pos + weight * neg.sum(-1)).mean()


def sgns_loss_by_centre(u: torch.Tensor, centre_of: torch.Tensor, v_pos: torch.Tensor, context: torch.Tensor,
                        v_neg: torch.Tensor, negatives: torch.Tensor, weight: float) -> torch.Tensor:
    """`sgns_loss` with negatives shared by every pair, its negative term computed once per centre.

    u (C, D): one row per centre position; centre_of (P,): each pair's row of u; v_pos (P, D) and
    context (P,): each pair's context vector and item; v_neg (S, D), negatives (S,): the shared draw.
    A centre's negative term is the same for each of its ~2 x window pairs, so the (P, S) softplus
    becomes (C, S); a negative equal to a pair's context is then taken back out for that pair, which
    only concerns the few pairs whose context was drawn. Same value as `sgns_loss`."""
    pos = F.softplus(-(u[centre_of] * v_pos).sum(-1))  # (P,)
    per_centre = F.softplus(u @ v_neg.T)  # (C, S): -log sigma(-u·v_j)
    pairs_per_centre = torch.bincount(centre_of, minlength=u.shape[0]).to(per_centre.dtype)
    neg = (pairs_per_centre * per_centre.sum(-1)).sum()
    drawn = torch.isin(context, negatives)  # pairs whose context is among the negatives: remove those terms
    hits = context[drawn, None] == negatives[None, :]  # (P_drawn, S)
    neg = neg - (per_centre[centre_of[drawn]] * hits).sum()
    return (pos.sum() + weight * neg) / pos.shape[0]


@dataclass
class Item2VecConfig:
    name: str = "item2vec"
    d: int = 64
    window: int = 5
    dynamic_window: bool = True
    n_negatives: int = 5
    shared_negatives: int = 64  # > 0: this many negatives per batch, shared by every pair (see above); 0 = per pair
    neg_power: float = 0.75
    subsample: float = 1e-3  # word2vec's t; 0 keeps every event
    recency: float = 0.8  # weight of an item one step older; 1.0 = plain mean of the history
    scoring: Literal["dot", "cosine"] = "cosine"

    def __post_init__(self) -> None:
        if self.window < 1 or self.n_negatives < 1 or self.shared_negatives < 0:
            raise SeqrecError("model.window and model.n_negatives must be >= 1, model.shared_negatives >= 0")
        if not 0 < self.recency <= 1 or self.subsample < 0:
            raise SeqrecError("model.recency must be in (0, 1] and model.subsample >= 0")


class Item2Vec(SequentialModel):
    name = "item2vec"

    def __init__(self, config: Item2VecConfig, n_items: int, max_len: int) -> None:
        super().__init__()
        self.config, self.n_items, self.max_len = config, n_items, max_len
        d = config.d
        self.item_emb = nn.Embedding(n_items + 1, d, padding_idx=0)  # input vectors u: the item table
        self.out_emb = nn.Embedding(n_items + 1, d, padding_idx=0)  # output vectors v: training only
        nn.init.uniform_(self.item_emb.weight, -0.5 / d, 0.5 / d)  # word2vec's initialisation
        nn.init.zeros_(self.out_emb.weight)
        with torch.no_grad():
            self.item_emb.weight[0].zero_()
        self.counts: torch.Tensor
        self.register_buffer("counts", torch.zeros(n_items + 1))

    def fit_data(self, data: PreparedDataset) -> None:
        self.counts.copy_(torch.as_tensor(train_item_counts(data), dtype=torch.float32))

    def _vectors(self, items: torch.Tensor) -> torch.Tensor:
        u = self.item_emb(items)
        return F.normalize(u, dim=-1) if self.config.scoring == "cosine" else u

    def encode(self, batch: Batch) -> torch.Tensor:
        items = batch.items  # (B, L) left-padded: the last column is the most recent
        age = torch.arange(items.shape[1] - 1, -1, -1, device=items.device, dtype=torch.float32)
        w = (self.config.recency ** age)[None, :] * (items != 0)  # (B, L)
        h = (w.unsqueeze(-1) * self._vectors(items)).sum(1) / w.sum(1, keepdim=True).clamp(min=1e-12)
        return F.normalize(h, dim=-1) if self.config.scoring == "cosine" else h

    def item_embeddings(self) -> torch.Tensor:
        if self.config.scoring == "cosine":
            return F.normalize(self.item_emb.weight, dim=-1)  # padding row stays 0
        return self.item_emb.weight

    def _keep_probability(self) -> torch.Tensor | None:
        """(N+1,) word2vec's probability of keeping an event of each item; None = keep all."""
        total = float(self.counts.sum())
        if self.config.subsample <= 0 or total <= 0:
            return None
        ratio = self.config.subsample / (self.counts / total).clamp(min=1e-12)  # t / f
        return (ratio.sqrt() + ratio).clamp(max=1.0)  # (sqrt(f/t) + 1) t/f

    def _negatives(self, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        weight = self.counts ** self.config.neg_power if float(self.counts.sum()) > 0 else torch.ones_like(self.counts)
        weight = weight.clone()
        weight[0] = 0.0
        return torch.multinomial(weight, math.prod(shape), replacement=True).view(shape).to(device)

    def loss(self, batch: Batch) -> torch.Tensor:
        assert batch.targets is not None, "training batches carry targets"
        seq = torch.cat([batch.items, batch.targets[:, -1:]], dim=1)  # (B, L+1): the window's sentence
        keep_p = self._keep_probability()
        if keep_p is not None:
            seq = compact_left(seq, torch.rand(seq.shape, device=seq.device) < keep_p[seq])
        centre, context, place = skipgram_pairs(seq, self.config.window, self.config.dynamic_window)
        if centre.numel() == 0:  # every pair subsampled away: a zero that still has a graph
            return self.item_emb.weight.sum() * 0.0
        k, shared = self.config.n_negatives, self.config.shared_negatives
        if shared:
            neg = self._negatives((shared,), seq.device)  # (S,), one set for every pair
            places, centre_of = torch.unique(place, return_inverse=True)  # (C,) centre positions
            return sgns_loss_by_centre(self.item_emb(seq.flatten()[places]), centre_of, self.out_emb(context),
                                       context, self.out_emb(neg), neg, weight=k / shared)
        neg = self._negatives((centre.shape[0], k), seq.device)  # (P, k)
        return sgns_loss(self.item_emb(centre), self.out_emb(context), self.out_emb(neg), neg != context[:, None])
