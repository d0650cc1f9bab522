"""A Transformer encoder over left-padded item sequences (B, L, D).

`attention_mask` builds the (B, 1, L, L) boolean mask once per batch: a query
attends to real (non-padding) keys, only to earlier ones when causal, and
always to itself so that padding rows stay finite.

`Encoder.extend` is the causal stack run on T new positions after P cached ones:
each layer's keys and values of the past positions (a KV cache) are reused, so
an appended event costs one position of compute instead of re-encoding the
history. Exact only when the past positions do not change as events are
appended, i.e. positions counted from the start of the sequence
(`model.positions_from = "start"`); the past is all real items (no padding).
"""

from __future__ import annotations

from typing import Any, NamedTuple

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


class LayerCache(NamedTuple):
    """One layer's keys and values of the cached positions, each (B, H, P, D/H)."""

    k: torch.Tensor
    v: torch.Tensor


class SelfAttention(nn.Module):
    def __init__(self, d: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if d % n_heads:
            raise ValueError(f"d={d} is not divisible by n_heads={n_heads}")
        self.n_heads, self.dropout = n_heads, dropout
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """(B, L, D) -> (B, L, D), or (B, 1, D) for the last position only (keys and values still
        come from every position)."""
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, D // self.n_heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, L, D/H)
        if last_only:
            q, mask = q[:, :, -1:], mask[:, :, -1:]  # (B, H, 1, D/H), (B, 1, 1, L)
        if self.training and self.dropout > 0 and x.device.type == "cpu":
            # SDPA draws its dropout mask with bernoulli_, slow on CPU: same computation, byte-mask dropout
            att = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = dropout(att, self.dropout, True) @ v
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
            )
        return self.out(y.transpose(1, 2).reshape(B, q.shape[2], D))

    def extend(self, x: torch.Tensor, past: LayerCache | None) -> tuple[torch.Tensor, LayerCache]:
        """x (B, T, D) new positions after the P cached ones -> (B, T, D), the cache grown to P + T.
        New position t attends to every cached position and to new positions <= t."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, D // self.n_heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D/H)
        if past is not None:
            k, v = torch.cat([past.k, k], dim=2), torch.cat([past.v, v], dim=2)  # (B, H, P+T, D/H)
        P = k.shape[2] - T
        mask = torch.ones(T, P + T, dtype=torch.bool, device=x.device).tril(P)  # (T, P+T): causal on the new part
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(B, T, D)), LayerCache(k, v)


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

    def forward(self, x: torch.Tensor, mask: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """`last_only`: the block's output at the last position only (B, 1, D); what encoding a
        history needs from the top block, at a fraction of the attention and FFN work."""
        res = x[:, -1:] if last_only else x
        if self.norm_first:
            x = res + self.drop(self.attn(self.ln1(x), mask, last_only))
            return x + self.drop(self.ffn(self.ln2(x)))
        x = self.ln1(res + self.drop(self.attn(x, mask, last_only)))
        return self.ln2(x + self.drop(self.ffn(x)))

    def extend(self, x: torch.Tensor, past: LayerCache | None) -> tuple[torch.Tensor, LayerCache]:
        """`forward` for new positions after cached ones (inference: dropout is off)."""
        if self.norm_first:
            y, cache = self.attn.extend(self.ln1(x), past)
            x = x + y
            return x + self.ffn(self.ln2(x)), cache
        y, cache = self.attn.extend(x, past)
        x = self.ln1(x + y)
        return self.ln2(x + self.ffn(x)), cache


class Encoder(nn.Module):
    """A stack of blocks; a final LayerNorm when pre-LN (post-LN blocks already end in one)."""

    def __init__(self, d: int, n_layers: int, n_heads: int, d_ff: int, dropout: float,
                 attn_dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            Block(d, n_heads, d_ff, dropout, attn_dropout, norm_first) for _ in range(n_layers)
        )
        self.final_ln = nn.LayerNorm(d) if norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """(B, L, D) -> (B, L, D) states, or (B, 1, D) for the last position only."""
        top = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = block(x, mask, last_only and i == top)
        return self.final_ln(x)

    @torch.no_grad()
    def extend(self, x: torch.Tensor, cache: list[LayerCache] | None
               ) -> tuple[torch.Tensor, list[LayerCache]]:
        """x (B, T, D) inputs of T new positions -> their (B, T, D) states and the grown per-layer cache."""
        if self.training:
            raise RuntimeError("Encoder.extend is for inference; call .eval() first")
        grown = []
        for i, block in enumerate(self.blocks):
            assert isinstance(block, Block)
            x, layer = block.extend(x, None if cache is None else cache[i])
            grown.append(layer)
        return self.final_ln(x), grown


def extend_causal(model: Any, items: torch.Tensor, cache: tuple[list[LayerCache], int] | None
                  ) -> tuple[torch.Tensor, tuple[list[LayerCache], int]]:
    """The incremental step of a causal Transformer model with positions counted from the start:
    `model.inputs(items, positions)` builds its inputs, `model.encoder` is an `Encoder`.

    (B, T) new items after the n cached ones -> (B, D) state after the last of them, and the cache
    (per-layer keys and values, n + T). Beyond max_len the positions run out: the caller re-encodes."""
    layers, n = cache if cache is not None else (None, 0)
    T = items.shape[1]
    if n + T > model.max_len:
        raise SeqrecError(f"a cached history holds at most max_len={model.max_len} items (asked {n + T})")
    positions = torch.arange(n, n + T, device=items.device).expand_as(items)
    states, grown = model.encoder.extend(model.inputs(items, positions), layers)
    return states[:, -1], (grown, n + T)
