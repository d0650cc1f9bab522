import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from seqrec.nn.losses import (
    ChunkedLogSumExp,
    bce_negatives,
    full_ce,
    gbce,
    gbce_beta,
    sampled_softmax,
    uniform_negatives,
)
from seqrec.nn.objective import Objective


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
    out = full_ce(h, W, b, target, chunk_elements=13 * 7)  # chunks of 7 items
    gout = torch.autograd.grad(out, (h, W, b))
    torch.testing.assert_close(out, ref)
    for g1, g2 in zip(gout, gref, strict=True):
        torch.testing.assert_close(g1, g2)
    # the log-partition alone, through the chunked function
    lse = ChunkedLogSumExp.apply(h, W, b, 7)
    torch.testing.assert_close(lse, torch.logsumexp(h @ W[1:].T + b[1:], dim=1))


def test_bce_hand_computed() -> None:
    h = torch.tensor([[1.0, 0.0]])
    W = torch.tensor([[0.0, 0.0], [2.0, 0.0], [-1.0, 0.0]])
    loss = bce_negatives(h, W, None, torch.tensor([1]), torch.tensor([[2]]))  # k = 1: shift log(1/1) = 0
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
        out = full_ce(h, W, b, target, chunk_elements=64 * 500)
    assert out.dtype == torch.float32
    assert abs(out.item() - ref.item()) < 0.05 * ref.item()


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_sampled_softmax_hand_computed_with_and_without_logq() -> None:
    # logits: positive e1 -> 1, negatives e2 -> 0, e3 -> 2 (shared by the row)
    h = torch.tensor([[1.0, 0.0]])
    W = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    neg = torch.tensor([2, 3])
    plain = sampled_softmax(h, W, None, torch.tensor([1]), neg)
    assert plain.item() == pytest.approx(-math.log(math.e / (math.e + 1 + math.e**2)), rel=1e-6)
    # logQ: Q = (pad 0, 0.5, 0.25, 0.25) -> logits 1 - log .5, 0 - log .25, 2 - log .25
    log_q = torch.log(torch.tensor([1e-9, 0.5, 0.25, 0.25]))
    corrected = sampled_softmax(h, W, None, torch.tensor([1]), neg, log_q[torch.tensor([1])], log_q[neg])
    z = [1 - math.log(0.5), -math.log(0.25), 2 - math.log(0.25)]
    expected = -z[0] + math.log(sum(math.exp(v) for v in z))
    assert corrected.item() == pytest.approx(expected, rel=1e-6)


def test_sampled_softmax_removes_accidental_hits_and_takes_per_row_negatives() -> None:
    h = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    W = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    # row 0's positive is 1, row 1's is 2; shared negatives [1, 2] hit each row's own positive
    shared = sampled_softmax(h, W, None, torch.tensor([1, 2]), torch.tensor([1, 2]))
    # row 0: candidates pos 1 (logit 1), neg 2 (logit 0); row 1: pos 2 (logit 1), neg 1 (logit 0)
    assert shared.item() == pytest.approx(-math.log(math.e / (math.e + 1)), rel=1e-6)
    per_row = sampled_softmax(h, W, None, torch.tensor([1, 2]), torch.tensor([[3], [3]]))
    row0 = -math.log(math.e / (math.e + math.e**2))  # neg 3 -> 2
    row1 = -math.log(math.e / (math.e + 1))  # neg 3 -> 0
    assert per_row.item() == pytest.approx((row0 + row1) / 2, rel=1e-6)


def test_gbce_hand_computed() -> None:
    # N = 5 items, k = 2 negatives: alpha = 2 / 4 = 0.5; t = 0.5 -> beta = 0.5 (0.5 (1 - 2) + 2) = 0.75
    assert gbce_beta(2, 5, 0.5) == pytest.approx(0.75)
    assert gbce_beta(2, 5, 0.0) == pytest.approx(1.0)  # t = 0: plain BCE
    assert gbce_beta(2, 5, 1.0) == pytest.approx(0.5)  # t = 1: beta = alpha
    h = torch.tensor([[1.0, 0.0]])
    W = torch.tensor([[0.0, 0.0], [2.0, 0.0], [-1.0, 0.0], [0.5, 0.0], [0.0, 0.0], [0.0, 0.0]])
    loss = gbce(h, W, None, torch.tensor([1]), torch.tensor([[2, 3]]), t=0.5, shift=False)
    expected = -0.75 * math.log(_sig(2.0)) - math.log(1 - _sig(-1.0)) - math.log(1 - _sig(0.5))
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # with the shift every logit moves by log(beta / k) = log(0.375)
    s0 = math.log(0.375)
    shifted = -0.75 * math.log(_sig(2.0 + s0)) - math.log(1 - _sig(-1.0 + s0)) - math.log(1 - _sig(0.5 + s0))
    assert gbce(h, W, None, torch.tensor([1]), torch.tensor([[2, 3]]), t=0.5).item() == pytest.approx(shifted, rel=1e-6)
    # t = 0 is the BCE of `bce_negatives`
    for shift in (False, True):
        torch.testing.assert_close(gbce(h, W, None, torch.tensor([1]), torch.tensor([[2, 3]]), t=0.0, shift=shift),
                                   bce_negatives(h, W, None, torch.tensor([1]), torch.tensor([[2, 3]]), shift=shift))


