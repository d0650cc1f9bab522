"""Sparse item-table gradients (seqrec.train.sparse): the same gradient as the dense path, Adam's update
on the rows a batch touched and nothing on the others, clipping over dense and sparse together."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seqrec.cli import main
from seqrec.config import resolve
from seqrec.data.batching import TrainBatches
from seqrec.data.dataset import PreparedDataset
from seqrec.models.sasrec import SASRec, SASRecConfig
from seqrec.train import auto
from seqrec.train.auto import resolve_auto_train
from seqrec.train.sparse import SparseRowsAdam, SparseRowsAdamW, clip_grad_norm, use_sparse_rows


def sampled_model(tiny_dataset: PreparedDataset, tied: bool = True) -> SASRec:
    torch.manual_seed(0)
    cfg = SASRecConfig(d=8, n_layers=1, n_heads=1, d_ff=16, dropout=0.0, attn_dropout=0.0, loss="sampled_softmax",
                       n_negatives=7, tied=tied)
    model = SASRec(cfg, tiny_dataset.n_items, 8)
    model.fit_data(tiny_dataset)
    return model


@pytest.mark.parametrize("tied", [True, False])
def test_sparse_gradient_equals_the_dense_one(tiny_dataset: PreparedDataset, tied: bool) -> None:
    batch = next(iter(TrainBatches(tiny_dataset, 8, 16, seed=0)))
    grads = []
    for sparse in (False, True):
        model = sampled_model(tiny_dataset, tied)
        if sparse:
            assert use_sparse_rows(model) == (1 if tied else 2)
        torch.manual_seed(1)  # the same negatives
        model.loss(batch).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    dense, sparse = grads
    assert sparse["item_emb.weight"].is_sparse and not dense["item_emb.weight"].is_sparse
    for name, g in dense.items():
        torch.testing.assert_close(sparse[name].to_dense() if sparse[name].is_sparse else sparse[name], g)


@pytest.mark.parametrize(("sparse_kind", "dense_kind", "wd"), [(SparseRowsAdam, torch.optim.Adam, 0.01),
                                                               (SparseRowsAdamW, torch.optim.AdamW, 0.1)])
def test_rows_update_is_adams_on_touched_rows_and_nothing_elsewhere(sparse_kind: type, dense_kind: type,
                                                                   wd: float) -> None:
    torch.manual_seed(0)
    start = torch.randn(6, 3)
    touched = torch.tensor([1, 4, 4, 2])
    a = torch.nn.Parameter(start.clone())  # rows 1, 2, 4 get gradients at every step
    b = torch.nn.Parameter(start[[1, 2, 4]].clone())  # the same rows, as a dense table of their own
    opt_a = sparse_kind([a], lr=0.05, weight_decay=wd)
    opt_b = dense_kind([b], lr=0.05, weight_decay=wd)
    for step in range(5):
        w = torch.randn(4, 3) * (step + 1)
        opt_a.zero_grad()
        (torch.nn.functional.embedding(touched, a, sparse=True) * w).sum().backward()
        opt_a.step()
        opt_b.zero_grad()
        (b[torch.tensor([0, 2, 2, 1])] * w).sum().backward()
        opt_b.step()
    torch.testing.assert_close(a.detach()[[1, 2, 4]], b.detach())
    assert torch.equal(a.detach()[[0, 3, 5]], start[[0, 3, 5]])  # untouched rows: not even decayed
    assert float(opt_a.state[a]["exp_avg"][[0, 3, 5]].abs().sum()) == 0.0


def test_clipping_dense_and_sparse_together() -> None:
    torch.manual_seed(0)
    table, dense = torch.nn.Parameter(torch.randn(5, 2)), torch.nn.Parameter(torch.randn(3))
    (torch.nn.functional.embedding(torch.tensor([0, 3]), table, sparse=True).sum() * 4 + (dense * 3).sum()).backward()
    want = torch.cat([table.grad.to_dense().flatten(), dense.grad]).norm()
    total = clip_grad_norm([table, dense], 1.0)
    assert float(total) == pytest.approx(float(want))
    got = torch.cat([table.grad.to_dense().flatten(), dense.grad]).norm()
    assert float(got) == pytest.approx(1.0, rel=1e-5)


def test_auto_turns_it_on_for_a_sampled_loss_over_a_large_catalogue(tiny_dataset: PreparedDataset,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    for loss, limit, expected in (("sampled_softmax", tiny_dataset.n_items, True),
                                  ("sampled_softmax", tiny_dataset.n_items + 1, False), ("ce", 1, False)):
        monkeypatch.setattr(auto, "SPARSE_ITEMS", limit)
        cfg = resolve({"model": {"name": "sasrec", "loss": loss}, "train": {"batch_size": 32}})
        decision = resolve_auto_train(cfg.model, cfg.train, 8, tiny_dataset, cpu)[-1]
        assert decision["key"] == "train.sparse_items" and cfg.train.sparse_items is expected
    for limit, expected in ((tiny_dataset.n_items, True), (tiny_dataset.n_items + 1, False)):  # item2vec: sampled
        monkeypatch.setattr(auto, "SPARSE_ITEMS", limit)
        cfg = resolve({"model": {"name": "item2vec"}, "train": {"batch_size": 32}})
        decision = resolve_auto_train(cfg.model, cfg.train, 8, tiny_dataset, cpu)[-1]
        assert cfg.train.sparse_items is expected and "full softmax" not in decision["reason"]
        assert ("item2vec's negative sampling" in decision["reason"]) is expected


def test_training_with_sparse_item_tables(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["train", "--dataset", str(tiny_dataset.path), "--model", "sasrec", "--out", str(out),
            "--set", 'model.loss="sampled_softmax"', "--set", "model.n_negatives=16", "--set", "model.d=8",
            "--set", "model.n_layers=1", "--set", "data.max_len=8", "--set", "train.epochs=3",
            "--set", "train.sparse_items=true", "--set", "train.progress=false", "--set", "train.refit=false"]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert json.loads((out / "config.json").read_text())["train"]["sparse_items"] is True
    assert results["epochs_run"] == 3 and results["test"]["ndcg@10"] >= 0
