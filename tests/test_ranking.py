"""The blocked full ranking against a brute-force full score matrix: equal ranks on random data
with planted ties, history offsets (repeats included), seen-item filtering and NaN states."""

from __future__ import annotations

import pytest
import torch

from seqrec.eval.ranking import rank_targets, tie_tolerance


def brute_force(h: torch.Tensor, target: torch.Tensor, emb: torch.Tensor, bias: torch.Tensor | None,
                history: torch.Tensor | None, filter_seen: bool, offsets: torch.Tensor | None) -> torch.Tensor:
    """1 + the number of other non-padding items scoring at least the target's score minus the tie
    tolerance, from one (B, N+1) matrix in float64 (exact ties stay exact ties)."""
    h, emb = h.double(), emb.double()
    scores = h @ emb.T + (0 if bias is None else bias.double())
    magnitude = (h.abs() * emb[target].abs()).sum(1) + (0 if bias is None else bias.double()[target].abs())
    if offsets is not None:
        scores.scatter_add_(1, history, offsets.double())
        magnitude += (offsets.double().abs() * (history == target[:, None])).sum(1)
    t = scores[torch.arange(len(h)), target].clone()
    tol = tie_tolerance(magnitude, h.shape[1])
    scores[:, 0] = -torch.inf
    if filter_seen:
        scores.scatter_(1, history, -torch.inf)
    scores[torch.arange(len(h)), target] = -torch.inf
    ranks = (scores >= (t - tol)[:, None]).sum(1) + 1
    return torch.where(torch.isnan(t), torch.full_like(ranks, emb.shape[0] - 1), ranks)


def planted(n_users: int, n_items: int, d: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(n_items + 1, d, generator=g)
    bias = torch.randn(n_items + 1, generator=g)
    pairs = torch.arange(2, n_items + 1, 2)
    emb[pairs], bias[pairs] = emb[pairs - 1], bias[pairs - 1]  # twins: item 2j ties item 2j-1 for everyone
    crowd = torch.arange(n_items // 2, n_items + 1, 97)
    emb[crowd], bias[crowd] = emb[3].clone(), bias[3].clone()  # a crowd of copies of item 3
    h = torch.randn(n_users, d, generator=g)
    h[::13] = 0.0  # all-zero states: items tie by bias
    target = torch.randint(1, n_items + 1, (n_users,), generator=g)
    target[::5] = 3  # many targets inside the crowd
    history = torch.randint(0, n_items + 1, (n_users, 12), generator=g)
    history[:, :3] = 0  # left padding
    history[::4, -1] = target[::4]  # targets already in the history
    history[::6, -2] = history[::6, -1]  # repeats
    offsets = torch.randn(n_users, 12, generator=g).round() * (history != 0)
    return h, target, emb, bias, history, offsets


@pytest.mark.parametrize("n_items", [50, 5000])
@pytest.mark.parametrize("filter_seen", [False, True])
@pytest.mark.parametrize("with_offsets", [False, True])
def test_blocked_ranks_equal_brute_force(n_items: int, filter_seen: bool, with_offsets: bool) -> None:
    h, target, emb, bias, history, offsets = planted(700, n_items, 16, seed=n_items)
    off = offsets if with_offsets else None
    want = brute_force(h, target, emb, bias, history, filter_seen, off)
    for tile, threads in ((512, 2), (97, 1), (1 << 16, 2)):  # tiles that split the ties, and one that does not
        got = rank_targets(h, target, emb, bias, history, filter_seen, off, tile=tile, threads=threads)
        assert torch.equal(got, want), (tile, threads, (got != want).sum())
    scores = h.double() @ emb.double().T + bias.double()
    t = scores[torch.arange(len(h)), target]
    ties = (scores == t[:, None]).sum(1) - 1  # other items with exactly the target's score
    assert (ties > 0).float().mean() > 0.2  # the planted ties are there to be counted


def test_nan_state_gets_the_worst_rank() -> None:
    h, target, emb, _, _, _ = planted(20, 300, 8, seed=1)
    h[4] = torch.nan
    ranks = rank_targets(h, target, emb, tile=64)
    assert ranks[4] == 300 and torch.equal(ranks, brute_force(h, target, emb, None, None, False, None))


@pytest.mark.parametrize("tile", [2040, 4096, 1 << 16])
def test_everything_tied_counts_every_item_without_overflow(tile: int) -> None:
    emb = torch.ones(5001, 8)  # 5,000 items alike: each byte lane of the counter sees up to 255 hits
    h = torch.randn(300, 8)
    ranks = rank_targets(h, torch.randint(1, 5001, (300,)), emb, tile=tile, threads=2)
    assert (ranks == 5000).all()
