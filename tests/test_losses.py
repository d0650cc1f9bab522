import math

import pytest
import torch
import torch.nn.functional as F

from seqrec.nn.losses import ChunkedSoftmaxCE, bce_negatives, full_ce, uniform_negatives


def test_full_ce_hand_computed() -> None:
    # 2 items; h = [1, 0]; W rows: pad, e1 = [1, 0], e2 = [0, 1] -> logits [1, 0]
    h = torch.tensor([[1.0, 0.0]])
    W = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    expected = -math.log(math.e / (math.e + 1))
    assert full_ce(h, W, None, torch.tensor([1])).item() == pytest.approx(expected, abs=1e-6)
    b = torch.tensor([5.0, 0.0, 1.0])  # padding bias is ignored; item 2 gets +1
    assert full_ce(h, W, b, torch.tensor([1])).item() == pytest.approx(math.log(2), abs=1e-6)


def test_chunked_ce_matches_full_values_and_gradients() -> None:
    torch.manual_seed(0)
    h = torch.randn(13, 8, requires_grad=True)
    W = torch.randn(41, 8, requires_grad=True)
    b = torch.randn(41, requires_grad=True)
    target = torch.randint(1, 41, (13,))
    ref = F.cross_entropy(h @ W[1:].T + b[1:], target - 1)
    gref = torch.autograd.grad(ref, (h, W, b))
    out = ChunkedSoftmaxCE.apply(h, W, b, target, 7)
    gout = torch.autograd.grad(out, (h, W, b))
    torch.testing.assert_close(out, ref)
    for g1, g2 in zip(gout, gref, strict=True):
        torch.testing.assert_close(g1, g2)
    # full_ce switches to the chunked path when the logits would be large
    torch.testing.assert_close(full_ce(h, W, b, target, chunk_elements=50), ref)


def test_bce_hand_computed() -> None:
    h = torch.tensor([[1.0, 0.0]])
    W = torch.tensor([[0.0, 0.0], [2.0, 0.0], [-1.0, 0.0]])
    loss = bce_negatives(h, W, None, torch.tensor([1]), torch.tensor([[2]]))
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = -math.log(sig(2.0)) - math.log(1 - sig(-1.0))
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_uniform_negatives_never_the_positive_and_cover_the_rest() -> None:
    g = torch.Generator().manual_seed(0)
    target = torch.full((2000,), 3)
    neg = uniform_negatives(target, n_items=5, k=4, generator=g)
    assert (neg != 3).all() and neg.min() >= 1 and neg.max() <= 5
    assert set(neg.unique().tolist()) == {1, 2, 4, 5}


def test_chunked_ce_keeps_fp32_log_sum_exp_under_bf16_autocast() -> None:
    torch.manual_seed(0)
    h, W = torch.randn(64, 16), torch.randn(2001, 16)
    b, target = torch.zeros(2001), torch.randint(1, 2001, (64,))
    ref = F.cross_entropy(h @ W[1:].T, target - 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ChunkedSoftmaxCE.apply(h, W, b, target, 500)
    assert out.dtype == torch.float32
    assert abs(out.item() - ref.item()) < 0.05 * ref.item()
