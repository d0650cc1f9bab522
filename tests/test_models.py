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

TINY = {
    "sasrec": {"d": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32, "dropout": 0.1, "attn_dropout": 0.1},
    "bert4rec": {"d": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32, "dropout": 0.1, "attn_dropout": 0.1,
                 "mask_prob": 0.3, "last_mask_share": 0.3},
    "gru4rec": {"d": 16, "dropout": 0.0},
    "item2vec": {"d": 16, "window": 2, "n_negatives": 3},
    # built without a dataset, UniSRec's text buffer is zeros: the contract runs it transductively (text + ID)
    "unisrec": {"d": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32, "dropout": 0.1, "attn_dropout": 0.1,
                "text_dim": 8, "n_experts": 2, "item_ids": True},
}
VARIANTS = [
    ("unisrec", {}),
    ("sasrec", {}),
    ("sasrec", {"norm_first": False, "output_bias": True, "positions": "sinusoidal"}),
    ("sasrec", {"norm_first": False, "input_norm": True, "emb_scale": False}),  # RecBole's layout
    ("sasrec", {"loss": "bce", "n_negatives": 3}),
    ("sasrec", {"loss": "sampled_softmax", "n_negatives": 8, "negatives": "popularity", "logq": True}),
    ("sasrec", {"loss": "gbce", "n_negatives": 4, "gbce_t": 0.5}),
    ("bert4rec", {}),
    ("bert4rec", {"positions": "sinusoidal", "norm_first": True}),
    ("gru4rec", {}),
    ("gru4rec", {"session_parallel": True, "loss": "sampled_softmax", "n_negatives": 8, "negatives": "popularity",
                 "logq": True}),
    ("item2vec", {}),
    ("item2vec", {"scoring": "dot", "dynamic_window": False}),
    ("sasrec", {"tied": False, "output_bias": False}),  # output-layer variants (tied + bias is the default)
    ("gru4rec", {"tied": False}),
    ("bert4rec", {"output_bias": False}),
    ("sasrec", {"history_bias": True}),  # learned offsets for items already in the history
    ("gru4rec", {"history_bias": True}),
    ("unisrec", {"history_bias": True}),
]
CAUSAL = ("sasrec", "gru4rec", "unisrec")
UNTIED = {("item2vec", "cosine"), ("unisrec", "cosine")}  # both score normalised copies of their item vectors
# BERT4Rec's cloze task learns slower than next-item prediction; SGNS wants a larger step
EPOCHS, LR = {"bert4rec": 60, "item2vec": 30}, {"item2vec": 3e-2}


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
    model.fit_data(tiny_dataset)
    opt = torch.optim.Adam(model.parameters(), lr=LR.get(name, 1e-2))
    batches = model.train_batches(tiny_dataset, 8, 16, 0) or TrainBatches(tiny_dataset, 8, 16, seed=0)

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
    for _ in range(EPOCHS.get(name, 16) - 1):
        last = epoch_loss()
    assert last < 0.7 * first
    # the +1 walk is learnable: validation recall@10 far above chance (10 / 30)
    metrics = evaluate(model, tiny_dataset, "valid", 8, EvalConfig(ks=[10]), torch.device("cpu"))
    assert metrics["recall@10"] > 0.8


@pytest.mark.parametrize(("name", "extra"), [v for v in VARIANTS if v[0] in CAUSAL])
def test_causal_models_do_not_see_the_future(name: str, extra: dict) -> None:
    model = make(name, extra).eval()
    a = torch.tensor([[0, 1, 2, 3, 4, 5]])
    b = a.clone()
    b[0, 4:] = torch.tensor([9, 10])  # change the later items
    ha, hb = model.hidden(a), model.hidden(b)  # type: ignore[operator]
    torch.testing.assert_close(ha[:, :4], hb[:, :4])
    assert not torch.allclose(ha[:, 4:], hb[:, 4:])