@pytest.mark.parametrize(("k", "t"), [(1, 0.0), (16, 0.0), (256, 0.75)])
def test_prior_shift_puts_a_constant_scorer_at_the_loss_minimum(k: int, t: float) -> None:
    # a model that scores every item 0 (a fresh one) gets zero gradient on the shared logit:
    # beta sigma(-s0) = k sigma(s0) at s0 = log(beta / k), e.g. k = 16 BCE: sigma(s0) = 1/17
    n_items = 1000
    beta = gbce_beta(k, n_items, t)
    h = torch.zeros(3, 4)
    W = torch.zeros(n_items + 1, 4)
    b = torch.zeros(n_items + 1, requires_grad=True)
    target = torch.tensor([1, 2, 3])
    negatives = uniform_negatives(target, n_items, k, generator=torch.Generator().manual_seed(0))
    loss = gbce(h, W, b, target, negatives, t)
    (grad,) = torch.autograd.grad(loss, b)
    assert abs(grad.sum().item()) < 1e-6  # the shared shift direction is already optimal
    expected = beta * math.log1p(k / beta) + k * math.log1p(beta / k)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    # without the shift the same scorer sits far from it (k log 2 from the negatives alone)
    assert gbce(h, W, None, target, negatives, t, shift=False).item() > expected + (k - 1) * 0.3


def _gsasrec_reference(pos: torch.Tensor, neg: torch.Tensor, beta: float) -> torch.Tensor:
    """gBCE as the gSASRec code writes it: the positive logit replaced by log(1 / (sigma^-beta - 1)),
    then plain BCE-with-logits over [positive, negatives], averaged over the 1 + k columns."""
    p = torch.sigmoid(pos.double())
    pos_t = torch.log(1.0 / (p.pow(-beta) - 1.0))
    logits = torch.cat([pos_t[:, None], neg.double()], dim=1)
    labels = torch.zeros_like(logits)
    labels[:, 0] = 1.0
    return F.binary_cross_entropy_with_logits(logits, labels, reduction="none").mean(-1).mean()


def test_gbce_matches_the_gsasrec_reference_with_bias_and_several_rows() -> None:
    # 2 rows, N = 4 items, k = 2 per-row negatives; alpha = 2/3, t = 0.75 -> beta = 1 - 0.75 (1 - 2/3) = 0.75
    beta = gbce_beta(2, 4, 0.75)
    assert beta == pytest.approx(0.75)
    h = torch.tensor([[1.0, 0.5], [-0.5, 2.0]])
    W = torch.tensor([[0.0, 0.0], [1.0, 1.0], [-1.0, 0.0], [0.5, -1.0], [0.0, 2.0]])
    b = torch.tensor([0.0, 0.1, -0.2, 0.3, 0.0])
    target, negatives = torch.tensor([1, 4]), torch.tensor([[2, 3], [1, 3]])
    # hand-computed logits h.W + b: row 0: pos 1.6, negs -1.2, 0.3; row 1: pos 4.0, negs 1.6, -2.25 + 0.3
    pos, neg = torch.tensor([1.6, 4.0]), torch.tensor([[-1.2, 0.3], [1.6, -1.95]])
    by_hand = sum(-beta * math.log(_sig(p)) - sum(math.log(1 - _sig(n)) for n in ns)
                  for p, ns in zip(pos.tolist(), neg.tolist(), strict=True)) / 2
    loss = gbce(h, W, b, target, negatives, t=0.75, shift=False)
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)
    # the reference averages over the 1 + k columns, this one sums the negatives: a factor 1 + k
    assert loss.item() == pytest.approx(3 * _gsasrec_reference(pos, neg, beta).item(), rel=1e-6)


@pytest.mark.parametrize("loss", ["sampled_softmax", "bce", "gbce"])
@pytest.mark.parametrize("negatives", ["uniform", "popularity"])
def test_objective_negatives_never_count_the_positive(loss: str, negatives: str) -> None:
    """With every weight equal, a negative equal to the positive would change the loss value."""
    cfg = SimpleNamespace(loss=loss, n_negatives=50, negatives=negatives, logq=False, gbce_t=0.0)
    objective = Objective(cfg, n_items=3)
    objective.set_counts(np.array([0, 100, 1, 1]))  # item 1 is drawn almost always
    h, W = torch.zeros(64, 2), torch.zeros(4, 2)  # every logit 0
    target = torch.ones(64, dtype=torch.long)
    value = objective(h, W, None, target).item()
    if loss == "sampled_softmax":  # only draws of items 2 and 3 count; each adds exp(0) to the sum
        assert value < math.log(51)
    else:  # exactly k non-positive negatives per row, every logit at the shift log(1/50):
        # softplus(-s0) = log 51 for the positive, softplus(s0) = log(1 + 1/50) for each negative
        assert value == pytest.approx(math.log(51) + 50 * math.log1p(1 / 50), rel=1e-5)


def test_popularity_sampler_follows_training_counts() -> None:
    cfg = SimpleNamespace(loss="sampled_softmax", n_negatives=1, negatives="popularity", logq=True, gbce_t=0.0)
    objective = Objective(cfg, n_items=3)
    objective.set_counts(np.array([0, 7, 1, 0]))  # add-one smoothing: q = (8, 2, 1) / 11
    torch.testing.assert_close(objective.log_q()[1:].exp(), torch.tensor([8.0, 2.0, 1.0]) / 11)
    draws = objective.sample((20000,), torch.device("cpu"))
    assert draws.min() >= 1 and abs((draws == 1).float().mean().item() - 8 / 11) < 0.02
