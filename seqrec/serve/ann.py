"""Approximate nearest-neighbour retrieval over item vectors: an inverted-file (IVF) index in torch.

    build   spherical k-means (fitted on a sample of at most 64 C items) puts every item in one of
            C lists (C = 2 sqrt(N) by default)
    search  a query scores the C centroids, opens its n_probe best lists, scores the items of
            those lists exactly, and keeps the top k

A query costs about C + N n_probe / C dot products instead of N; with n_probe = C the
search is exact. An output bias b is folded in as one more coordinate, [v_i, b_i] . [q, 1],
so the index serves the model's own scores. Inner products of vectors of unequal norms are
turned into cosines before clustering (Bachrach et al., RecSys 2014): every item gets one
more coordinate sqrt(M^2 - |v_i|^2), M the largest norm, and queries a 0 there, so scores are
unchanged while all items have norm M. Queries run in chunks whose gathered candidates stay
under a fixed budget. Runs wherever the vectors live (CPU or CUDA).
Shapes: N items, D width, Q queries, C lists, S the longest list.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from seqrec.errors import SeqrecError


def nearest_centroid(x: torch.Tensor, centroids: torch.Tensor, chunk: int = 1 << 15) -> torch.Tensor:
    """(N,) index of each row's highest-scoring centroid, in row chunks (memory stays chunk x C)."""
    return torch.cat([(x[lo : lo + chunk] @ centroids.T).argmax(1) for lo in range(0, len(x), chunk)])


def spherical_kmeans(x: torch.Tensor, n_clusters: int, n_iter: int = 20, seed: int = 0,
                     sample: int = 64) -> torch.Tensor:
    """(C, D) unit centroids of the unit rows of x (N, D), by cosine, fitted on at most `sample` x C
    rows drawn at random; empty clusters are re-seeded."""
    g = torch.Generator().manual_seed(seed)
    if len(x) > sample * n_clusters:
        x = x[torch.randperm(len(x), generator=g)[: sample * n_clusters].to(x.device)]
    x = F.normalize(x, dim=-1)
    centroids = x[torch.randperm(len(x), generator=g)[:n_clusters].to(x.device)].clone()
    for _ in range(n_iter):
        assign = nearest_centroid(x, centroids)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=n_clusters)
        empty = counts == 0
        if empty.any():  # an empty list takes a random point instead of dying
            pick = torch.randint(len(x), (int(empty.sum()),), generator=g).to(x.device)
            sums[empty] = x[pick]
        centroids = F.normalize(sums, dim=-1)
    return centroids


class IVFIndex:
    def __init__(self, vectors: torch.Tensor, bias: torch.Tensor | None = None, n_lists: int | None = None,
                 n_probe: int | None = None, seed: int = 0) -> None:
        """vectors (N+1, D) with row 0 the padding item, which is never returned; bias (N+1,) or None."""
        n = vectors.shape[0] - 1
        if n < 1:
            raise SeqrecError("an index needs at least one item")
        self.items = vectors[1:].float()
        if bias is not None:
            self.items = torch.cat([self.items, bias[1:].float().unsqueeze(1)], dim=1)
        self.has_bias = bias is not None
        norms = self.items.norm(dim=1, keepdim=True)
        self.items = torch.cat([self.items, (norms.max() ** 2 - norms**2).clamp(min=0).sqrt()], dim=1)
        self.n_lists = max(1, min(n, n_lists or round(2 * math.sqrt(n))))
        self.n_probe = max(1, min(self.n_lists, n_probe or math.ceil(self.n_lists / 8)))
        self.centroids = spherical_kmeans(self.items, self.n_lists, seed=seed)  # (C, D[+1])
        assign = nearest_centroid(self.items, self.centroids)  # all items have norm M: same as by cosine
        order = torch.argsort(assign, stable=True)
        counts = torch.bincount(assign, minlength=self.n_lists)
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.arange(n, device=order.device) - starts[assign[order]]
        self.lists = torch.full((self.n_lists, int(counts.max())), -1, dtype=torch.long, device=order.device)
        self.lists[assign[order], slot] = order  # (C, S) item rows (0-based), -1 = empty slot

    def search(self, queries: torch.Tensor, k: int, n_probe: int | None = None,
               exclude: list[list[int]] | None = None, budget: int = 1 << 24) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q, D) states -> (scores (Q, k), item indices (Q, k), 1-based like the model's); fewer than k
        reachable items leave -inf scores and index 0. `exclude`: per query, item indices never returned.
        `budget`: gathered candidate values (queries x candidates x width) held at once."""
        q = queries.float()
        extra = [torch.ones(len(q), 1)] if self.has_bias else []
        q = torch.cat([q, *[e.to(q) for e in extra], torch.zeros(len(q), 1, dtype=q.dtype, device=q.device)], dim=1)
        probe = min(self.n_lists, n_probe or self.n_probe)
        step = max(1, budget // (probe * self.lists.shape[1] * self.items.shape[1]))
        parts = [self._search(q[lo : lo + step], k, probe, None if exclude is None else exclude[lo : lo + step])
                 for lo in range(0, len(q), step)]
        return torch.cat([v for v, _ in parts]), torch.cat([i for _, i in parts])

    def _search(self, q: torch.Tensor, k: int, probe: int,
                exclude: list[list[int]] | None) -> tuple[torch.Tensor, torch.Tensor]:
        lists = (q @ self.centroids.T).topk(probe, dim=1).indices  # (Q, probe)
        cand = self.lists[lists].flatten(1)  # (Q, probe * S) item rows, -1 = empty
        scores = (self.items[cand.clamp(min=0)] @ q.unsqueeze(-1)).squeeze(-1)
        scores = scores.masked_fill(cand < 0, -torch.inf)
        if exclude is not None:
            for row, items in enumerate(exclude):
                if items:
                    hit = torch.isin(cand[row], torch.as_tensor(items, device=cand.device) - 1)
                    scores[row] = scores[row].masked_fill(hit, -torch.inf)
        kk = min(k, scores.shape[1])
        top = scores.topk(kk, dim=1)
        ids = torch.where(torch.isfinite(top.values), cand.gather(1, top.indices) + 1, 0)
        if kk < k:
            pad = k - kk
            top_values = F.pad(top.values, (0, pad), value=-torch.inf)
            return top_values, F.pad(ids, (0, pad), value=0)
        return top.values, ids
