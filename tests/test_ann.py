"""The IVF index: exact when every list is probed, high recall when a few are, and serving through it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from seqrec.data.dataset import PreparedDataset
from seqrec.errors import SeqrecError
from seqrec.serve.ann import IVFIndex, spherical_kmeans


def clustered(n: int = 2000, d: int = 16, clusters: int = 20, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(clusters, d, generator=g) * 3
    x = centres[torch.randint(clusters, (n,), generator=g)] + torch.randn(n, d, generator=g)
    return torch.cat([torch.zeros(1, d), x])  # row 0: padding


def exact_top(vectors: torch.Tensor, bias: torch.Tensor | None, q: torch.Tensor, k: int) -> torch.Tensor:
    scores = q @ vectors.T + (0 if bias is None else bias)
    scores[:, 0] = -torch.inf
    return scores.topk(k, dim=1).indices


def test_kmeans_lists_partition_the_catalogue() -> None:
    x = clustered()
    centroids = spherical_kmeans(x[1:], 8)
    torch.testing.assert_close(centroids.norm(dim=1), torch.ones(8))
    index = IVFIndex(x, n_lists=8)
    assert sorted(index.order.tolist()) == list(range(len(x) - 1))  # every item in exactly one list
    assert sum(index.list_sizes()) == len(x) - 1 and len(index.list_sizes()) == 8


@pytest.mark.parametrize("with_bias", [False, True])
def test_probing_every_list_is_exact(with_bias: bool) -> None:
    x = clustered()
    bias = torch.randn(len(x)) if with_bias else None
    q = torch.randn(50, x.shape[1], generator=torch.Generator().manual_seed(1))
    index = IVFIndex(x, bias, n_lists=16)
    values, ids = index.search(q, 10, n_probe=16)
    assert torch.equal(ids, exact_top(x, bias, q, 10))
    expected = (q @ x.T + (0 if bias is None else bias)).gather(1, ids)
    torch.testing.assert_close(values, expected)


def test_few_lists_keep_high_recall_on_clustered_items() -> None:
    x = clustered()
    g = torch.Generator().manual_seed(2)
    q = x[1 + torch.randint(len(x) - 1, (200,), generator=g)] + 0.3 * torch.randn(200, x.shape[1], generator=g)
    index = IVFIndex(x, n_lists=40, n_probe=5)  # an eighth of the lists: ~1/8 of the items scored
    _, ids = index.search(q, 10)
    truth = exact_top(x, None, q, 10)
    recall = sum(len(set(a) & set(b)) for a, b in zip(ids.tolist(), truth.tolist(), strict=True)) / truth.numel()
    assert recall > 0.9


def test_exclusions_padding_and_short_results() -> None:
    x = clustered(n=30)
    q = torch.randn(2, x.shape[1])
    index = IVFIndex(x, n_lists=3)
    top = exact_top(x, None, q, 3)
    _, ids = index.search(q, 3, n_probe=3, exclude=[top[0, :1].tolist(), []])
    assert top[0, 0] not in ids[0] and torch.equal(ids[1], top[1])
    values, ids = index.search(q, 40, n_probe=3)  # more than the 30 items: the rest is padding
    assert (ids[:, :30] > 0).all() and (ids[:, 30:] == 0).all() and torch.isinf(values[:, 30:]).all()
    with pytest.raises(SeqrecError):
        IVFIndex(torch.zeros(1, 4))


def test_recommender_through_the_index_matches_exact(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    from seqrec.config import build
    from seqrec.registry import build_model, model_config_class
    from seqrec.serve import Recommender
    from seqrec.train.checkpoint import save_checkpoint

    torch.manual_seed(0)
    cfg = build(model_config_class("sasrec"), {"name": "sasrec", "d": 16, "n_heads": 1}, "model")
    model = build_model(cfg, tiny_dataset.n_items, 8)
    with torch.no_grad():
        model.item_bias().normal_()  # type: ignore[union-attr]  # a bias the index must fold in
    save_checkpoint(model, tmp_path / "ckpt", max_len=8, item_table=tiny_dataset.item_table)
    exact = Recommender.from_run(tmp_path / "ckpt")
    approx = Recommender.from_run(tmp_path / "ckpt")
    index = approx.use_index(n_lists=4, n_probe=4)
    assert index.n_lists == 4
    for history, seen in ((["i1", "i2", "i3"], False), (["i4", "i5"], True)):
        a = exact.recommend(history, k=5, exclude_seen=seen)
        b = approx.recommend(history, k=5, exclude_seen=seen)
        assert [r.item for r in a] == [r.item for r in b]
        assert [r.score for r in a] == pytest.approx([r.score for r in b], abs=1e-5)
