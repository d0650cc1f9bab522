"""UniSRec: adaptors, contrastive losses, MoCo, text cache, fine-tuning and text-only new items."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from seqrec.config import EvalConfig
from seqrec.data.batching import TrainBatches
from seqrec.data.dataset import PreparedDataset
from seqrec.errors import SeqrecError
from seqrec.eval.evaluate import evaluate
from seqrec.models.unisrec import UniSRec, UniSRecConfig
from seqrec.nn.adaptors import MoEAdaptor, PWLayer, svd_whitening
from seqrec.nn.contrastive import KeyQueue, info_nce_in_batch, info_nce_queue, momentum_update
from seqrec.train.checkpoint import save_checkpoint
from seqrec.train.pretrain import PretrainConfig, Pretrainer, drop_items
from seqrec.train.transfer import finetune_config, finetune_model, recipe_model_settings
from tests.unisrec_helpers import TEXT_DIM, make_tiny_encoder


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_encoder(tmp_path_factory.mktemp("enc") / "tiny-bert")


def tiny_config(encoder: Path, **extra: object) -> UniSRecConfig:
    values = {"d": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "dropout": 0.1, "attn_dropout": 0.1,
              "n_experts": 3, "text_dim": TEXT_DIM, "text_encoder": str(encoder), "text_max_length": 16, **extra}
    return UniSRecConfig(**values)  # type: ignore[arg-type]


# ---- adaptors ------------------------------------------------------------------------------------

def test_gates_sum_to_one_and_are_noise_free_in_eval() -> None:
    torch.manual_seed(0)
    moe = MoEAdaptor(8, 4, n_experts=5, dropout=0.0)
    with torch.no_grad():
        moe.w_gate.normal_()
        moe.w_noise.normal_()
    x = torch.randn(32, 8)
    moe.train()
    noisy = moe.gates(x)
    torch.testing.assert_close(noisy.sum(-1), torch.ones(32))
    assert not torch.allclose(noisy, moe.gates(x))  # training: a fresh draw each call
    moe.eval()
    g = moe.gates(x)
    torch.testing.assert_close(g.sum(-1), torch.ones(32))
    torch.testing.assert_close(g, moe.gates(x), rtol=0, atol=0)
    torch.testing.assert_close(g, torch.softmax(x @ moe.w_gate, -1))
    # the output is the gate-weighted sum of the experts
    expected = sum(g[:, i : i + 1] * moe.experts[i](x) for i in range(5))
    torch.testing.assert_close(moe(x), expected)


def test_pw_layer_is_x_minus_b_times_w() -> None:
    layer = PWLayer(3, 2, dropout=0.0)
    with torch.no_grad():
        layer.bias.copy_(torch.tensor([1.0, 2.0, 3.0]))
        layer.lin.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]))
    out = layer(torch.tensor([[2.0, 2.0, 5.0]]))
    torch.testing.assert_close(out, torch.tensor([[1.0, 2.0]]))


def test_pw_layer_training_step_is_dropout_then_whitening() -> None:
    """The fast CPU path (bias and dropout scale moved past the product) is the textbook layer, draw for draw."""
    torch.manual_seed(0)
    layer = PWLayer(24, 8, dropout=0.2).train()
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(50, 24)
    torch.manual_seed(1)
    out = layer(x)
    torch.manual_seed(1)  # the same keep mask
    ref = layer.lin(layer.drop(x) - layer.bias)
    torch.testing.assert_close(out, ref)
    assert not torch.equal(out, layer.eval()(x))  # dropout did drop something
    grads = torch.autograd.grad(out.square().sum(), [layer.bias, layer.lin.weight])
    ref_grads = torch.autograd.grad(ref.square().sum(), [layer.bias, layer.lin.weight])
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)


def test_svd_whitening_gives_identity_covariance() -> None:
    g = torch.Generator().manual_seed(0)
    mixing = torch.randn(10, 10, generator=g)
    x = torch.randn(5000, 10, generator=g) @ mixing + 3.0  # correlated, off-centre
    mean, W = svd_whitening(x, 6)
    y = (x - mean) @ W
    torch.testing.assert_close(y.mean(0), torch.zeros(6), atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.cov(y.T), torch.eye(6), atol=1e-3, rtol=0)
    moe = MoEAdaptor(10, 6, n_experts=2, dropout=0.0)
    moe.init_whitening(x, torch.Generator().manual_seed(1))
    for expert in moe.experts:  # every expert whitens, each in its own rotation
        torch.testing.assert_close(torch.cov(expert(x).detach().T), torch.eye(6), atol=1e-3, rtol=0)
    assert not torch.allclose(moe.experts[0](x), moe.experts[1](x))


# ---- InfoNCE -------------------------------------------------------------------------------------

def test_in_batch_info_nce_matches_hand_computation_with_same_item_masking() -> None:
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    k = torch.tensor([[0.8, 0.6], [0.0, 1.0], [1.0, 0.0]])
    tau = 0.5
    s = ((q @ k.T) / tau).tolist()
    by_hand = [-(s[i][i] - math.log(sum(math.exp(s[i][j]) for j in range(3)))) for i in range(3)]
    assert info_nce_in_batch(q, k, tau).item() == pytest.approx(sum(by_hand) / 3, rel=1e-5)
    # rows 0 and 2 share their positive item: each is removed from the other's negatives, and the item's
    # key is the first row's (one vector per item)
    ids = torch.tensor([7, 8, 7])
    masked = [
        -(s[0][0] - math.log(math.exp(s[0][0]) + math.exp(s[0][1]))),
        -(s[1][1] - math.log(math.exp(s[1][0]) * 2 + math.exp(s[1][1]))),  # item 7 is two rows' positive
        -(s[2][0] - math.log(math.exp(s[2][0]) + math.exp(s[2][1]))),
    ]
    assert info_nce_in_batch(q, k, tau, ids).item() == pytest.approx(sum(masked) / 3, rel=1e-5)


def test_in_batch_info_nce_over_distinct_items_equals_the_loss_over_every_row() -> None:
    """The (M, U) loss over distinct items, with log counts, is the (M, M) one over every row's key when the
    rows of one item share its key: value and gradients, with history candidates."""
    torch.manual_seed(1)
    tau, n_items, m, width = 0.2, 6, 40, 5
    E = torch.randn(n_items + 1, 8, requires_grad=True)
    q = torch.randn(m, 8, requires_grad=True)
    ids = torch.randint(1, n_items + 1, (m,))
    x = torch.randint(0, n_items + 1, (m, width))
    v = torch.randn(m, width) * (x != 0)

    def dense() -> torch.Tensor:  # every row's key, the same item's other rows masked (the loss before)
        k, qn = F.normalize(E, dim=-1), F.normalize(q, dim=-1)
        z = torch.einsum("md,mld->ml", qn, k[x])
        logits = (qn @ k[ids].T) / tau
        eye = torch.eye(m, dtype=torch.bool)
        logits = logits.masked_fill((ids[:, None] == ids[None, :]) & ~eye, -torch.inf)
        hist = {(i, int(c)) for i in range(m) for c in x[i] if c}
        drop = torch.tensor([[(i, int(ids[j])) in hist and i != j for j in range(m)] for i in range(m)])
        total = torch.stack([(v[i][None, :] * (x[i][None, :] == x[i][:, None])).sum(1) for i in range(m)])
        firsts = torch.tensor([[bool(x[i, t]) and int(x[i, t]) not in x[i, :t].tolist() for t in range(width)]
                               for i in range(m)])
        cand = (z / tau + total).masked_fill(~firsts | (x == ids[:, None]), -torch.inf)
        positive = (v * (x == ids[:, None])).sum(1)
        logits = logits.masked_fill(drop, -torch.inf) + torch.diag(positive)
        return F.cross_entropy(torch.cat([logits, cand], 1), torch.arange(m))

    want = dense()
    want_grads = torch.autograd.grad(want, [E, q])
    k, qn = F.normalize(E, dim=-1), F.normalize(q, dim=-1)
    z = torch.einsum("md,mld->ml", qn, k[x])
    got = info_nce_in_batch(qn, k[ids], tau, ids, history=(x, v, z))
    got_grads = torch.autograd.grad(got, [E, q])
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_in_batch_info_nce_with_history_candidates_matches_brute_force() -> None:
    """Each row competes with the other rows' items and with its own history items (each distinct item
    once, with the sum of its offsets); a history item met in the batch is not counted twice."""
    torch.manual_seed(0)
    tau, n_items = 0.3, 9
    E = F.normalize(torch.randn(n_items + 1, 4), dim=-1)
    ids = torch.tensor([1, 2, 3, 2, 5])  # rows 1 and 3 share their positive
    x = torch.tensor([[0, 0, 4, 2], [0, 0, 0, 7], [3, 6, 6, 1], [0, 0, 0, 0], [8, 5, 1, 4]])  # row 2 repeats 6,
    # row 0's history holds 2 (another row's positive), row 2's and row 4's hold their own positives 3 and 5
    v = torch.randn(x.shape) * (x != 0)
    q = F.normalize(torch.randn(5, 4), dim=-1)
    k = E[ids]
    z = torch.einsum("md,mld->ml", q, E[x])
    got = info_nce_in_batch(q, k, tau, ids, history=(x, v, z))
    losses = []
    for i in range(5):
        offset = {}
        for item, off in zip(x[i].tolist(), v[i].tolist(), strict=True):
            if item:
                offset[item] = offset.get(item, 0.0) + off
        pos = float(q[i] @ k[i]) / tau + offset.get(int(ids[i]), 0.0)
        terms = [pos]
        terms += [float(q[i] @ k[j]) / tau for j in range(5)
                  if j != i and ids[j] != ids[i] and int(ids[j]) not in offset]
        terms += [float(q[i] @ E[c]) / tau + off for c, off in offset.items() if c != int(ids[i])]
        losses.append(math.log(sum(math.exp(t) for t in terms)) - pos)
    assert got.item() == pytest.approx(sum(losses) / 5, rel=1e-5)
    # no history: the plain in-batch loss
    empty = torch.zeros_like(x)
    plain = info_nce_in_batch(q, k, tau, ids, history=(empty, torch.zeros_like(v), torch.zeros_like(z)))
    assert plain.item() == pytest.approx(info_nce_in_batch(q, k, tau, ids).item(), rel=1e-6)


def test_queue_info_nce_matches_hand_computation() -> None:
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    k = torch.tensor([[0.6, 0.8], [0.0, 1.0]])
    queue = torch.tensor([[1.0, 0.0], [0.0, -1.0], [0.5, 0.5]])
    queue_ids, valid = torch.tensor([3, 4, -1]), torch.tensor([True, True, False])
    tau, ids = 0.2, torch.tensor([3, 9])
    pos = (q * k).sum(1) / tau
    neg = q @ queue.T / tau
    # row 0: queue slot 0 is the same item (3) and slot 2 is empty -> only slot 1 competes
    l0 = -(pos[0] - torch.logsumexp(torch.stack([pos[0], neg[0, 1]]), 0))
    l1 = -(pos[1] - torch.logsumexp(torch.stack([pos[1], neg[1, 0], neg[1, 1]]), 0))
    got = info_nce_queue(q, k, queue, tau, ids, queue_ids, valid)
    assert got.item() == pytest.approx(((l0 + l1) / 2).item(), rel=1e-5)


def test_key_queue_enqueues_and_dequeues_in_ring_order() -> None:
    queue = KeyQueue(4, 2)
    assert not queue.valid.any()
    queue.enqueue(torch.ones(3, 2), torch.tensor([1, 2, 3]))
    assert queue.valid.tolist() == [True, True, True, False] and queue.ptr == 3
    queue.enqueue(torch.full((2, 2), 2.0), torch.tensor([4, 5]))  # slot 3, then wraps over the oldest
    assert queue.ids.tolist() == [5, 2, 3, 4] and queue.ptr == 1
    assert queue.keys[:, 0].tolist() == [2.0, 1.0, 1.0, 2.0]
    queue.enqueue(torch.arange(12.0).view(6, 2), torch.arange(10, 16))  # more than fit: the newest 4
    assert sorted(queue.ids.tolist()) == [12, 13, 14, 15] and queue.valid.all()


# ---- model, pre-training, fine-tuning ------------------------------------------------------------

def test_drop_items_keeps_order_and_left_padding() -> None:
    items = torch.tensor([[0, 0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10]])
    out = drop_items(items, 0.5, torch.Generator().manual_seed(0))
    for row, orig in zip(out.tolist(), items.tolist(), strict=True):
        kept = [i for i in row if i]
        assert kept == [i for i in orig if i in kept] and kept  # order kept, never empty
        assert row[: len(row) - len(kept)] == [0] * (len(row) - len(kept))  # left-padded


def test_moco_key_encoder_gets_no_gradient_and_follows_by_momentum(
        tiny_dataset: PreparedDataset, encoder_dir: Path) -> None:
    torch.manual_seed(0)
    model = UniSRec.from_dataset(tiny_config(encoder_dir), tiny_dataset, 8)
    cfg = PretrainConfig(negatives="moco", queue_size=64, momentum=0.9, lam=0.1)
    text_view = model.text_emb + 0.01 * torch.randn_like(model.text_emb)
    trainer = Pretrainer(model, cfg, text_view)
    assert trainer.key_model is not None
    before = [p.clone() for p in trainer.key_model.parameters()]
    batch = next(iter(TrainBatches(tiny_dataset, 8, 16, seed=0)))
    si, ss = trainer.losses(batch)
    (si + cfg.lam * ss).backward()
    assert all(p.grad is None and not p.requires_grad for p in trainer.key_model.parameters())
    assert trainer.item_queue.valid.sum() == min(64, int((batch.targets != 0).sum()))  # type: ignore[union-attr]
    assert trainer.seq_queue.valid.sum() == len(batch.items)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    trainer.after_step()
    for b, p_k, p_o in zip(before, trainer.key_model.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p_k, 0.9 * b + 0.1 * p_o)
    momentum_update(model, trainer.key_model, 0.0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), trainer.key_model.parameters(), strict=True))


@pytest.mark.parametrize("setting", ["inductive", "transductive"])
def test_finetuning_changes_no_frozen_parameter(setting: str, tiny_dataset: PreparedDataset, encoder_dir: Path,
                                                tmp_path: Path) -> None:
    torch.manual_seed(0)
    pre = UniSRec.from_dataset(tiny_config(encoder_dir), tiny_dataset, 8)
    save_checkpoint(pre, tmp_path / "pre", max_len=8, item_table=tiny_dataset.item_table)
    model = finetune_model(tmp_path / "pre", tiny_dataset, finetune_config(tmp_path / "pre", setting), 8)  # type: ignore[arg-type]
    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    trained = {n: p.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert any(n.startswith("encoder.") for n in frozen) and "pos_emb.weight" in frozen
    assert all(n.startswith("adaptor.") or n == "item_emb.weight" for n in trained)
    assert ("item_emb.weight" in trained) == (setting == "transductive")
    for n, p in pre.state_dict().items():  # the shared weights came from the pre-trained model
        if n.startswith(("encoder.", "adaptor.", "pos_emb.")):
            torch.testing.assert_close(model.state_dict()[n], p)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for batch in TrainBatches(tiny_dataset, 8, 16, seed=0):
        opt.zero_grad()
        model.loss(batch).backward()
        opt.step()
    after = dict(model.named_parameters())
    assert all(torch.equal(p, after[n]) for n, p in frozen.items())
    assert any(not torch.equal(p, after[n]) for n, p in trained.items())


def test_adaptor_only_transfer_starts_a_fresh_transformer(tiny_dataset: PreparedDataset, encoder_dir: Path,
                                                         tmp_path: Path) -> None:
    torch.manual_seed(0)
    pre = UniSRec.from_dataset(tiny_config(encoder_dir), tiny_dataset, 8)
    with torch.no_grad():
        for p in pre.parameters():
            p.add_(0.5)  # far from any fresh initialisation
    save_checkpoint(pre, tmp_path / "pre", max_len=8, item_table=tiny_dataset.item_table)
    cfg = finetune_config(tmp_path / "pre", "inductive", {"freeze_encoder": False})
    model = finetune_model(tmp_path / "pre", tiny_dataset, cfg, 8, transfer="adaptor")
    shared = pre.state_dict()
    for n, p in model.state_dict().items():
        if n.startswith("adaptor."):
            torch.testing.assert_close(p, shared[n])
        elif n.startswith(("encoder.", "pos_emb.")) and p.is_floating_point() and p.numel() > 1:
            assert not torch.allclose(p, shared[n]), n
    with pytest.raises(SeqrecError, match="transfer"):
        finetune_model(tmp_path / "pre", tiny_dataset, cfg, 8, transfer="encoder")  # type: ignore[arg-type]


def test_new_item_is_ranked_from_its_text_alone(tiny_dataset: PreparedDataset, encoder_dir: Path,
                                                 tmp_path: Path) -> None:
    """Train, then add an item whose text is that of the true next item: it must rank with it, at the top."""
    from seqrec.serve import Recommender

    torch.manual_seed(0)
    cfg = tiny_config(encoder_dir, d=32, dropout=0.0, attn_dropout=0.0, adaptor_dropout=0.0)
    model = UniSRec.from_dataset(cfg, tiny_dataset, 8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        for batch in TrainBatches(tiny_dataset, 8, 16, seed=0):
            opt.zero_grad()
            model.loss(batch).backward()
            opt.step()
    assert evaluate(model, tiny_dataset, "valid", 8, EvalConfig(ks=[5]), torch.device("cpu"))["recall@5"] > 0.6
    save_checkpoint(model, tmp_path / "ckpt", max_len=8, item_table=tiny_dataset.item_table)
    rec = Recommender.from_run(tmp_path / "ckpt")
    history = ["i3", "i4", "i5", "i6"]
    top = rec.recommend(history, k=3)
    nxt = top[0].item
    text = tiny_dataset.item_table.filter(tiny_dataset.item_table["item"] == nxt)["title"][0]
    rec.add_items({"new-1": text, "new-2": "red blue glue tape saw"})
    assert rec.n_items == tiny_dataset.n_items + 2
    top2 = [r.item for r in rec.recommend(history, k=2)]
    assert set(top2) == {nxt, "new-1"}
    # a new item can be in the history and be the only candidate
    only = rec.recommend([*history, "new-2"], k=1, candidates=["new-1"])
    assert only[0].item == "new-1"
    ranked = rec.recommend(history, k=rec.n_items)
    assert ranked[-1].score <= ranked[0].score and len(ranked) == rec.n_items


def test_unisrec_checkpoint_is_self_contained(tiny_dataset: PreparedDataset, encoder_dir: Path,
                                               tmp_path: Path) -> None:
    from seqrec.data.batching import Batch
    from seqrec.train.checkpoint import load_checkpoint

    model = UniSRec.from_dataset(tiny_config(encoder_dir, item_ids=True), tiny_dataset, 8).eval()
    save_checkpoint(model, tmp_path / "c", max_len=8, item_table=tiny_dataset.item_table)
    loaded, _ = load_checkpoint(tmp_path / "c")
    torch.testing.assert_close(loaded.text_emb, model.text_emb, rtol=0, atol=0)
    batch = Batch(items=torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]]))
    torch.testing.assert_close(model.score(batch), loaded.score(batch), rtol=0, atol=0)
    h, v = model.encode(batch), model.item_embeddings()
    torch.testing.assert_close(h.norm(dim=-1), torch.ones(2))
    torch.testing.assert_close(F.normalize(v[1:], dim=-1) / 0.07, v[1:])


def test_finetune_setting_decides_the_id_table(tiny_dataset: PreparedDataset, encoder_dir: Path,
                                               tmp_path: Path) -> None:

    pre = UniSRec.from_dataset(tiny_config(encoder_dir), tiny_dataset, 8)
    save_checkpoint(pre, tmp_path / "pre", max_len=8, item_table=tiny_dataset.item_table)
    assert finetune_config(tmp_path / "pre", "transductive", {"dropout": 0.3}).item_ids
    with pytest.raises(SeqrecError, match="contradicts"):
        finetune_config(tmp_path / "pre", "transductive", {"item_ids": False})
    with pytest.raises(SeqrecError, match="max_len"):
        finetune_model(tmp_path / "pre", tiny_dataset, finetune_config(tmp_path / "pre", "inductive"), 12)


def test_a_recipe_for_another_size_fine_tunes_at_the_checkpoint_size(
        tiny_dataset: PreparedDataset, encoder_dir: Path, tmp_path: Path) -> None:
    """A recipe file's architecture (d, d_ff, ...) gives way to the checkpoint's; its other settings apply."""
    pre = UniSRec.from_dataset(tiny_config(encoder_dir), tiny_dataset, 8)  # d 16, d_ff 32
    save_checkpoint(pre, tmp_path / "pre", max_len=8, item_table=tiny_dataset.item_table)
    recipe = {"d": 64, "d_ff": 256, "n_layers": 1, "dropout": 0.4}
    kept = recipe_model_settings(tmp_path / "pre", recipe)
    assert kept == {"n_layers": 1, "dropout": 0.4}
    cfg = finetune_config(tmp_path / "pre", "inductive", kept)
    assert (cfg.d, cfg.d_ff, cfg.dropout) == (16, 32, 0.4)
    finetune_model(tmp_path / "pre", tiny_dataset, cfg, 8)  # the weights load
    with pytest.raises(SeqrecError, match="must match the pre-trained"):  # an explicit size that does not fit
        finetune_model(tmp_path / "pre", tiny_dataset, finetune_config(tmp_path / "pre", "inductive", recipe), 8)


def test_a_pretrained_history_bias_is_where_fine_tuning_starts(
        tiny_dataset: PreparedDataset, encoder_dir: Path, tmp_path: Path) -> None:
    pre = UniSRec.from_dataset(tiny_config(encoder_dir, history_bias=True), tiny_dataset, 8)
    with torch.no_grad():
        pre.history.theta.fill_(0.5)  # type: ignore[union-attr]  # what pre-training learned
    save_checkpoint(pre, tmp_path / "pre", max_len=8, item_table=tiny_dataset.item_table)
    model = finetune_model(tmp_path / "pre", tiny_dataset, finetune_config(tmp_path / "pre", "inductive"), 8)
    assert model.history is not None and model.history.theta.requires_grad
    assert torch.equal(model.history.theta.detach(), torch.full((8,), 0.5))
    adaptor_only = finetune_model(tmp_path / "pre", tiny_dataset, finetune_config(tmp_path / "pre", "inductive"), 8,
                                  transfer="adaptor")
    assert adaptor_only.history is not None and float(adaptor_only.history.theta.detach().abs().sum()) == 0.0
    without = finetune_model(tmp_path / "pre", tiny_dataset,
                             finetune_config(tmp_path / "pre", "inductive", {"history_bias": False}), 8)
    assert without.history is None
    plain = UniSRec.from_dataset(tiny_config(encoder_dir), tiny_dataset, 8)  # and from a model without one
    save_checkpoint(plain, tmp_path / "plain", max_len=8, item_table=tiny_dataset.item_table)
    cfg = finetune_config(tmp_path / "plain", "transductive", {"history_bias": True})
    assert finetune_model(tmp_path / "plain", tiny_dataset, cfg, 8).history is not None


def test_transductive_items_without_training_events_keep_a_zero_id_vector(
        tiny_dataset: PreparedDataset, encoder_dir: Path, tmp_path: Path) -> None:
    from seqrec.data.counts import train_item_counts
    from seqrec.eval.cold import cold_item_split

    data = cold_item_split(tiny_dataset, 0.3, 0, tmp_path / "cold")
    untrained = torch.as_tensor(train_item_counts(data) == 0)
    untrained[0] = False
    assert untrained.any()
    torch.manual_seed(0)
    model = UniSRec.from_dataset(tiny_config(encoder_dir, item_ids=True), data, 8)
    model.fit_data(data)
    assert model.item_emb is not None
    before = model.item_emb.weight.detach().clone()
    assert float(before[untrained].abs().sum()) == 0.0
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for batch in TrainBatches(data, 8, 16, seed=0):  # the full softmax reaches every item as a negative
        opt.zero_grad()
        model.loss(batch).backward()
        opt.step()
    after = model.item_emb.weight.detach()
    assert float(after[untrained].abs().sum()) == 0.0
    assert not torch.equal(after[~untrained], before[~untrained])


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("history_bias", [False, True])
def test_trained_softmax_leaves_items_without_training_events_out(
        tiny_dataset: PreparedDataset, encoder_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        chunked: bool, history_bias: bool) -> None:
    """softmax_items="trained": the loss is the softmax over the items with a training event (checked
    against that softmax written out, history offsets included), so cold items are never pushed down;
    "all" counts them too. Both ways of computing the softmax (at once, in chunks of items)."""
    import seqrec.nn.losses as losses_module
    from seqrec.data.counts import train_item_counts
    from seqrec.eval.cold import cold_item_split

    if chunked:
        monkeypatch.setattr(losses_module.full_ce, "__defaults__", (7, None))  # 7 logits at a time
    data = cold_item_split(tiny_dataset, 0.3, 0, tmp_path / "cold")
    trained = torch.as_tensor(train_item_counts(data) > 0)
    assert not trained[1:].all()
    batch = next(iter(TrainBatches(data, 8, 16, seed=0)))
    for which in ("trained", "all"):
        torch.manual_seed(0)
        model = UniSRec.from_dataset(tiny_config(encoder_dir, softmax_items=which, dropout=0.0, attn_dropout=0.0,
                                                 adaptor_dropout=0.0, gate_noise=False, history_bias=history_bias),
                                     data, 8)
        model.fit_data(data)
        if model.history is not None:
            with torch.no_grad():
                model.history.theta.normal_()  # offsets far from their start
        loss = model.loss(batch)
        has = batch.targets != 0
        states = F.normalize(model.hidden(batch.items), dim=-1)
        logits = (states @ model.item_embeddings().T)[has]  # (M, N+1)
        if model.history is not None:  # each row's offsets on the items it has seen, written out
            x, v, _ = model.history.training_rows(states, batch.items, model.item_embeddings(), None, has)
            logits = logits.scatter_add(1, x, v * (x != 0))
        keep = trained.clone() if which == "trained" else torch.ones_like(trained)
        keep[0] = False
        targets = batch.targets[has]
        expected = torch.logsumexp(logits[:, keep], 1) - logits.gather(1, targets[:, None])[:, 0]
        torch.testing.assert_close(loss, expected.mean(), rtol=1e-5, atol=1e-5)
    with pytest.raises(SeqrecError, match="softmax_items"):
        tiny_config(encoder_dir, softmax_items="some")


def test_text_centre_uses_each_catalogues_own_mean(tiny_dataset: PreparedDataset, encoder_dir: Path,
                                                   tmp_path: Path) -> None:
    """model.text_centre: the adaptor sees text less the catalogue's mean; the mean is the target's own
    after transfer (never the source's), checkpoints keep it, and an item added later is centred by it."""
    from seqrec.serve import Recommender
    from seqrec.train.checkpoint import load_checkpoint

    torch.manual_seed(0)
    cfg = tiny_config(encoder_dir, text_centre=True, adaptor_dropout=0.0)
    model = UniSRec.from_dataset(cfg, tiny_dataset, 8).eval()
    assert model.text_mean is not None
    torch.testing.assert_close(model.text_mean, model.text_emb[1:].mean(0))
    ids = torch.arange(1, tiny_dataset.n_items + 1)
    torch.testing.assert_close(model.embed_items(ids), model.adaptor(model.text_emb[1:] - model.text_mean))
    assert UniSRec.from_dataset(tiny_config(encoder_dir), tiny_dataset, 8).text_mean is None  # off by default

    with torch.no_grad():
        model.text_mean.add_(1.0)  # as if another catalogue's: transfer must not carry it
    save_checkpoint(model, tmp_path / "pre", max_len=8, item_table=tiny_dataset.item_table)
    loaded, _ = load_checkpoint(tmp_path / "pre")
    torch.testing.assert_close(loaded.text_mean, model.text_mean, rtol=0, atol=0)
    moved = finetune_model(tmp_path / "pre", tiny_dataset, finetune_config(tmp_path / "pre", "inductive"), 8)
    assert moved.text_mean is not None
    torch.testing.assert_close(moved.text_mean, moved.text_emb[1:].mean(0))

    rec = Recommender.from_run(tmp_path / "pre")  # a new item with an existing item's text scores as it does
    title = tiny_dataset.item_table.filter(tiny_dataset.item_table["item"] == "i5")["title"][0]
    rec.add_items({"twin": title})
    scores = {r.item: r.score for r in rec.recommend(["i1", "i2"], k=rec.n_items)}
    assert scores["twin"] == pytest.approx(scores["i5"], rel=1e-5)

    # a pre-training run centres each domain by its own mean: no mean for an item added to it by text
    save_checkpoint(model, tmp_path / "joint", max_len=8, item_table=tiny_dataset.item_table,
                    extra={"pretrain": {"datasets": ["a", "b"]}})
    with pytest.raises(SeqrecError, match="--dataset"):
        Recommender.from_run(tmp_path / "joint").add_items({"new": title})


def test_pretraining_centres_each_domain_by_its_own_mean(tiny_dataset: PreparedDataset, encoder_dir: Path) -> None:
    from seqrec.train.pretrain import join_domains

    for centre in (False, True):
        domains = join_domains([tiny_dataset, tiny_dataset], tiny_config(encoder_dir, text_centre=centre))
        n = tiny_dataset.n_items
        first, second = domains.text[1 : n + 1], domains.text[n + 1 :]
        torch.testing.assert_close(first, second)  # the same catalogue twice
        assert (first.mean(0).abs().max() < 1e-5) == centre


def test_pretraining_takes_each_domains_training_events_only(tiny_dataset: PreparedDataset, encoder_dir: Path,
                                                               tmp_path: Path) -> None:
    """The joint sequences are each user's training events (leave-one-out: all but the last two; a time split:
    nothing from after its validation cutoff, not even a user's first event there)."""
    import numpy as np

    from seqrec.data.prepare import PrepareOptions, prepare
    from seqrec.train.pretrain import join_domains
    from tests.conftest import synthetic_log

    timed = prepare(synthetic_log(n_users=80, seed=5), PrepareOptions(split="time"), tmp_path / "timed")
    domains = join_domains([tiny_dataset, timed], tiny_config(encoder_dir))
    joint, n = domains.data, tiny_dataset.n_items
    assert (joint.train_end() == joint.lengths).all()  # everything in it is training data
    ends = [d.train_end() for d in (tiny_dataset, timed)]
    assert int(joint.offsets[-1]) == sum(int(e.sum()) for e in ends)
    first = [tiny_dataset.items[o : o + e] for o, e in zip(tiny_dataset.offsets[:-1], ends[0], strict=True) if e]
    assert np.array_equal(joint.items[: int(ends[0].sum())], np.concatenate(first))
    assert timed.times is not None
    cutoff = timed.meta["options"]["valid_from"]
    late = timed.times[timed.offsets[:-1]] >= cutoff  # users whose first event is past the cutoff: left out
    assert late.any() and joint.n_users == int((ends[0] > 0).sum()) + int((ends[1] > 0).sum())
    second = joint.items[int(ends[0].sum()):] - n
    kept = np.concatenate([timed.items[o : o + e] for o, e in zip(timed.offsets[:-1], ends[1], strict=True) if e])
    assert np.array_equal(second, kept)


def test_pretraining_with_a_history_bias_learns_that_users_do_not_come_back(
        tiny_dataset: PreparedDataset, encoder_dir: Path) -> None:
    """tiny_dataset's users never repeat an item: the offset for history items goes down."""
    assert tiny_dataset.repeat_rates()["repeat_rate"] == 0.0
    from seqrec.train.pretrain import join_domains

    torch.manual_seed(0)
    cfg = tiny_config(encoder_dir, history_bias=True)
    domains = join_domains([tiny_dataset], cfg)
    model = UniSRec(cfg, domains.data.n_items, 8, domains.text)
    trainer = Pretrainer(model, PretrainConfig(batch_size=16), domains.text_word_drop)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        for batch in TrainBatches(domains.data, 8, 16, seed=0):
            si, ss = trainer.losses(batch)
            opt.zero_grad()
            (si + 1e-3 * ss).backward()
            opt.step()
    assert model.history is not None and float(model.history.beta().detach()[:3].max()) < -0.5
    with pytest.raises(SeqrecError, match="in-batch"):
        Pretrainer(model, PretrainConfig(negatives="moco"), domains.text_word_drop)


@pytest.mark.parametrize("which", ["trained", "all"])
def test_sampled_softmax_makes_vectors_for_the_items_in_play_only(
        tiny_dataset: PreparedDataset, encoder_dir: Path, tmp_path: Path, which: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """model.loss="sampled_softmax": the loss over the batch's targets and its popularity-drawn negatives
    (logQ-corrected; items the training softmax leaves out never count as negatives) equals that loss written
    out over the whole item table, while the adaptor only sees the items in play."""
    from seqrec.data.counts import train_item_counts
    from seqrec.eval.cold import cold_item_split
    from seqrec.nn.losses import sampled_softmax

    data = cold_item_split(tiny_dataset, 0.3, 0, tmp_path / "cold")
    batch = next(iter(TrainBatches(data, 8, 16, seed=0)))
    model = UniSRec.from_dataset(tiny_config(encoder_dir, loss="sampled_softmax", n_negatives=5, softmax_items=which,
                                             dropout=0.0, attn_dropout=0.0, adaptor_dropout=0.0, gate_noise=False,
                                             history_bias=False), data, 8)
    model.fit_data(data)
    counts = torch.as_tensor(train_item_counts(data), dtype=torch.float32)
    assert torch.equal(model.sampler.counts, counts)  # type: ignore[union-attr]
    seen: list[int] = []
    adaptor = model.adaptor.forward
    monkeypatch.setattr(model.adaptor, "forward", lambda x: seen.append(len(x)) or adaptor(x))
    torch.manual_seed(3)
    loss = model.loss(batch)
    has = batch.targets != 0
    targets = batch.targets[has]
    torch.manual_seed(3)
    neg = model.sampler.sample((5,), torch.device("cpu"))  # type: ignore[union-attr]
    assert seen[-1] == len(torch.unique(torch.cat([targets, neg])))  # not the whole catalogue
    states = F.normalize(model.hidden(batch.items), dim=-1)[has]
    bias = model.softmax_bias(model.n_items + 1, states.device)
    assert (bias is not None) is (which == "trained")
    log_q = model.sampler.log_q()  # type: ignore[union-attr]
    expected = sampled_softmax(states, model.item_embeddings(), bias, targets, neg, log_q[targets], log_q[neg])
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(SeqrecError, match=r"history_bias needs model.loss='ce'"):
        tiny_config(encoder_dir, loss="sampled_softmax", history_bias=True)
