"""One training epoch: the optimiser steps over an epoch's batches, with a progress bar on a terminal or a
progress line a minute elsewhere, ending early at a deadline (`train.time_budget_s`)."""

from __future__ import annotations

import dataclasses
import logging
import time

import torch
from tqdm.auto import tqdm

from seqrec.config import RunConfig
from seqrec.models.base import EpochBatches, SequentialModel
from seqrec.progress import ProgressLog
from seqrec.train.distributed import LossModule
from seqrec.train.ema import WeightAverage
from seqrec.train.sparse import clip_grad_norm

log = logging.getLogger(__name__)


@dataclasses.dataclass
class EpochStats:
    loss: float
    seconds: float
    targets_per_s: float
    cut: bool = False  # ended at the deadline, before its last batch


def train_epoch(model: SequentialModel, batches: EpochBatches, opt: torch.optim.Optimizer,
                cfg: RunConfig, device: torch.device, epoch: int, step: torch.nn.Module | None = None,
                ema: WeightAverage | None = None, deadline: float | None = None) -> EpochStats:
    """One pass over `batches`; `step(batch)` gives the loss (default `model.loss`; under torchrun, DDP);
    `ema`, if given, follows every optimiser step; past `deadline` (time.perf_counter()) the epoch ends
    after the step it is in. Without a progress bar on a terminal, `train.progress` logs a line a minute."""
    model.train()
    step = step or LossModule(model)
    # nothing in a step waits for the device: the loss is summed where it is computed and read once at
    # the end, targets are counted on the host (on CUDA a per-step `.item()` would stall the queue)
    total, n, seen, t0 = torch.zeros((), device=device), 0, 0, time.perf_counter()
    shown = t0  # the progress bar's numbers are refreshed once a second: reading the loss waits for the device
    # disable=None: bars on a terminal only (a log file gets the epoch lines, not the redrawn bars)
    bar = tqdm(batches, desc=f"epoch {epoch}", disable=None if cfg.train.progress else True, leave=False)
    cut, of = False, len(batches)
    progress = ProgressLog(bar, of, cfg.train.progress)
    for batch in bar:
        if batch.targets is not None:
            seen += int((batch.targets != 0).sum())
        batch = batch.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.train.bf16):
            loss = step(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.train.clip_grad > 0:
            clip_grad_norm(model.parameters(), cfg.train.clip_grad)
        opt.step()
        if ema is not None:
            ema.update(model)
        total, n = total + loss.detach().float(), n + 1
        now = time.perf_counter()
        if cfg.train.progress and now - shown > 1.0:
            shown = now
            bar.set_postfix(loss=f"{total.item() / n:.4f}", targets_per_s=f"{seen / (shown - t0):.0f}")
        if progress.due():
            log.info("epoch %d: %d of %d batches, loss %.4f, %.0f targets/s, about %.0f s to the epoch's end", epoch,
                     n, of, total.item() / n, seen / (now - t0), progress.left_s(n))
        if deadline is not None and now > deadline and n < of:
            cut = True
            break
    mean_loss = total.item() / max(1, n)
    seconds = time.perf_counter() - t0
    return EpochStats(mean_loss, seconds, seen / max(seconds, 1e-9) if cut else batches.n_targets / max(seconds, 1e-9),
                      cut)
