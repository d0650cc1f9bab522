"""Next-item losses, written once for every model.

Shapes: h (M, D) states at positions that have a target; W (N+1, D) item
vectors with row 0 = padding; b (N+1,) optional output bias; target (M,) in 1..N.
Logits are `h W^T + b` over items 1..N (padding never competes).

- `full_ce`: softmax cross-entropy over the whole catalogue. When M x N is
  large its log-partition is computed in item chunks by `ChunkedLogSumExp`, whose
  backward recomputes each chunk, so memory is O(M x chunk) instead of O(M x N).
  Optional per-row offsets on the row's history items (`seqrec.nn.history`) are
  added onto their items' logits where the logits are materialised, and exactly
  through a correction of the log-partition in the chunked path.
- `bce_negatives`: the original SASRec objective, binary cross-entropy of the
  positive against k uniformly sampled negatives (never the positive).
- `sampled_softmax`: softmax over the positive and k sampled negatives (shared by
  the batch, (k,), or per row, (M, k)), with optional logQ correction; negatives
  equal to the positive are removed ("accidental hits").
- `gbce`: gSASRec's generalised BCE, the positive's probability raised to beta.

Both binary losses add a constant `log(beta / k)` to every logit (beta = 1 for BCE),
the "prior" initialisation of RetinaNet (Lin et al., ICCV 2017) done as a fixed shift.
With k negatives per positive the loss of a model that scores every item alike is
smallest at that logit, so a freshly initialised model (logits near 0) starts there
instead of spending its first steps pushing every negative down. Without it, SASRec
with 16-256 negatives learned a large direction shared by all item vectors in the
first epoch and stayed at popularity-level ranking (Beauty valid NDCG@10 about .009
against .034 with the shift after 3 epochs). The shift is the same for every item,
so rankings, and therefore every metric, are unchanged by it; k = 1 BCE has shift 0.

Which one a model uses, and how its negatives are drawn, is `seqrec.nn.objective`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from seqrec.nn.history import add_offsets, distinct_offsets

CHUNK_ELEMENTS = 1 << 24  # logits materialised at once by the chunked path


def rows(W: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """W[idx]; a sparse gradient for an item table marked by `seqrec.train.sparse.use_sparse_rows`."""
    return F.embedding(idx, W, sparse=True) if getattr(W, "sparse_rows", False) else W[idx]


def _logits(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    if b is None:
        return h @ W.T
    if torch.is_autocast_enabled(h.device.type) or b.dtype != h.dtype:  # keep a float32 bias out of bf16
        return h @ W.T + b
    return torch.addmm(b, h, W.T)  # the bias added inside the product


class ChunkedLogSumExp(torch.autograd.Function):
    """(M,) log-sum-exp of the logits over items 1..N, streaming over item chunks."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, W: torch.Tensor, b: torch.Tensor, chunk: int) -> torch.Tensor:
        h32, lse = h.float(), torch.full((h.shape[0],), -torch.inf, device=h.device)
        for lo in range(1, W.shape[0], chunk):
            # under autocast the matmul may run in bf16; the log-sum-exp always runs in fp32
            logits = _logits(h32, W[lo : lo + chunk].float(), b[lo : lo + chunk].float()).float()
            lse = torch.logaddexp(lse, torch.logsumexp(logits, dim=1))
        ctx.save_for_backward(h, W, b, lse)
        ctx.chunk = chunk
        return lse

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, W, b, lse = ctx.saved_tensors
        h32 = h.float()
        gh = torch.zeros_like(h32)
        gW = torch.zeros(W.shape, dtype=torch.float32, device=W.device)
        gb = torch.zeros(b.shape, dtype=torch.float32, device=b.device)
        for lo in range(1, W.shape[0], ctx.chunk):
            Wc = W[lo : lo + ctx.chunk].float()
            p = torch.exp(_logits(h32, Wc, b[lo : lo + ctx.chunk].float()) - lse[:, None]) * grad[:, None]
            gh += p @ Wc
            gW[lo : lo + ctx.chunk] = p.T @ h32
            gb[lo : lo + ctx.chunk] = p.sum(0)
        return gh.to(h.dtype), gW.to(W.dtype), gb.to(b.dtype), None


