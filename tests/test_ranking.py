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


def test_filtering_takes_the_seen_items_given_apart_from_the_offsets_history() -> None:
    """The offsets belong to the model's window (history); the items filtered are every earlier one (seen)."""
    h, target, emb, bias, history, offsets = planted(300, 400, 8, seed=3)
    g = torch.Generator().manual_seed(4)
    seen = torch.cat([torch.randint(0, 401, (300, 30), generator=g), history], 1)  # the window and 30 before it
    row, col = torch.nonzero(seen, as_tuple=True)  # as (row, item) pairs, rows ascending
    pairs = torch.stack([row, seen[row, col]])
    window_only = rank_targets(h, target, emb, bias, history, True, offsets, tile=97, threads=2)
    ref = brute_force_seen(h, target, emb, bias, history, offsets, seen)
    got = rank_targets(h, target, emb, bias, history, True, offsets, tile=97, threads=2, seen=pairs)
    assert torch.equal(got, ref) and not torch.equal(got, window_only)


def brute_force_seen(h: torch.Tensor, target: torch.Tensor, emb: torch.Tensor, bias: torch.Tensor,
                     history: torch.Tensor, offsets: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """`brute_force` with the offsets on `history` and the filtered items from `seen`."""
    h, emb = h.double(), emb.double()
    scores = h @ emb.T + bias.double()
    magnitude = (h.abs() * emb[target].abs()).sum(1) + bias.double()[target].abs()
    scores.scatter_add_(1, history, offsets.double())
    magnitude += (offsets.double().abs() * (history == target[:, None])).sum(1)
    t = scores[torch.arange(len(h)), target].clone()
    tol = tie_tolerance(magnitude, h.shape[1])
    scores[:, 0] = -torch.inf
    scores.scatter_(1, seen, -torch.inf)
    scores[torch.arange(len(h)), target] = -torch.inf
    return (scores >= (t - tol)[:, None]).sum(1) + 1


def test_evaluation_filters_every_seen_item_not_only_the_models_window(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """eval.filter_seen removes every item of the user's history before the target, as serving's
    exclude_seen does, though the model reads only the last max_len of them."""
    from seqrec.config import EvalConfig
    from seqrec.data.batching import eval_batches
    from seqrec.data.prepare import PrepareOptions, prepare
    from seqrec.eval.evaluate import evaluate_ranks
    from tests.conftest import synthetic_log
    from tests.test_models import make

    data = prepare(synthetic_log(n_users=80, n_items=40), PrepareOptions(), tmp_path / "d")
    model = make("sasrec", {}, n_items=data.n_items, max_len=3).eval()
    got = evaluate_ranks(model, data, "test", 3, EvalConfig(filter_seen=True), torch.device("cpu"))
    want = []
    users, pos = data.eval_positions("test")
    with torch.no_grad():
        for batch in eval_batches(data, "test", 3, 1000):
            scores = model.score(batch).double()
            t = scores[torch.arange(len(scores)), batch.target].clone()
            scores[:, 0] = -torch.inf
            for row, (u, p) in enumerate(zip(users, pos, strict=True)):
                earlier = torch.from_numpy(data.items[data.offsets[u] : data.offsets[u] + p].astype("int64"))
                scores[row, earlier] = -torch.inf  # every earlier item, not only the window of 3
                scores[row, batch.target[row]] = -torch.inf
            want.append(((scores >= t[:, None]).sum(1) + 1).numpy())
    import numpy as np

    assert (data.lengths[users] > 4).mean() > 0.5  # most histories are longer than the window
    np.testing.assert_array_equal(got, np.concatenate(want))