def test_sasrec_input_norm_normalises_item_plus_position() -> None:
    """With input_norm (and no sqrt(d) scaling) the blocks see LayerNorm(item + position): scaling both
    tables by the same factor changes nothing; without it, the same scaling changes the output."""
    a = torch.tensor([[0, 1, 2, 3, 4, 5]])
    for input_norm in (True, False):
        model = make("sasrec", {"input_norm": input_norm, "emb_scale": False}).eval()
        with torch.no_grad():  # unit-scale tables, so LayerNorm's eps is negligible
            model.item_emb.weight.normal_()
            model.pos_emb.weight.normal_()  # type: ignore[union-attr]
        before = model.hidden(a)  # type: ignore[operator]
        with torch.no_grad():
            model.item_emb.weight.mul_(7.0)
            model.pos_emb.weight.mul_(7.0)  # type: ignore[union-attr]
        after = model.hidden(a)  # type: ignore[operator]
        assert torch.allclose(before, after, atol=1e-4) == input_norm


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
    if (name, extra.get("scoring", "cosine")) in UNTIED or extra.get("tied") is False:
        pytest.skip("untied by construction (cosine scoring of a normalised copy, or tied=false)")
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


def test_bert4rec_masking_is_cloze_and_never_predicts_mask_or_padding() -> None:
    from seqrec.models.bert4rec import cloze_mask

    torch.manual_seed(0)
    seq = torch.tensor([[0, 0, 0, 4, 5], [1, 2, 3, 4, 5], [0, 0, 0, 0, 7]]).repeat(200, 1)
    inputs, targets = cloze_mask(seq, mask_token=31, p=0.2, last_share=0.25)
    masked = inputs == 31
    assert not masked[seq == 0].any()  # padding is never masked
    assert masked.any(1).all()  # at least one mask per sequence
    torch.testing.assert_close(targets, torch.where(masked, seq, 0))  # targets only where masked
    torch.testing.assert_close(inputs, torch.where(masked, 31, seq))
    only_last = masked[:, -1] & (masked.sum(1) == 1)
    assert 0.2 < only_last[1::3].float().mean() < 0.5  # the last-item share (+ chance single masks)
    model = make("bert4rec", {}).eval()
    batch = Batch(items=torch.tensor([[0, 0, 1, 2, 3], [1, 2, 3, 4, 5]]))
    assert model.score(batch).shape == (2, 31)  # rows 0..N: the mask token (31) has no score
    assert model.item_embeddings().shape[0] == model.mask_token  # type: ignore[attr-defined]
    # encode appends [MASK] after the history and reads its state: history changes move it
    other = Batch(items=torch.tensor([[0, 0, 1, 2, 9], [1, 2, 3, 4, 5]]))
    h1, h2 = model.encode(batch), model.encode(other)
    assert not torch.allclose(h1[0], h2[0]) and torch.allclose(h1[1], h2[1])


def test_gru4rec_padding_never_enters_the_state() -> None:
    model = make("gru4rec", {}).eval()
    short = model.hidden(torch.tensor([[3, 4, 5]]))  # type: ignore[operator]
    padded = model.hidden(torch.tensor([[0, 0, 3, 4, 5]]))  # type: ignore[operator]
    torch.testing.assert_close(short, padded[:, 2:])


def test_gru4rec_session_parallel_lanes_reset_between_sequences(tiny_dataset: PreparedDataset) -> None:
    from seqrec.models.gru4rec import SessionParallelBatches

    batches = SessionParallelBatches(tiny_dataset, max_len=8, batch_size=4, seed=0)
    n_train = int(tiny_dataset.train_end().sum())
    seen = sum(int((b.items != 0).sum()) for b in batches)
    targets = sum(int((b.targets != 0).sum()) for b in batches)  # type: ignore[union-attr]
    assert seen == n_train and targets == batches.n_targets
    model = make("gru4rec", {"session_parallel": True}).eval()
    # two sequences glued in one lane give the same states as each alone
    lane = model.hidden_with_resets(torch.tensor([[1, 2, 3, 7, 8]]), torch.tensor([[2, 3, 0, 8, 9]]))  # type: ignore[operator]
    torch.testing.assert_close(lane[:, 3:], model.hidden(torch.tensor([[7, 8]])))  # type: ignore[operator]
    torch.testing.assert_close(lane[:, :3], model.hidden(torch.tensor([[1, 2, 3]])))  # type: ignore[operator]


