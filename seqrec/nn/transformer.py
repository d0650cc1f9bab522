"""A Transformer encoder over left-padded item sequences (B, L, D).

`attention_mask` builds the (B, 1, L, L) boolean mask once per batch: a query
attends to real (non-padding) keys, only to earlier ones when causal, and
always to itself so that padding rows stay finite.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from seqrec.errors import SeqrecError
from seqrec.nn.dropout import Dropout, dropout


def check_encoder_config(cfg: Any) -> None:
    """Validate the Transformer keys a model config shares (called from its __post_init__)."""
    if cfg.d % cfg.n_heads:
        raise SeqrecError(f"model.d={cfg.d} must be divisible by model.n_heads={cfg.n_heads}")
    if not 0 <= cfg.dropout < 1 or not 0 <= cfg.attn_dropout < 1:
        raise SeqrecError("model.dropout and model.attn_dropout must be in [0, 1)")


def attention_mask(items: torch.Tensor, causal: bool) -> torch.Tensor:
    """(B, L) item ids -> (B, 1, L, L) bool, True = may attend."""
    L = items.shape[1]
    allowed = (items != 0)[:, None, None, :].expand(-1, 1, L, L)  # keys that are real items
    eye = torch.eye(L, dtype=torch.bool, device=items.device)
    if causal:
        allowed = allowed & torch.tril(torch.ones(L, L, dtype=torch.bool, device=items.device))
    return allowed | eye


class SelfAttention(nn.Module):
    def __init__(self, d: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if d % n_heads:
            raise ValueError(f"d={d} is not divisible by n_heads={n_heads}")
        self.n_heads, self.dropout = n_heads, dropout
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, D // self.n_heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, L, D/H)
        if self.training and self.dropout > 0 and x.device.type == "cpu":
            # SDPA draws its dropout mask with bernoulli_, slow on CPU: same computation, byte-mask dropout
            att = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = dropout(att, self.dropout, True) @ v
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
            )
        return self.out(y.transpose(1, 2).reshape(B, L, D))


class Block(nn.Module):
    """Self-attention + position-wise FFN, each with residual, dropout and LayerNorm.

    norm_first=True is pre-LN (x + f(LN(x))); False is the original post-LN (LN(x + f(x))).
    """

    def __init__(self, d: int, n_heads: int, d_ff: int, dropout: float, attn_dropout: float,
                 norm_first: bool) -> None:
        super().__init__()
        self.attn = SelfAttention(d, n_heads, attn_dropout)
        self.ffn = nn.Sequential(nn.Linear(d, d_ff), nn.GELU(), Dropout(dropout), nn.Linear(d_ff, d))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.drop = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.norm_first:
            x = x + self.drop(self.attn(self.ln1(x), mask))
            return x + self.drop(self.ffn(self.ln2(x)))
        x = self.ln1(x + self.drop(self.attn(x, mask)))
        return self.ln2(x + self.drop(self.ffn(x)))


class Encoder(nn.Module):
    """A stack of blocks; a final LayerNorm when pre-LN (post-LN blocks already end in one)."""

    def __init__(self, d: int, n_layers: int, n_heads: int, d_ff: int, dropout: float,
                 attn_dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            Block(d, n_heads, d_ff, dropout, attn_dropout, norm_first) for _ in range(n_layers)
        )
        self.final_ln = nn.LayerNorm(d) if norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, mask)
        return self.final_ln(x)
