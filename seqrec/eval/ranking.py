"""Streaming full ranking over all items.

The rank of a target is 1 + the number of *other* items whose score is at least
the target's: ties never favour the target, so a model that scores everything
alike gets the worst rank. Padding (index 0) never competes. With
`filter_seen`, items of the user's history other than the target are removed
from the competition.

Blocked (`rank_targets`): groups of users are scored against tiles of items, each
tile's scores counted while they are in cache, so memory holds a group's tile, not a
(users, items) matrix, and time is close to that of the matrix product alone
(`benchmarks/eval_cost.py`). Only ranks are kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

DEFAULT_BUDGET = 1 << 25  # 32M float scores (128 MiB) live at once
USER_BLOCK = 256  # users per group: a group's tile of scores is USER_BLOCK x TILE floats
LANE_BYTES = 255 * 8  # comparison bytes per row counted at once (255 uint64 words: no byte lane overflows)
TILE_CPU = LANE_BYTES  # items per tile on the CPU: 256 x 2040 x 4 B = 2 MiB, about an L2 cache
TILE_CUDA = 1 << 14  # with CUDA_GROUP users: 2048 x 16384 x 4 B = 128 MiB of scores per tile
CUDA_GROUP = 2048


@dataclass(frozen=True)
class RankRequest:
    """One chunk of users: their state vectors, targets and (optional) histories.

    h        (B, D) float   sequence states
    target   (B,)   long    held-out item index in 1..N
    history  (B, L) long    the users' histories (0 = pad): excluded when filtering seen items
    offsets  (B, L) float   what each history position adds to its item's score (models with a
                            learned history bias, `seqrec.nn.history`), or None
    seen     (2, M) long    the items excluded when filtering seen items, when not `history`: (row,
                            item) pairs, rows ascending (every item before the target, where the model
                            sees only the last L; a list, so one long history costs its length only)
    """

    h: torch.Tensor
    target: torch.Tensor
    history: torch.Tensor | None = None
    offsets: torch.Tensor | None = None
    seen: torch.Tensor | None = None


def rank_targets(
    h: torch.Tensor,
    target: torch.Tensor,
    item_emb: torch.Tensor,
    item_bias: torch.Tensor | None = None,
    history: torch.Tensor | None = None,
    filter_seen: bool = False,
    offsets: torch.Tensor | None = None,
    tile: int | None = None,
    threads: int | None = None,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """1-based ranks of `target` among all items for each row of `h`.

    h (B, D), target (B,), item_emb (N+1, D) with row 0 = padding, item_bias (N+1,);
    offsets (B, L) are added to the scores of the history items (B, L) first; with `filter_seen`,
    the items of `seen` ((2, M) (row, item) pairs, rows ascending; default: `history`) other than the
    target are left out.

    Blocked: users in groups of at most USER_BLOCK, items in tiles of `tile`; a tile's scores are
    counted while they are in cache, so no (B, N) matrix is written out and read back. On the CPU
    the groups run on `threads` threads (default: torch's), one torch thread each.

    Ties: an item counts against the target when its score is at least the target's minus the
    float error of a D-term dot product (`tie_tolerance`). A matrix product sums in an order that
    depends on where a column falls in the kernel's blocks, so two items with the same vector can
    differ in the last bits; with the tolerance a tie never depends on that, and a model that scores
    everything alike always gets the worst rank.
    """
    if target.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=h.device)
    cpu = h.device.type == "cpu"
    tile = tile or (TILE_CPU if cpu else TILE_CUDA)
    group = USER_BLOCK if cpu else min(h.shape[0], CUDA_GROUP)
    W = item_emb.float()
    b = None if item_bias is None else item_bias.float()

    def one(lo: int) -> torch.Tensor:
        hi = min(lo + group, h.shape[0])
        excluded = None
        if filter_seen and seen is not None:  # this group's pairs, rows counted from its first
            a, z = torch.searchsorted(seen[0].contiguous(), torch.tensor([lo, hi], device=seen.device)).tolist()
            excluded = torch.stack([seen[0, a:z] - lo, seen[1, a:z]])
        elif filter_seen and history is not None:
            row, col = torch.nonzero(history[lo:hi], as_tuple=True)
            excluded = torch.stack([row, history[lo:hi][row, col]])
        return _rank_group(h[lo:hi].float(), target[lo:hi], W, b, None if history is None else history[lo:hi],
                           excluded, None if offsets is None else offsets[lo:hi].float(), tile)

    starts = range(0, h.shape[0], group)
    n_threads = threads or torch.get_num_threads()
    if not cpu or n_threads == 1 or len(starts) == 1:
        return torch.cat([one(lo) for lo in starts])
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # one torch thread per group: tiles this small gain nothing from more
    try:
        with ThreadPoolExecutor(n_threads) as pool:
            return torch.cat(list(pool.map(one, starts)))
    finally:
        torch.set_num_threads(previous)


def tie_tolerance(magnitude: torch.Tensor, d: int) -> torch.Tensor:
    """Scores closer than this to the target's are ties: a bound on the float32 error of a D-term
    dot product summed in another order, (4 + sqrt(D)) ulps of sum_k |h_k w_k| (measured: under 5)."""
    tol = magnitude * ((4 + math.sqrt(d)) * 2.0**-23)
    return torch.where(torch.isfinite(tol), tol, torch.zeros_like(tol))  # an infinite score has no error to allow


def _rank_group(h: torch.Tensor, target: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None,
                history: torch.Tensor | None, excluded: torch.Tensor | None, offsets: torch.Tensor | None,
                tile: int) -> torch.Tensor:
    """Ranks for one group of users (G, D) over every item tile (`excluded`: (row, item) pairs of the items
    filtered out): see `rank_targets`."""
    G, n1 = h.shape[0], W.shape[0]
    if excluded is not None:  # by item: a tile's pairs are one slice
        excluded = excluded[:, excluded[1] != 0]
        excluded = excluded[:, torch.argsort(excluded[1])]
        bounds = _tile_bounds(excluded[1], n1, tile)
    # each tile's targets, never counted against themselves: by target, so that a tile's are one slice
    by_target = torch.argsort(target)
    t_sorted = target[by_target]
    t_bounds = _tile_bounds(t_sorted, n1, tile)
    own = W[target]  # (G, D)
    t_score = (h * own).sum(1)
    magnitude = (h.abs() * own.abs()).sum(1)
    if b is not None:
        t_score, magnitude = t_score + b[target], magnitude + b[target].abs()
    if offsets is not None:
        assert history is not None, "offsets belong to history positions"
        at_target = (history == target[:, None]) & (history != 0)
        t_score = t_score + (offsets * at_target).sum(1)
        magnitude = magnitude + (offsets.abs() * at_target).sum(1)
    threshold = (t_score - tie_tolerance(magnitude, h.shape[1]))[:, None]  # (G, 1)
    beaten = torch.zeros(G, dtype=torch.long, device=h.device)
    cpu = h.device.type == "cpu"
    flags = np.empty((G, LANE_BYTES), dtype=bool) if cpu else None  # this group's comparison bytes
    threshold_np = threshold.numpy() if cpu else None
    buffer = torch.empty(G, min(tile, n1), dtype=h.dtype, device=h.device)  # a tile's scores, rewritten each time
    for lo in range(0, n1, tile):
        hi = min(lo + tile, n1)
        out = buffer if hi - lo == buffer.shape[1] else torch.empty(G, hi - lo, dtype=h.dtype, device=h.device)
        # (G, width), the bias added in the product's pass: stays in cache while it is counted
        scores = torch.mm(h, W[lo:hi].T, out=out) if b is None else torch.addmm(b[lo:hi], h, W[lo:hi].T, out=out)
        if lo == 0:
            scores[:, 0] = -torch.inf  # padding never competes
        if history is not None and offsets is not None:
            _history_in_tile(scores, history, offsets, lo, hi)
        if excluded is not None:
            a, z = bounds[lo // tile], bounds[lo // tile + 1]
            scores[excluded[0, a:z], excluded[1, a:z] - lo] = -torch.inf
        ta, tz = t_bounds[lo // tile], t_bounds[lo // tile + 1]
        scores[by_target[ta:tz], t_sorted[ta:tz] - lo] = -torch.inf  # the target never counts against itself
        if flags is not None and threshold_np is not None:
            beaten += torch.from_numpy(count_at_least(scores.numpy(), threshold_np, flags))
        else:
            beaten += (scores >= threshold).sum(dim=1)
    # A NaN target score is a broken model, not a lucky one: worst rank.
    return torch.where(torch.isnan(t_score), torch.full_like(beaten, n1 - 2), beaten) + 1


def _tile_bounds(items: torch.Tensor, n1: int, tile: int) -> list[int]:
    """Where each tile's entries start in `items` (item indices, ascending): tile t holds bounds[t]:bounds[t + 1]."""
    return torch.searchsorted(items.contiguous(), torch.arange(0, n1 + tile, tile, device=items.device)).tolist()


def count_at_least(scores: np.ndarray, threshold: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """(G,) how many entries of each row of scores (G, W) are >= threshold (G, 1), on the CPU.

    One comparison pass into a reused byte buffer `flags` (G, LANE_BYTES), whose rows are then summed
    as uint64 words: eight byte lanes at once, and at most 255 words per row, so no lane overflows;
    the eight lane totals make the count. About 4x faster than comparing and summing in torch."""
    G, W = scores.shape
    total = np.zeros(G, dtype=np.int64)
    for lo in range(0, W, LANE_BYTES):
        w = min(LANE_BYTES, W - lo)
        np.greater_equal(scores[:, lo : lo + w], threshold, out=flags[:, :w])
        if w < LANE_BYTES:
            flags[:, w:] = False
        lanes = flags.view(np.uint64).sum(axis=1, dtype=np.uint64)  # (G,): 8 byte lanes of counts <= 255
        total += lanes.view(np.uint8).reshape(G, 8).sum(axis=1, dtype=np.int64)
    return total


def _history_in_tile(scores: torch.Tensor, history: torch.Tensor, offsets: torch.Tensor, lo: int, hi: int) -> None:
    """A tile's scores (G, width) with the history items it holds shifted by their offsets (each
    position adds its own, as `add_offsets` does on a full row)."""
    hit = (history >= lo) & (history < hi) & (history != 0)
    if not bool(hit.any()):
        return
    col = torch.where(hit, history - lo, 0)
    scores.scatter_add_(1, col, torch.where(hit, offsets, 0.0))  # not offsets * hit: inf * 0 is NaN


def user_chunk_size(n_items: int, budget: int = DEFAULT_BUDGET) -> int:
    """Users encoded and ranked at once: the ranking holds a tile per group, not a row per item,
    so `budget` (floats) bounds groups x tile; `n_items` only matters for small catalogues."""
    return max(1, min(8192, budget // max(1, min(n_items + 1, TILE_CPU))))


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
        ranks = rank_targets(req.h, req.target, item_emb, item_bias, req.history, filter_seen, req.offsets,
                             seen=req.seen)
        out.append(ranks.cpu().numpy())
        if on_chunk is not None:
            on_chunk(len(ranks))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
