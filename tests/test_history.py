"""The learned history bias: exact loss, the same scores in training, evaluation and serving, and learning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from seqrec.config import build
from seqrec.data.batching import Batch
from seqrec.data.dataset import PreparedDataset
from seqrec.errors import SeqrecError
from seqrec.eval.ranking import rank_targets
from seqrec.nn.history import HistoryBias, add_offsets
from seqrec.nn.losses import full_ce
from seqrec.registry import build_model, model_config_class


def dense_reference(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor, target: torch.Tensor,
                    x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with the offsets written into a dense (M, N+1) logit matrix."""
    logits = (h @ W.T + b).scatter_add(1, x, v)  # x = 0 adds to padding, dropped below
    return F.cross_entropy(logits[:, 1:], target - 1)


@pytest.mark.parametrize("chunk_elements", [1 << 24, 30])  # the dense path and the chunked one
def test_history_offsets_enter_the_softmax_exactly(chunk_elements: int) -> None:
    torch.manual_seed(0)
    M, L, N, D = 6, 5, 12, 4
    h = torch.randn(M, D, requires_grad=True)
    W = torch.randn(N + 1, D, requires_grad=True)
    b = torch.randn(N + 1, requires_grad=True)
    x = torch.randint(0, N + 1, (M, L))
    x[0] = torch.tensor([3, 3, 5, 3, 0])  # a repeated item: its offsets add up
    x[1] = 0  # a row without history
    v = torch.randn(M, L).mul(3.0).mul(x != 0).requires_grad_()
    target = torch.randint(1, N + 1, (M,))
    target[0] = 3  # the target itself is in the history
    z = (h[:, None, :] * W[x]).sum(-1) + b[x]
    out = full_ce(h, W, b, target, chunk_elements=chunk_elements, history=(x, v, z))
    ref = dense_reference(h, W, b, target, x, v)
    torch.testing.assert_close(out, ref)
    for g1, g2 in zip(torch.autograd.grad(out, (h, W, b, v)), torch.autograd.grad(ref, (h, W, b, v)), strict=True):
        torch.testing.assert_close(g1, g2)


def test_zero_offsets_change_nothing() -> None:
    torch.manual_seed(1)
    h, W, b = torch.randn(4, 3), torch.randn(9, 3), torch.randn(9)
    target, x = torch.randint(1, 9, (4,)), torch.randint(0, 9, (4, 6))
    z = (h[:, None, :] * W[x]).sum(-1) + b[x]
    plain = full_ce(h, W, b, target)
    torch.testing.assert_close(full_ce(h, W, b, target, history=(x, torch.zeros(4, 6), z)), plain)


def sasrec(n_items: int = 20, max_len: int = 6, **extra: object):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    cfg = build(model_config_class("sasrec"), {"name": "sasrec", "d": 8, "n_heads": 1, "d_ff": 16,
                                                "dropout": 0.0, "attn_dropout": 0.0, "history_bias": True,
                                                **extra}, "model")
    return build_model(cfg, n_items, max_len)


def test_training_loss_is_the_mean_of_each_prefix_scored_as_at_serving() -> None:
    """Every training position t gets exactly the offsets that serving gives its prefix s_1..s_t."""
    model = sasrec().eval()
    with torch.no_grad():
        model.history.theta.normal_()  # type: ignore[union-attr]
    items = torch.tensor([[0, 4, 7, 4, 9, 2], [3, 5, 3, 3, 8, 1]])
    targets = torch.tensor([[0, 7, 4, 9, 2, 4], [5, 3, 3, 8, 1, 6]])
    loss = model.loss(Batch(items=items, targets=targets))
    states = model.hidden(items)  # type: ignore[operator]
    W, b = model.item_embeddings(), model.item_bias()
    per_prefix = []
    for row in range(2):
        for t in range(6):
            if targets[row, t] == 0:
                continue
            prefix = torch.zeros_like(items[row : row + 1])
            prefix[0, 5 - t :] = items[row, : t + 1]  # left-padded, newest last
            scores = (states[row, t] @ W.T + b)[None]
            scores = add_offsets(scores, prefix, model.history_offsets(prefix))  # type: ignore[arg-type]
            per_prefix.append(F.cross_entropy(scores[:, 1:], targets[row, t : t + 1] - 1))
    torch.testing.assert_close(loss, torch.stack(per_prefix).mean())


def test_offsets_are_causal_and_depend_on_recency() -> None:
    bias = HistoryBias(max_len=4)
    with torch.no_grad():
        bias.theta.copy_(torch.tensor([-0.3, -0.2, -0.1, 0.05]))
    items = torch.tensor([[0, 2, 5, 7]])
    states, W = torch.randn(1, 4, 3), torch.randn(9, 3)
    keep = torch.ones(1, 4, dtype=torch.bool)
    x, v, _ = bias.training_rows(states, items, W, None, keep)
    assert x.tolist() == [[0, 0, 0, 0], [0, 2, 0, 0], [0, 2, 5, 0], [0, 2, 5, 7]]  # never a later item
    torch.testing.assert_close(v[3], torch.tensor([0.0, -1.0, -2.0, -3.0]))  # beta[2], beta[1], beta[0]
    torch.testing.assert_close(bias.offsets(items), v[3:4])


