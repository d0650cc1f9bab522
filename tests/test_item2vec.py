"""item2vec recovers planted structure; its item table initialises other models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from seqrec.config import build
from seqrec.data.batching import Batch
from seqrec.data.counts import train_item_counts
from seqrec.data.dataset import PreparedDataset
from seqrec.errors import SeqrecError
from seqrec.models.item2vec import (
    Item2Vec,
    Item2VecConfig,
    compact_left,
    draw_radius,
    sgns_loss,
    sgns_loss_banded,
    skipgram_pairs,
)
from seqrec.registry import build_model, model_config_class
from seqrec.train.checkpoint import save_checkpoint
from seqrec.train.init_items import init_item_embeddings
from seqrec.train.loop import fit


def test_skipgram_pairs_and_compaction_by_hand() -> None:
    seq = torch.tensor([[0, 1, 2, 3]])
    centre, context, place = skipgram_pairs(seq, draw_radius(seq, window=1, dynamic=False))
    assert sorted(zip(centre.tolist(), context.tolist(), strict=True)) == [(1, 2), (2, 1), (2, 3), (3, 2)]
    assert (seq.flatten()[place] == centre).all()  # each pair's centre position holds its centre
    centre, _, _ = skipgram_pairs(seq, draw_radius(seq, window=2, dynamic=False))
    assert len(centre) == 6  # (1,2) (2,3) (1,3), both directions; padding never pairs
    kept = compact_left(torch.tensor([[0, 5, 6, 7, 8]]), torch.tensor([[True, True, False, True, False]]))
    assert kept.tolist() == [[5, 7]]  # columns that are padding in every row are dropped
    kept = compact_left(torch.tensor([[0, 5, 6], [1, 2, 3]]), torch.tensor([[True, True, False], [False, True, True]]))
    assert kept.tolist() == [[0, 5], [2, 3]]
    # a centre's own radius decides its pairs: positions 0..3 with radii 1, 2, 1, 1
    centre, context, _ = skipgram_pairs(torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 2, 1, 1]]))
    assert sorted(zip(centre.tolist(), context.tolist(), strict=True)) == [
        (1, 2), (2, 1), (2, 3), (2, 4), (3, 2), (3, 4), (4, 3)]


def test_sgns_loss_by_hand_per_pair_and_shared_negatives() -> None:
    u = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    v_pos = torch.tensor([[0.5, 0.0], [0.0, -1.0]])
    sp = torch.nn.functional.softplus
    # per pair: pair 0 has negatives (1, 1) and (-1, 0), pair 1 has (0, 1) masked (an accidental hit) and (2, 0)
    v_neg = torch.tensor([[[1.0, 1.0], [-1.0, 0.0]], [[0.0, 1.0], [2.0, 0.0]]])
    valid = torch.tensor([[True, True], [False, True]])
    expected = ((sp(torch.tensor(-0.5)) + sp(torch.tensor(1.0)) + sp(torch.tensor(-1.0)))
                + (sp(torch.tensor(2.0)) + sp(torch.tensor(0.0)))) / 2
    assert torch.isclose(sgns_loss(u, v_pos, v_neg, valid), expected)
    # shared: the same two negatives for both pairs, each weighted k / S = 0.5; pair 1's hit masked
    shared = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    valid = torch.tensor([[True, True], [True, False]])
    expected = ((sp(torch.tensor(-0.5)) + 0.5 * (sp(torch.tensor(1.0)) + sp(torch.tensor(0.0))))
                + (sp(torch.tensor(2.0)) + 0.5 * sp(torch.tensor(2.0)))) / 2
    assert torch.isclose(sgns_loss(u, v_pos, shared, valid, weight=0.5), expected)


def test_banded_loss_equals_the_per_pair_loss_and_gradients() -> None:
    """Shared negatives over the band of u v^T give sgns_loss's value and gradients on the listed pairs,
    repeated negatives counted twice and hits removed."""
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(1, 12, (6, 9), generator=g)
    seq[:2, :3] = 0  # padding
    radius = draw_radius(seq, window=3, dynamic=True, generator=g)
    assert int(radius.min()) == 1 and int(radius.max()) == 3
    centre, context, _ = skipgram_pairs(seq, radius)
    negatives = torch.tensor([3, 5, 5, 7, 1])  # drawn with replacement: a repeated negative counts twice
    table_u = torch.randn(12, 4, generator=g, requires_grad=True)
    table_v = torch.randn(12, 4, generator=g, requires_grad=True)
    ref = sgns_loss(table_u[centre], table_v[context], table_v[negatives], negatives[None, :] != context[:, None],
                    weight=0.4)
    out = sgns_loss_banded(table_u[seq], table_v[seq], seq, radius, table_v[negatives], negatives, weight=0.4)
    assert bool(torch.isin(context, negatives).any())  # the hit correction is exercised
    torch.testing.assert_close(out, ref)
    for a, b in zip(torch.autograd.grad(out, (table_u, table_v)), torch.autograd.grad(ref, (table_u, table_v)),
                    strict=True):
        torch.testing.assert_close(a, b)
    empty = torch.zeros(2, 5, dtype=torch.long)  # every event subsampled away: zero, with a graph
    zero = sgns_loss_banded(table_u[empty], table_v[empty], empty, draw_radius(empty, 3, True), table_v[negatives],
                             negatives, weight=0.4)
    assert float(zero.detach()) == 0.0 and zero.requires_grad


@pytest.mark.parametrize("shared", [0, 16])
def test_item2vec_recovers_planted_co_occurrence_groups(shared: int) -> None:
    """4 groups of 10 items; every sentence draws from one group: neighbours must share the group.
    Negatives per pair (word2vec) and shared by the batch."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    groups, size, n_items = 4, 10, 40
    group = rng.integers(groups, size=400)
    seqs = torch.from_numpy(1 + group[:, None] * size + rng.integers(size, size=(400, 12)))  # (400, 12) in 1..40
    model = Item2Vec(Item2VecConfig(d=16, window=3, n_negatives=5, shared_negatives=shared, subsample=0.0),
                     n_items, max_len=11)
    model.counts.copy_(torch.bincount(seqs.flatten(), minlength=n_items + 1).float())
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(15):
        for lo in range(0, 400, 50):
            rows = seqs[lo : lo + 50]
            loss = model.loss(Batch(items=rows[:, :-1], targets=rows[:, 1:]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    table = model.item_embeddings()[1:].detach()  # cosine: unit rows
    sim = table @ table.T
    sim.fill_diagonal_(-2)
    top = sim.topk(5, dim=1).indices  # (40, 5) item positions 0..39
    same = (top // size == (torch.arange(n_items) // size)[:, None]).float().mean().item()
    assert same > 0.95  # chance is 9 / 39


def _item2vec_checkpoint(data: PreparedDataset, dest: Path, d: int = 16, fingerprint: str | None = None) -> Item2Vec:
    torch.manual_seed(0)
    model = Item2Vec(Item2VecConfig(d=d), data.n_items, max_len=8)
    model.fit_data(data)
    save_checkpoint(model, dest, max_len=8, item_table=data.item_table,
                    extra={"dataset_fingerprint": fingerprint or data.fingerprint})
    return model


def test_fit_data_stores_training_counts_in_the_checkpoint(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    counts = train_item_counts(tiny_dataset)
    assert counts[0] == 0 and counts.sum() == tiny_dataset.train_end().sum()
    _item2vec_checkpoint(tiny_dataset, tmp_path / "c")
    from seqrec.train.checkpoint import load_checkpoint

    loaded, _ = load_checkpoint(tmp_path / "c")
    np.testing.assert_array_equal(loaded.counts.numpy(), counts)  # type: ignore[operator]


def test_init_items_from_copies_vectors_and_checks_sizes(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    source = _item2vec_checkpoint(tiny_dataset, tmp_path / "i2v")
    cfg = build(model_config_class("sasrec"), {"name": "sasrec", "d": 16, "n_heads": 1}, "model")
    target = build_model(cfg, tiny_dataset.n_items, 8)
    init_item_embeddings(target, tmp_path / "i2v", tiny_dataset)
    torch.testing.assert_close(target.item_embeddings(), source.item_emb.weight)
    wide = build_model(build(model_config_class("sasrec"), {"name": "sasrec", "d": 32}, "model"),
                       tiny_dataset.n_items, 8)
    with pytest.raises(SeqrecError, match=r"model\.d to 16"):
        init_item_embeddings(wide, tmp_path / "i2v", tiny_dataset)
    cosine = build_model(build(model_config_class("item2vec"), {"name": "item2vec", "d": 16}, "model"),
                         tiny_dataset.n_items, 8)
    with pytest.raises(SeqrecError, match="computes its item table"):  # a normalised copy, not a parameter
        init_item_embeddings(cosine, tmp_path / "i2v", tiny_dataset)
    _item2vec_checkpoint(tiny_dataset, tmp_path / "other", fingerprint="0123456789abcdef")
    with pytest.raises(SeqrecError, match="fingerprint"):
        init_item_embeddings(target, tmp_path / "other", tiny_dataset)


def test_bert4rec_item_table_from_an_item2vec_run_through_fit(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    from seqrec.config import resolve

    common = [f'data.dataset="{tiny_dataset.path}"', "data.max_len=8", "train.epochs=1", "train.progress=false",
              "model.d=16"]
    fit(resolve({}, [*common, 'model.name="item2vec"']), tiny_dataset, tmp_path / "i2v")
    results = fit(resolve({}, [*common, 'model.name="bert4rec"', "train.lr=1e-9"]), tiny_dataset,
                  tmp_path / "b4r", init_items_from=tmp_path / "i2v")
    assert results["init_items_from"] == str(tmp_path / "i2v")
    from seqrec.train.checkpoint import load_checkpoint

    i2v, _ = load_checkpoint(tmp_path / "i2v" / "checkpoint")
    b4r, _ = load_checkpoint(tmp_path / "b4r" / "checkpoint")
    torch.testing.assert_close(b4r.item_embeddings(), i2v.item_emb.weight, atol=1e-6, rtol=0)  # type: ignore[union-attr]
