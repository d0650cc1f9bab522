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
unchanged while all items have norm M. Runs wherever the vectors live (CPU or CUDA).
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
        self.order = torch.argsort(assign, stable=True)  # item rows (0-based), list by list
        counts = torch.bincount(assign, minlength=self.n_lists)
        self.offsets = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]).tolist()  # list l: [o_l, o_l+1)
        self.sorted_items = self.items[self.order]  # each list's vectors contiguous: one matmul per list

    def list_sizes(self) -> list[int]:
        return [b - a for a, b in zip(self.offsets[:-1], self.offsets[1:], strict=True)]

    @torch.no_grad()
    def search(self, queries: torch.Tensor, k: int, n_probe: int | None = None,
               exclude: list[list[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q, D) states -> (scores (Q, k), item indices (Q, k), 1-based like the model's); fewer than k
        reachable items leave -inf scores and index 0. `exclude`: per query, item indices never returned.

        Work is grouped by list: the queries that probe a list are scored against its items in one
        matrix product, and each keeps its best k there; the per-query winners are merged at the end."""
        q = queries.float()
        ones = [torch.ones(len(q), 1, dtype=q.dtype, device=q.device)] if self.has_bias else []
        q = torch.cat([q, *ones, torch.zeros(len(q), 1, dtype=q.dtype, device=q.device)], dim=1)
        probe = min(self.n_lists, n_probe or self.n_probe)
        n_excl = max((len(e) for e in exclude), default=0) if exclude is not None else 0
        keep = k + n_excl  # per list, enough to survive the exclusions
        lists = (q @ self.centroids.T).topk(probe, dim=1).indices.flatten()  # (Q * probe,)
        who = torch.arange(len(q), device=q.device).repeat_interleave(probe)
        order = torch.argsort(lists, stable=True)
        lists, who = lists[order], who[order]
        values = torch.full((len(q) * probe, keep), -torch.inf, device=q.device)
        rows = torch.full((len(q) * probe, keep), -1, dtype=torch.long, device=q.device)
        uniq, counts = torch.unique_consecutive(lists, return_counts=True)
        at = 0
        for lst, cnt in zip(uniq.tolist(), counts.tolist(), strict=True):
            lo, hi = self.offsets[lst], self.offsets[lst + 1]
            if hi > lo:
                scores = q[who[at : at + cnt]] @ self.sorted_items[lo:hi].T  # (queries of this list, its items)
                top = scores.topk(min(keep, hi - lo), dim=1)
                values[at : at + cnt, : top.values.shape[1]] = top.values
                rows[at : at + cnt, : top.values.shape[1]] = self.order[lo + top.indices]
            at += cnt
        back = torch.argsort(order)  # rows back in (query, probe) order
        values = values[back].view(len(q), probe * keep)
        rows = rows[back].view(len(q), probe * keep)
        if exclude is not None:
            for r, items in enumerate(exclude):
                if items:
                    hit = torch.isin(rows[r], torch.as_tensor(items, device=rows.device) - 1)
                    values[r] = values[r].masked_fill(hit, -torch.inf)
        kk = min(k, values.shape[1])
        top = values.topk(kk, dim=1)
        ids = torch.where(torch.isfinite(top.values), rows.gather(1, top.indices) + 1, 0)
        if kk < k:
            return F.pad(top.values, (0, k - kk), value=-torch.inf), F.pad(ids, (0, k - kk), value=0)
        return top.values, ids