def full_ce(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, target: torch.Tensor,
            chunk_elements: int = CHUNK_ELEMENTS,
            history: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Mean softmax cross-entropy; `history` = (x, v, z) adds offsets v to the logits of each row's
    history items x (seqrec.nn.history; z: their logits without offsets, which only the chunked path,
    without an (M, N) term, needs), exactly."""
    n_items = W.shape[0] - 1
    if h.shape[0] * n_items <= chunk_elements:
        logits = _logits(h, W[1:], None if b is None else b[1:]).float()
        if history is not None:  # the offsets go onto their items' logits (repeats add up), as in serving
            x, v, _ = history  # padding (x = 0) lands on item 1 with nothing, and no gradient to its v
            add_offsets(logits, (x - 1).clamp(min=0), v * (x != 0))
        return F.cross_entropy(logits, target - 1)
    chunk = max(1, chunk_elements // max(1, h.shape[0]))
    bias = b if b is not None else torch.zeros(W.shape[0], device=W.device, dtype=W.dtype)
    lse = ChunkedLogSumExp.apply(h, W, bias, chunk)
    pos = (h.float() * W[target].float()).sum(-1) + bias[target].float()
    if history is not None:  # without an (M, N) term: through the history items' own logits z
        lse, pos = with_history(lse, pos, target, *history)
    return (lse - pos).mean()


def with_history(lse: torch.Tensor, pos: torch.Tensor, target: torch.Tensor, x: torch.Tensor,
                 v: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-partition and target logit once offsets v (M, L) are added to the logits z (M, L) of the
    history items x (M, L; 0 = none; an item may repeat, its offsets add up):

        lse' = lse + log(1 + sum_j p_j (exp(u_j) - 1))    over distinct items j, p = softmax, u = total offset
    """
    u, first = distinct_offsets(x, v)  # each distinct item once, with its total offset
    p = torch.exp(z.double() - lse.double()[:, None])
    delta = (p * torch.expm1(u.double().clamp(max=60.0)) * first).sum(-1)
    # 1 + delta > 0 in exact arithmetic; the floor only guards rounding when history holds all the mass
    lse = lse + torch.log1p(delta.clamp(min=-1.0 + 1e-9)).to(lse.dtype)
    return lse, pos + (v * (x == target[:, None])).sum(-1).to(pos.dtype)


def uniform_negatives(target: torch.Tensor, n_items: int, k: int,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """(M, k) items drawn uniformly from 1..N without the row's positive."""
    offset = torch.randint(1, n_items, (target.shape[0], k), device=target.device, generator=generator)
    return (target[:, None] - 1 + offset) % n_items + 1


def prior_shift(beta: float, k: int) -> float:
    """The logit at which `beta * softplus(-s) + k * softplus(s)` is smallest: log(beta / k)."""
    return math.log(beta / k)


def bce_negatives(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, target: torch.Tensor,
                  negatives: torch.Tensor, shift: bool = True) -> torch.Tensor:
    """Binary cross-entropy: the positive against each of its k sampled negatives.

    `shift` adds log(1 / k) to every logit (see the module docstring); 0 for k = 1.
    """
    return _binary_loss(h, W, b, target, negatives, 1.0, shift)


def remove_accidental_hits(logits: torch.Tensor, negatives: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Set to -inf the (M, k) logits of negatives that equal the row's positive.

    negatives is (k,) shared by every row or (M, k) per row.
    """
    hits = (negatives[None, :] if negatives.dim() == 1 else negatives) == target[:, None]
    return logits.masked_fill(hits, -torch.inf)


def negative_logits(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None,
                    negatives: torch.Tensor) -> torch.Tensor:
    """(M, k) logits of negatives: (k,) shared by every row (one matmul) or (M, k) per row."""
    if negatives.dim() == 1:
        out = h @ rows(W, negatives).T
        return out if b is None else out + b[negatives]
    out = torch.einsum("md,mkd->mk", h, rows(W, negatives))
    return out if b is None else out + b[negatives]


def sampled_softmax(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, target: torch.Tensor,
                    negatives: torch.Tensor, log_q_target: torch.Tensor | None = None,
                    log_q_negatives: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax cross-entropy of the positive against k sampled negatives (Jean et al., 2015).

    With logQ correction (Bengio & Senecal 2008; Yi et al., RecSys 2019) every candidate's
    logit becomes `s_i - log Q(i)`, Q the sampling distribution, so that the sampled
    softmax estimates the full one; with uniform negatives the shift is a constant and
    changes nothing. Negatives equal to the positive are removed (logit -inf).
    """
    pos = (h * rows(W, target)).sum(-1) + (0 if b is None else b[target])  # (M,)
    neg = negative_logits(h, W, b, negatives)  # (M, k)
    if log_q_target is not None and log_q_negatives is not None:
        pos = pos - log_q_target
        neg = neg - (log_q_negatives[None, :] if log_q_negatives.dim() == 1 else log_q_negatives)
    neg = remove_accidental_hits(neg.float(), negatives, target)
    logits = torch.cat([pos.float()[:, None], neg], dim=1)  # (M, 1 + k): the positive is column 0
    return (torch.logsumexp(logits, dim=1) - logits[:, 0]).mean()


def gbce_beta(n_negatives: int, n_items: int, t: float) -> float:
    """gSASRec's positive exponent: alpha = k / (N - 1), beta = alpha (t (1 - 1/alpha) + 1/alpha)."""
    alpha = n_negatives / max(1, n_items - 1)
    return alpha * (t * (1 - 1 / alpha) + 1 / alpha)


def gbce(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, target: torch.Tensor,
         negatives: torch.Tensor, t: float, shift: bool = True) -> torch.Tensor:
    """Generalised BCE of gSASRec (Petrov & Macdonald, RecSys 2023).

        L = -log sigma(s+)^beta - sum_j log(1 - sigma(s-_j)),   beta from `gbce_beta`

    beta < 1 counters the overconfidence that k sampled negatives out of N induce;
    t = 0 gives beta = 1, plain BCE; t = 1 gives beta = alpha. The gSASRec code averages
    over the 1 + k columns; here the negatives are summed, as in `bce_negatives` (a
    constant factor 1 + k). `shift` adds log(beta / k) to every logit s (module docstring).
    """
    return _binary_loss(h, W, b, target, negatives, gbce_beta(negatives.shape[-1], W.shape[0] - 1, t), shift)


def _binary_loss(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, target: torch.Tensor,
                   negatives: torch.Tensor, beta: float, shift: bool) -> torch.Tensor:
    """Mean over rows of beta * softplus(-s+) + sum_j softplus(s-_j), negatives (k,) or (M, k).

    Negatives equal to the row's positive are left out of its sum.
    """
    s0 = prior_shift(beta, negatives.shape[-1]) if shift else 0.0
    pos = ((h * rows(W, target)).sum(-1) + (0 if b is None else b[target])).float() + s0
    neg = negative_logits(h, W, b, negatives).float() + s0
    hits = (negatives[None, :] if negatives.dim() == 1 else negatives) == target[:, None]
    neg_loss = F.softplus(neg).masked_fill(hits, 0.0).sum(-1)  # -log(1 - sigma(s)) = softplus(s)
    return (beta * F.softplus(-pos) + neg_loss).mean()  # -log sigma(s) = softplus(-s)
