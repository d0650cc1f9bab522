import pytest
import torch

from seqrec.nn.dropout import Dropout, keep_mask
from seqrec.nn.transformer import SelfAttention, attention_mask


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5])
def test_keep_mask_rate_and_scale(p: float) -> None:
    torch.manual_seed(0)
    m = keep_mask((4000, 100), p, torch.float32)
    cut = round(p * 256)
    kept = m > 0
    assert torch.allclose(m[kept], torch.tensor(256 / (256 - cut)))
    assert abs(kept.float().mean().item() - (1 - cut / 256)) < 0.003
    assert abs(m.mean().item() - 1.0) < 0.005  # expectation preserved
    # the bytes are not correlated with position: each column keeps about the same share
    assert (kept.float().mean(0) - kept.float().mean()).abs().max() < 0.05  # 6 sigma


def test_dropout_eval_is_identity_and_grad_is_the_mask() -> None:
    d = Dropout(0.3)
    x = torch.randn(8, 50, requires_grad=True)
    d.eval()
    assert torch.equal(d(x), x)
    d.train()
    torch.manual_seed(1)
    y = d(x)
    y.sum().backward()
    assert x.grad is not None
    assert torch.allclose(y, x.detach() * x.grad)  # y = x * mask, and d y / d x = mask
    assert 0.5 < (x.grad > 0).float().mean() < 0.9


def test_manual_attention_path_matches_sdpa() -> None:
    """The CPU training path (explicit softmax, byte-mask dropout) computes what SDPA computes."""
    torch.manual_seed(0)
    att = SelfAttention(16, 2, dropout=0.001)  # rounds to no dropped entries
    items = torch.tensor([[0, 0, 3, 4, 5], [1, 2, 3, 4, 5]])
    x = torch.randn(2, 5, 16)
    mask = attention_mask(items, causal=True)
    att.train()
    train_out = att(x, mask)
    att.eval()
    assert torch.allclose(train_out, att(x, mask), atol=1e-5)