def test_evaluation_ranks_with_the_offsets() -> None:
    h, emb = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0], [3.0, 0.0], [2.0, 0.0], [1.0, 0.0]])
    history = torch.tensor([[0, 1]])
    assert rank_targets(h, torch.tensor([2]), emb, history=history).item() == 2  # item 1 scores higher
    offsets = torch.tensor([[0.0, -5.0]])
    assert rank_targets(h, torch.tensor([2]), emb, history=history, offsets=offsets).item() == 1
    assert rank_targets(h, torch.tensor([1]), emb, history=history, offsets=offsets).item() == 3
    scores = add_offsets(torch.zeros(1, 4), torch.tensor([[1, 1, 3]]), torch.tensor([[1.0, 2.0, 0.5]]))
    assert scores.tolist() == [[0.0, 3.0, 0.0, 0.5]]


@pytest.mark.parametrize(("repeat", "sign"), [(False, -1), (True, 1)])
def test_the_bias_learns_whether_users_come_back(repeat: bool, sign: int) -> None:
    """Without repeats in the data the newest item's offset goes down; when the next item is always the
    last one again, it goes up."""
    model = sasrec(n_items=30, max_len=6, d=8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        seq = torch.stack([torch.randperm(30, generator=g)[:7] + 1 for _ in range(32)])  # no repeats
        items, targets = seq[:, :6], seq[:, 1:]
        if repeat:
            targets = items.clone()
        opt.zero_grad()
        model.loss(Batch(items=items, targets=targets)).backward()
        opt.step()
    assert sign * float(model.history.beta()[0].detach()) > 1.0  # type: ignore[union-attr]


def test_recommender_index_path_matches_exact_with_a_history_bias(tiny_dataset: PreparedDataset,
                                                                  tmp_path: Path) -> None:
    from seqrec.serve import Recommender
    from seqrec.train.checkpoint import save_checkpoint

    model = sasrec(n_items=tiny_dataset.n_items, max_len=8)
    with torch.no_grad():
        model.history.theta.copy_(torch.linspace(2.0, -2.0, 8))  # type: ignore[union-attr]  # both signs
    save_checkpoint(model, tmp_path / "ckpt", max_len=8, item_table=tiny_dataset.item_table)
    exact = Recommender.from_run(tmp_path / "ckpt")
    approx = Recommender.from_run(tmp_path / "ckpt")
    approx.use_index("ivf", n_lists=4, n_probe=4)
    longer = [f"i{j}" for j in range(1, 12)]  # 11 items: the oldest 3 are outside the model's window of 8
    for history, seen in ((["i1", "i2", "i3"], False), (["i4", "i5", "i4"], False), (["i4", "i5"], True),
                          (longer, False)):
        a = exact.recommend(history, k=6, exclude_seen=seen)
        b = approx.recommend(history, k=6, exclude_seen=seen)
        assert [r.item for r in a] == [r.item for r in b]
        assert [r.score for r in a] == pytest.approx([r.score for r in b], abs=1e-5)
    top = exact.recommend(["i1", "i2", "i3"], k=1)[0]
    assert top.item == "i3"  # beta[0] = +20: the newest item comes back first


def test_a_batch_of_top_k_equals_every_item_scored_with_its_offsets(tiny_dataset: PreparedDataset,
                                                                    tmp_path: Path) -> None:
    """Recommender.top_k merges each window's items, scored with their summed offsets, into the
    search for a whole batch at once: against every item scored by hand (h . v_i + b_i + the offsets of
    the positions holding i), with repeats in a window, a removed item, and a row that excludes its own."""
    from seqrec.serve import Recommender
    from seqrec.train.checkpoint import save_checkpoint

    model = sasrec(n_items=tiny_dataset.n_items, max_len=8)
    with torch.no_grad():
        model.history.theta.copy_(torch.linspace(2.0, -2.0, 8))  # type: ignore[union-attr]
    save_checkpoint(model, tmp_path / "ckpt", max_len=8, item_table=tiny_dataset.item_table)
    rec = Recommender.from_run(tmp_path / "ckpt")
    rec.remove_items(["i5"])
    histories = [rec.to_indices(h) for h in (["i1", "i2", "i3"], ["i4", "i5", "i4", "i6"], ["i7"] * 3, ["i2", "i9"])]
    states, batch = rec.encode(histories)
    n = rec.catalogue.n_active
    found = [(torch.tensor([x.score for x in recs]), torch.tensor([rec.index[x.item] for x in recs]))
             for recs in rec.top_k(states, batch.items, n, [None, None, None, histories[3]])]
    offsets = rec.model.history_offsets(batch.items)
    vectors, bias = rec.catalogue.vectors, rec.catalogue.bias
    for r, (values, ids) in enumerate(found):
        want = states[r].float() @ vectors.T + (0 if bias is None else bias)
        if r < 3:
            for pos, item in enumerate(batch.items[r].tolist()):
                want[item] += offsets[r, pos] if item else 0.0
        want[0] = -torch.inf
        want[rec.index["i5"]] = -torch.inf
        if r == 3:
            want[histories[3]] = -torch.inf
        keep = want > -torch.inf
        assert sorted(ids.tolist()) == sorted(torch.arange(len(want))[keep].tolist()), r
        torch.testing.assert_close(values, want[ids], atol=1e-5, rtol=0)
        assert (values[:-1] >= values[1:]).all()


def test_history_bias_needs_the_full_softmax_and_whole_sequences() -> None:
    with pytest.raises(SeqrecError, match="history_bias"):
        sasrec(loss="bce")
    with pytest.raises(SeqrecError, match="history_bias"):
        build(model_config_class("gru4rec"), {"name": "gru4rec", "history_bias": True,
                                               "session_parallel": True}, "model")
