import math

import numpy as np
import pytest
import torch

from seqrec.eval.metrics import metrics_from_ranks
from seqrec.eval.ranking import RankRequest, rank_targets, stream_ranks


def test_metrics_hand_computed() -> None:
    m = metrics_from_ranks(np.array([1, 3, 11, 50]), [10, 50])
    assert m["recall@10"] == pytest.approx(2 / 4)
    assert m["ndcg@10"] == pytest.approx((1.0 + 1 / math.log2(4)) / 4)
    assert m["mrr@10"] == pytest.approx((1 + 1 / 3) / 4)
    assert m["recall@50"] == pytest.approx(1.0)
    assert m["ndcg@50"] == pytest.approx((1 + 1 / 2 + 1 / math.log2(12) + 1 / math.log2(51)) / 4)
    assert m["mrr@50"] == pytest.approx((1 + 1 / 3 + 1 / 11 + 1 / 50) / 4)


def test_metrics_reject_bad_ranks() -> None:
    with pytest.raises(ValueError):
        metrics_from_ranks(np.array([0, 2]), [10])


def _emb(n_items: int) -> torch.Tensor:
    return torch.eye(n_items + 1)[:, : n_items + 1]  # item i -> unit vector e_i (row 0 = padding)


def test_rank_counts_ties_against_the_target() -> None:
    # 5 items; scores for the user are the item's coordinate in h
    emb = _emb(5)
    h = torch.tensor([[0.0, 0.5, 0.9, 0.5, 0.5, 0.1]])  # item 1 ties with 3 and 4; item 2 is higher
    assert rank_targets(h, torch.tensor([1]), emb).item() == 4  # 2, 3, 4 all >= target
    assert rank_targets(h, torch.tensor([2]), emb).item() == 1
    assert rank_targets(h, torch.tensor([5]), emb).item() == 5


def test_constant_scores_get_the_worst_rank() -> None:
    emb = torch.ones(11, 4)
    h = torch.randn(3, 4)
    ranks = rank_targets(h, torch.tensor([1, 5, 10]), emb)
    assert ranks.tolist() == [10, 10, 10]


def test_padding_never_competes_and_nan_is_worst() -> None:
    emb = _emb(3)
    h = torch.tensor([[100.0, 0.1, 0.2, 0.3]])  # padding column scores highest
    assert rank_targets(h, torch.tensor([3]), emb).item() == 1
    h_nan = torch.tensor([[0.0, float("nan"), 0.2, 0.3]])
    assert rank_targets(h_nan, torch.tensor([1]), emb).item() == 3


def test_filter_seen_removes_history_but_not_target() -> None:
    emb = _emb(5)
    h = torch.tensor([[0.0, 0.9, 0.8, 0.7, 0.6, 0.5]])
    history = torch.tensor([[0, 1, 2, 4]])
    assert rank_targets(h, torch.tensor([4]), emb, history=history).item() == 4
    assert rank_targets(h, torch.tensor([4]), emb, history=history, filter_seen=True).item() == 2
    # the target itself in the history is still ranked
    assert rank_targets(h, torch.tensor([1]), emb, history=history, filter_seen=True).item() == 1


def test_bias_is_added() -> None:
    emb = _emb(3)
    h = torch.tensor([[0.0, 0.3, 0.2, 0.1]])
    bias = torch.tensor([0.0, 0.0, 0.0, 1.0])
    assert rank_targets(h, torch.tensor([3]), emb, bias).item() == 1


def test_streaming_matches_one_shot() -> None:
    torch.manual_seed(0)
    emb, h = torch.randn(101, 8), torch.randn(37, 8)
    target = torch.randint(1, 101, (37,))
    whole = rank_targets(h, target, emb).numpy()
    chunks = (RankRequest(h[i : i + 5], target[i : i + 5]) for i in range(0, 37, 5))
    np.testing.assert_array_equal(stream_ranks(chunks, emb), whole)
    brute = [(torch.cat([emb[1:t], emb[t + 1 :]]) @ h[u] >= emb[t] @ h[u]).sum().item() + 1
             for u, t in enumerate(target.tolist())]
    np.testing.assert_array_equal(whole, brute)


def test_infinite_scores_tie_against_the_target() -> None:
    emb, h = _emb(3), torch.zeros(1, 4)
    inf = float("inf")
    assert rank_targets(h, torch.tensor([1]), emb, torch.tensor([0.0, inf, inf, 0.5])).item() == 2
    assert rank_targets(h, torch.tensor([1]), emb, torch.tensor([0.0, 1.0, inf, 1.0])).item() == 3
