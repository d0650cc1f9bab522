"""Text-vector adaptors of UniSRec (Hou et al., KDD 2022, Sec. 3.1).

    parametric whitening   x~_g = (x - b_g) W_g                       one expert
    MoE adaptor            v = sum_g softmax(x W_gate + ε ⊙ softplus(x W_noise))_g  x~_g
                           ε ~ N(0, 1) while training only; the gate is deterministic in eval
    classic whitening      x~ = (x - μ) U_k diag(S_k + eps)^-1/2      μ, U, S from the SVD of cov(x); not learned

Shapes: x (..., D_text) -> (..., D).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from seqrec.nn.dropout import Dropout, keep_ones


def svd_whitening(x: torch.Tensor, d_out: int, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean (D_text,), W (D_text, d_out)) such that (x - mean) @ W has identity covariance."""
    x = x.double()
    mean = x.mean(0)
    centred = x - mean
    cov = centred.T @ centred / max(1, x.shape[0] - 1)
    U, S, _ = torch.linalg.svd(cov)
    W = U[:, :d_out] / torch.sqrt(S[:d_out] + eps)
    return mean.float(), W.float()


class PWLayer(nn.Module):
    """Parametric whitening: (x - b) W, with dropout on the input.

    Training on CPU computes it as (x ⊙ kept) W · scale - b W: the same product, but the bias and
    the dropout scale never meet the (N, D_text) input, so a step over the whole item table makes
    no centred or scaled copy of it, and the bias's gradient is a (D_text,) product instead of the
    (N, D_text) one that flowing back through x - b would take. The keep mask is the draw `Dropout`
    makes (seqrec.nn.dropout). Elsewhere (evaluation, serving, CUDA) it is the textbook form, which
    is the more accurate in low precision when the text vectors share a large mean."""

    def __init__(self, d_in: int, d_out: int, dropout: float) -> None:
        super().__init__()
        self.drop = Dropout(dropout)
        self.bias = nn.Parameter(torch.zeros(d_in))
        self.lin = nn.Linear(d_in, d_out, bias=False)
        nn.init.normal_(self.lin.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.drop.p > 0 and x.device.type == "cpu":
            kept, scale = keep_ones(x.shape, self.drop.p, x.dtype, x.device)
            return self.lin(x * kept) * scale - self.lin(self.bias)
        return self.lin(self.drop(x) - self.bias)

    @torch.no_grad()
    def set_whitening(self, mean: torch.Tensor, W: torch.Tensor) -> None:
        self.bias.copy_(mean)
        self.lin.weight.copy_(W.T)  # Linear stores (d_out, d_in)


class MoEAdaptor(nn.Module):
    """G parametric-whitening experts mixed by a noisy softmax gate."""

    def __init__(self, d_in: int, d_out: int, n_experts: int, dropout: float, noise: bool = True) -> None:
        super().__init__()
        self.experts = nn.ModuleList(PWLayer(d_in, d_out, dropout) for _ in range(n_experts))
        self.w_gate = nn.Parameter(torch.zeros(d_in, n_experts))
        self.w_noise = nn.Parameter(torch.zeros(d_in, n_experts))
        self.noise = noise

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """(..., G) mixture weights; noisy only while training."""
        logits = x @ self.w_gate
        if self.noise and self.training:
            std = F.softplus(x @ self.w_noise) + 1e-2
            logits = logits + torch.randn_like(logits) * std
        return torch.softmax(logits, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts = torch.stack([e(x) for e in self.experts], dim=-2)  # (..., G, D)
        return (self.gates(x).unsqueeze(-1) * experts).sum(-2)

    @torch.no_grad()
    def init_whitening(self, x: torch.Tensor, generator: torch.Generator | None = None) -> None:
        """Every expert starts as a whitening of `x`, each in its own random rotation of the output
        (a rotation keeps the covariance identity and keeps experts distinct, so they can specialise)."""
        experts: list[PWLayer] = list(self.experts)  # type: ignore[arg-type]
        mean, W = svd_whitening(x, experts[0].lin.out_features)
        for expert in experts:
            Q, _ = torch.linalg.qr(torch.randn(W.shape[1], W.shape[1], generator=generator))
            expert.set_whitening(mean, W @ Q)


class Whitening(nn.Module):
    """Classic non-learned whitening (mean and SVD of the covariance), fitted once on the text table."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.mean: torch.Tensor
        self.W: torch.Tensor
        self.register_buffer("mean", torch.zeros(d_in))
        self.register_buffer("W", torch.zeros(d_in, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) @ self.W

    @torch.no_grad()
    def init_whitening(self, x: torch.Tensor, generator: torch.Generator | None = None) -> None:
        mean, W = svd_whitening(x, self.W.shape[1])
        self.mean.copy_(mean)
        self.W.copy_(W)
