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
same for all of its pairs and is computed once per position ((B, L, S), not
(P, S), with P about 2 x window x B x L). A negative equal to a pair's context is
removed from that pair's loss. The pairs are never listed: the pairs at distance
o are the band |i - j| <= radius of u v^T, so the positive term of a batch is
one batched matrix product, masked (`sgns_loss_banded`).

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
    """Drop the items where `keep` is False and left-pad again, order kept: (B, L) -> (B, L') with L'
    the longest row left, so the columns that would be padding in every row are gone."""
    keep = keep & (seq != 0)
    order = torch.argsort(keep.to(torch.int8), dim=1, stable=True)  # dropped first, kept after, in order
    width = int(keep.sum(1).max()) if seq.shape[0] else 0
    return torch.gather(seq * keep, 1, order)[:, seq.shape[1] - width:]


def draw_radius(seq: torch.Tensor, window: int, dynamic: bool,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, L) each centre's window radius: U{1..window} per centre (word2vec's dynamic window), or `window`."""
    if not dynamic:
        return torch.full_like(seq, window)
    return torch.randint(1, window + 1, seq.shape, device=seq.device, generator=generator)


def pair_band(seq: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """(B, L, L) bool: [b, i, j] is a skip-gram pair (centre i, context j) of the left-padded sentences
    seq (B, L): both real, 0 < |i - j| <= radius[b, i]."""
    at = torch.arange(seq.shape[1], device=seq.device)
    gap = (at[None, :] - at[:, None]).abs()  # (L, L)
    real = seq != 0
    return (gap > 0) & (gap[None] <= radius[:, :, None]) & real[:, :, None] & real[:, None, :]


def skipgram_pairs(seq: torch.Tensor, radius: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(centre item, context item, centre's flat position in seq), each (P,), for every pair of `pair_band`."""
    b, i, j = pair_band(seq, radius).nonzero(as_tuple=True)
    return seq[b, i], seq[b, j], b * seq.shape[1] + i


def sgns_loss(u: torch.Tensor, v_pos: torch.Tensor, v_neg: torch.Tensor, neg_valid: torch.Tensor,
              weight: float = 1.0) -> torch.Tensor:
    """Skip-gram negative-sampling loss; u, v_pos (P, D); negatives per pair, v_neg (P, k, D), or shared by
    every pair, v_neg (S, D); neg_valid (P, k) or (P, S) bool; `weight` multiplies each negative's term."""
    pos = F.softplus(-(u * v_pos).sum(-1))  # -log sigma(u·v)
    logits = u @ v_neg.T if v_neg.dim() == 2 else (v_neg @ u.unsqueeze(-1)).squeeze(-1)
    neg = F.softplus(logits) * neg_valid  # -log sigma(-u·v_j)
    return (pos + weight * neg.sum(-1)).mean()


def sgns_loss_banded(u: torch.Tensor, v: torch.Tensor, seq: torch.Tensor, radius: torch.Tensor,
                     v_neg: torch.Tensor, negatives: torch.Tensor, weight: float) -> torch.Tensor:
    """`sgns_loss` over every pair of `pair_band(seq, radius)` with negatives shared by every pair,
    without listing the pairs.

    u, v (B, L, D): input and output vectors of the sentences seq (B, L); v_neg (S, D), negatives (S,):
    the shared draw. Every centre-context dot product of a sentence is one entry of u v^T (B, L, L), one
    batched matrix product whose band holds the pairs: no gather of pair rows, no scatter in the
    backward pass, no loop over distances. A centre's negative term is the same for each of its pairs,
    so it is computed once per position ((B, L, S)) and counted once per pair; a negative equal to a
    pair's context is taken back out for that pair (the band times "is this context negative j",
    another batched product). Same value and gradients as `sgns_loss`. Memory is (B, L, L) per batch,
    which is small for the max lengths of sequential recommendation (B 128, L 200: 20 MB a tensor)."""
    band = pair_band(seq, radius).to(u.dtype)  # (B, L, L)
    pos = (F.softplus(-(u @ v.transpose(1, 2))) * band).sum()  # -log sigma(u·v) on the band
    hits = band @ (seq[..., None] == negatives).to(u.dtype)  # (B, L, S): a centre's contexts equal to negative j
    per_centre = F.softplus(u @ v_neg.T)  # (B, L, S): -log sigma(-u·v_j)
    neg = (per_centre * (band.sum(-1, keepdim=True) - hits)).sum()
    return (pos + weight * neg) / band.sum().clamp(min=1)  # no pair at all: 0, with a graph


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
        if not 0 <= self.neg_power <= 1:  # 0: negatives drawn uniformly, 1: as often as items occur
            raise SeqrecError(f"model.neg_power must be in [0, 1] (word2vec's 0.75), got {self.neg_power}")


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
        radius = draw_radius(seq, self.config.window, self.config.dynamic_window)
        k, shared = self.config.n_negatives, self.config.shared_negatives
        if shared:
            neg = self._negatives((shared,), seq.device)  # (S,), one set for every pair
            return sgns_loss_banded(self.item_emb(seq), self.out_emb(seq), seq, radius, self.out_emb(neg), neg,
                                     weight=k / shared)
        centre, context, _ = skipgram_pairs(seq, radius)
        if centre.numel() == 0:  # every pair subsampled away: a zero that still has a graph
            return self.item_emb.weight.sum() * 0.0
        neg = self._negatives((centre.shape[0], k), seq.device)  # (P, k)
        return sgns_loss(self.item_emb(centre), self.out_emb(context), self.out_emb(neg), neg != context[:, None])
