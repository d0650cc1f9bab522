"""One contract suite run over every registered model."""

from pathlib import Path

import pytest
import torch

from seqrec.config import EvalConfig, build
from seqrec.data.batching import Batch, TrainBatches
from seqrec.data.dataset import PreparedDataset
from seqrec.eval.evaluate import evaluate
from seqrec.registry import MODELS, build_model, model_config_class
from seqrec.train.checkpoint import load_checkpoint, save_checkpoint

TINY = {"sasrec": {"d": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32, "dropout": 0.1, "attn_dropout": 0.1}}
VARIANTS = [
    ("sasrec", {}),
    ("sasrec", {"norm_first": False, "output_bias": True, "positions": "sinusoidal"}),
    ("sasrec", {"loss": "bce", "n_negatives": 3}),
]


def make(name: str, extra: dict, n_items: int = 30, max_len: int = 8):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    cfg = build(model_config_class(name), {"name": name, **TINY[name], **extra}, "model")
    return build_model(cfg, n_items, max_len)


def test_every_registered_model_has_a_tiny_config() -> None:
    assert set(MODELS) <= set(TINY)


@pytest.mark.parametrize(("name", "extra"), VARIANTS)
def test_shapes_and_finite_loss(name: str, extra: dict) -> None:
    model = make(name, extra)
    items = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]])
    targets = torch.tensor([[0, 0, 4, 5, 6], [2, 3, 4, 5, 6]])
    batch = Batch(items=items, targets=targets)
    assert model.encode(batch).shape == (2, TINY[name]["d"])
    assert model.item_embeddings().shape == (31, TINY[name]["d"])
    assert model.score(batch).shape == (2, 31)
    assert torch.isfinite(model.loss(batch))


@pytest.mark.parametrize(("name", "extra"), VARIANTS)
def test_loss_falls_on_a_tiny_set(name: str, extra: dict, tiny_dataset: PreparedDataset) -> None:
    model = make(name, extra, n_items=tiny_dataset.n_items)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = TrainBatches(tiny_dataset, max_len=8, batch_size=16, seed=0)

    def epoch_loss() -> float:
        losses = []
        for b in batches:
            loss = model.loss(b)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return sum(losses) / len(losses)

    first = epoch_loss()
    for _ in range(15):
        last = epoch_loss()
    assert last < 0.7 * first
    # the +1 walk is learnable: validation recall@10 far above chance (10 / 30)
    metrics = evaluate(model, tiny_dataset, "valid", 8, EvalConfig(ks=[10]), torch.device("cpu"))
    assert metrics["recall@10"] > 0.8


@pytest.mark.parametrize(("name", "extra"), [v for v in VARIANTS if v[0] in ("sasrec",)])
def test_causal_models_do_not_see_the_future(name: str, extra: dict) -> None:
    model = make(name, extra).eval()
    a = torch.tensor([[0, 1, 2, 3, 4, 5]])
    b = a.clone()
    b[0, 4:] = torch.tensor([9, 10])  # change the later items
    ha, hb = model.hidden(a), model.hidden(b)  # type: ignore[operator]
    torch.testing.assert_close(ha[:, :4], hb[:, :4])
    assert not torch.allclose(ha[:, 4:], hb[:, 4:])


@pytest.mark.parametrize(("name", "extra"), VARIANTS)
def test_save_load_gives_identical_scores(name: str, extra: dict, tmp_path: Path,
                                          tiny_dataset: PreparedDataset) -> None:
    model = make(name, extra, n_items=tiny_dataset.n_items).eval()
    with torch.no_grad():
        model.item_embeddings().add_(0.01 * torch.randn_like(model.item_embeddings()))
    save_checkpoint(model, tmp_path / "ckpt", max_len=8, item_table=tiny_dataset.item_table)
    loaded, meta = load_checkpoint(tmp_path / "ckpt")
    batch = Batch(items=torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]]))
    torch.testing.assert_close(model.score(batch), loaded.score(batch), rtol=0, atol=0)
    assert meta["model"] == name


@pytest.mark.parametrize(("name", "extra"), VARIANTS)
def test_tied_weights_stay_tied(name: str, extra: dict, tmp_path: Path, tiny_dataset: PreparedDataset) -> None:
    model = make(name, extra, n_items=tiny_dataset.n_items)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for b in TrainBatches(tiny_dataset, max_len=8, batch_size=16, seed=0):
        opt.zero_grad()
        model.loss(b).backward()
        opt.step()
    assert model.item_embeddings().data_ptr() == model.item_emb.weight.data_ptr()  # type: ignore[union-attr]
    save_checkpoint(model, tmp_path / "c", max_len=8, item_table=tiny_dataset.item_table)
    loaded, _ = load_checkpoint(tmp_path / "c")
    assert loaded.item_embeddings().data_ptr() == loaded.item_emb.weight.data_ptr()  # type: ignore[union-attr]
