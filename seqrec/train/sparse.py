"""Sparse gradients for large item tables: only the rows a batch touched are updated.

With a sampled loss a step reads a few thousand rows of the item table (the batch's items, its
targets, the sampled negatives), yet a dense gradient is the size of the whole table: autograd
writes one per lookup and sums them, and the optimiser and the clipping read every row
(benchmarks/step_profile.py: at 430k items the backward pass is most of a step). With
`train.sparse_items`, the item tables (`SequentialModel.item_tables`) take sparse gradients
(`use_sparse_rows`; the lookups go through `seqrec.nn.losses.rows`), `SparseRowsAdam` /
`SparseRowsAdamW` update only the rows present in them (the moments of the other rows wait, as in
lazy Adam; weight decay reaches a row when it is updated), and `clip_grad_norm` clips dense and
sparse gradients together. Other parameters are updated by the usual fused Adam.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn


def use_sparse_rows(model: nn.Module) -> int:
    """Give `model`'s item tables sparse gradients; the number of tables switched."""
    tables: list[nn.Embedding] = getattr(model, "item_tables", list)()
    for table in tables:
        table.sparse = True
        table.weight.sparse_rows = True  # type: ignore[attr-defined]  # read by seqrec.nn.losses.rows
    return len(tables)


class _SparseRows:
    """Adam's update for parameters whose gradient is sparse, restricted to the rows in it."""

    decoupled = False  # AdamW: decay the weights; Adam: add the decay to the gradient

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        held = []
        for group in self.param_groups:  # type: ignore[attr-defined]
            for p in group["params"]:
                if p.grad is not None and p.grad.is_sparse:
                    self._rows_update(p, group)
                    held.append((p, p.grad))
                    p.grad = None  # the dense update below skips it
        try:
            return super().step(closure)  # type: ignore[misc]
        finally:
            for p, grad in held:
                p.grad = grad

    @torch.no_grad()
    def _rows_update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        state = self.state[p]  # type: ignore[attr-defined]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        assert p.grad is not None
        grad = p.grad.coalesce()
        idx, g = grad.indices()[0], grad.values()
        if idx.numel() == 0:
            return
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        state["step"] += 1
        step = state["step"]  # a tensor where the parameter lives: no wait for the device
        rows = p[idx]
        if wd and self.decoupled:
            rows = rows * (1 - lr * wd)
        elif wd:
            g = g + wd * rows
        m = state["exp_avg"][idx].mul_(b1).add_(g, alpha=1 - b1)
        v = state["exp_avg_sq"][idx].mul_(b2).addcmul_(g, g, value=1 - b2)
        state["exp_avg"][idx], state["exp_avg_sq"][idx] = m, v
        denom = (v / (1 - b2**step)).sqrt_().add_(eps)
        p[idx] = rows - lr * (m / (1 - b1**step)) / denom


class SparseRowsAdam(_SparseRows, torch.optim.Adam):
    pass


class SparseRowsAdamW(_SparseRows, torch.optim.AdamW):
    decoupled = True


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` for dense and sparse gradients together (the total L2 norm)."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    if not any(g.is_sparse for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    for p in params:
        if p.grad is not None and p.grad.is_sparse:
            p.grad = p.grad.coalesce()
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.stack([(g.values() if g.is_sparse else g).norm() for g in grads]).norm()
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        (g.values() if g.is_sparse else g).mul_(coef)
    return total
