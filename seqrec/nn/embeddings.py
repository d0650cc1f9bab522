"""Position embeddings, learned or sinusoidal, indexed from the right end of a left-padded batch."""

from __future__ import annotations

import math

import torch
from torch import nn


def right_aligned_positions(width: int, max_len: int, device: torch.device) -> torch.Tensor:
    """(Lb,) position ids of a left-padded batch of width Lb: the last column is max_len - 1."""
    return torch.arange(max_len - width, max_len, device=device)


def position_ids(items: torch.Tensor, max_len: int, start: int | torch.Tensor = 0,
                 align: str = "end") -> torch.Tensor:
    """Position ids of a left-padded batch (B, L).

    align="end": counted from the right, the newest item is always max_len - 1 (L,), so every
    position moves when an event is appended. align="start": counted from each row's first real
    item, plus `start` (the number of earlier positions, for an incremental step) (B, L); earlier
    positions never move, which is what makes a KV cache exact. Padding gets position 0."""
    if align == "end":
        return right_aligned_positions(items.shape[1], max_len, items.device)
    if align != "start":
        raise ValueError(f"unknown position alignment {align!r}")
    return ((items != 0).cumsum(1) - 1).clamp(min=0) + start


class LearnedPositions(nn.Embedding):
    def __init__(self, max_len: int, d: int) -> None:
        super().__init__(max_len, d)


class SinusoidalPositions(nn.Module):
    """Fixed sin/cos table (Vaswani et al., 2017); nothing is learned."""

    def __init__(self, max_len: int, d: int) -> None:
        super().__init__()
        pos = torch.arange(max_len, dtype=torch.float32)[:, None]
        freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
        table = torch.zeros(max_len, d)
        table[:, 0::2] = torch.sin(pos * freq)
        table[:, 1::2] = torch.cos(pos * freq[: d // 2])
        self.table: torch.Tensor
        self.register_buffer("table", table, persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.table[positions]


def make_positions(kind: str, max_len: int, d: int) -> nn.Module:
    if kind == "learned":
        return LearnedPositions(max_len, d)
    if kind == "sinusoidal":
        return SinusoidalPositions(max_len, d)
    raise ValueError(f"unknown position kind {kind!r}")


def output_layer(n_items: int, d: int, tied: bool, bias: bool,
                 init_std: float | None = None) -> tuple[nn.Embedding | None, nn.Parameter | None]:
    """The scoring side of an ID model: an untied output table (None when tied to the input
    table) and a per-item output bias (None when off), rows 0..N. `init_std`: normal init of the
    untied table, for models that do not initialise every module themselves."""
    out_emb = None if tied else nn.Embedding(n_items + 1, d, padding_idx=0)
    if out_emb is not None and init_std is not None:
        nn.init.normal_(out_emb.weight, std=init_std)
    return out_emb, (nn.Parameter(torch.zeros(n_items + 1)) if bias else None)
