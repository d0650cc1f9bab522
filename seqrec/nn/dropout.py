"""Dropout with a faster CPU path.

On CPU, `torch.nn.Dropout` draws its mask with `bernoulli_`, one generator call
per element: in a small SASRec on ml-100k that was a large share of a training
step. Here the keep-mask comes from random bytes instead: 64-bit random words
viewed as bytes, eight mask entries per draw. The drop
probability is therefore quantised to a multiple of 1/256 (0.2 becomes 51/256 =
0.199), and kept values are scaled by the exact inverse of the keep probability,
so the expectation is unchanged. On other devices, and for p = 0 or in eval
mode, this is plain `F.dropout`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def keep_ones(shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype,
              device: torch.device | str = "cpu") -> tuple[torch.Tensor, float]:
    """A tensor of 1 (kept) and 0 (dropped) with p' = p rounded to a multiple of 1/256 (at most 255/256)
    dropped, and the scale 1/(1 - p') of the kept values. The comparison writes straight into `dtype`:
    a bool mask converted afterwards costs twice the whole draw."""
    cut = min(round(p * 256), 255)
    n = math.prod(shape)
    words = torch.randint(-(2**63), 2**63 - 1, ((n + 7) // 8,), dtype=torch.int64, device=device)
    ones = torch.empty(shape, dtype=dtype, device=device)
    torch.ge(words.view(torch.uint8)[:n].view(shape), cut, out=ones)
    return ones, 256 / (256 - cut)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype,
              device: torch.device | str = "cpu") -> torch.Tensor:
    """A tensor of 0 (dropped) and 1/(1 - p') (kept): `keep_ones` times its scale."""
    ones, scale = keep_ones(shape, p, dtype, device)
    return ones.mul_(scale)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    return x * keep_mask(x.shape, p, x.dtype, x.device)


class Dropout(nn.Module):
    """Drop-in for `nn.Dropout` with the byte-mask CPU path above."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