def test_fit_feeds_gru4rec_session_parallel_batches(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    from seqrec.config import resolve
    from seqrec.train.loop import fit

    cfg = resolve({}, [f'data.dataset="{tiny_dataset.path}"', "data.max_len=8", 'model.name="gru4rec"',
                       "model.d=16", "model.session_parallel=true", "train.epochs=1", "train.progress=false"])
    results = fit(cfg, tiny_dataset, tmp_path / "run")
    assert results["checkpoint"]["epoch"] == 1 and 0 <= results["test"]["recall@10"] <= 1


def test_refit_trains_on_validation_events_and_tests_the_refit(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    from seqrec.config import resolve
    from seqrec.train.checkpoint import load_checkpoint
    from seqrec.train.loop import fit

    full = tiny_dataset.with_valid_as_training()
    assert (full.train_end() == tiny_dataset.split[:, 1]).all()  # the validation event is now a training target
    assert (TrainBatches(full, 8, 16, seed=0).n_targets
            == TrainBatches(tiny_dataset, 8, 16, seed=0).n_targets + int((tiny_dataset.split[:, 0] >= 0).sum()))
    sets = [f'data.dataset="{tiny_dataset.path}"', "data.max_len=8", 'model.name="sasrec"', "model.d=16",
            "train.epochs=2", "train.patience=5", "train.progress=false"]
    plain = fit(resolve({}, [*sets, "train.refit=false"]), tiny_dataset, tmp_path / "plain")
    assert not plain["protocol"]["refit"]
    refit = fit(resolve({}, [*sets, "train.refit=true"]), tiny_dataset, tmp_path / "refit")
    assert refit["protocol"]["refit"] and "trained again" in refit["protocol"]["model_selection"]
    # validation metrics come from the same validation-chosen model, the test from a different one
    assert refit["valid"] == plain["valid"] and refit["checkpoint"] == plain["checkpoint"]
    selected, _ = load_checkpoint(tmp_path / "refit" / "checkpoint-selected", "cpu")
    tested, meta = load_checkpoint(tmp_path / "refit" / "checkpoint", "cpu")
    assert meta["refit"] and meta["epoch"] == refit["checkpoint"]["epoch"]
    assert not torch.equal(selected.item_embeddings(), tested.item_embeddings())


def test_refit_of_a_given_model_starts_from_its_weights(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    """A fine-tuning run hands `fit` a pre-trained model: the refit must start from it, not from noise."""
    from seqrec.config import resolve
    from seqrec.registry import build_model_for
    from seqrec.train.checkpoint import load_checkpoint
    from seqrec.train.loop import fit

    sets = [f'data.dataset="{tiny_dataset.path}"', "data.max_len=8", 'model.name="sasrec"', "model.d=16",
            "train.epochs=2", "train.patience=5", "train.progress=false", "train.refit=true"]
    cfg = resolve({}, sets)
    given = build_model_for(cfg.model, tiny_dataset, 8, cfg.features)
    marker = next(p for name, p in given.named_parameters() if name.endswith("pos_emb.weight"))
    with torch.no_grad():
        marker.fill_(0.5)
    marker.requires_grad_(False)  # frozen: a refit that starts from `given` keeps the marker as it is
    fit(cfg, tiny_dataset, tmp_path / "run", model=given)
    tested, meta = load_checkpoint(tmp_path / "run" / "checkpoint", "cpu")
    assert meta["refit"]
    assert torch.all(dict(tested.named_parameters())[next(n for n, _ in given.named_parameters()
                                                          if n.endswith("pos_emb.weight"))] == 0.5)


@pytest.mark.parametrize("norm_first", [True, False])
def test_last_position_only_equals_the_full_stack(norm_first: bool) -> None:
    """Encoding a history runs the top block for the last position only: the same state as the full stack."""
    from seqrec.nn.transformer import Encoder, attention_mask

    torch.manual_seed(0)
    enc = Encoder(16, 3, 2, 32, 0.1, 0.1, norm_first).eval()
    items = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5], [0, 0, 0, 0, 9]])
    x = torch.randn(3, 5, 16) * (items != 0).unsqueeze(-1)
    mask = attention_mask(items, causal=True)
    full, last = enc(x, mask)[:, -1:], enc(x, mask, last_only=True)
    assert last.shape == (3, 1, 16) and torch.allclose(full, last, atol=1e-6)
