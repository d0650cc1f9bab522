"""Data-parallel training when `torchrun` starts several processes.

    torchrun --nproc_per_node 2 -m seqrec.cli train --dataset ml-100k --model sasrec ...

Each process (rank) builds the same model, the same seeded batch order and the same
optimizer; DistributedDataParallel starts them from rank 0's weights and averages the
gradients of every step, so the replicas stay identical. Rank r trains on batches
r, r + W, r + 2W, ... of each epoch (W ranks, the same number on each), so an epoch still
visits every batch once and takes 1/W of the steps. Rank 0 alone evaluates, decides
early stopping (the decision is broadcast), and writes the run folder. Backend: NCCL with
one GPU per process when CUDA is available and asked for, gloo on CPU otherwise.
A single process (no WORLD_SIZE, or 1) is the plain loop, unchanged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from seqrec.data.batching import Batch
from seqrec.models.base import EpochBatches, SequentialModel


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (a no-op in a single process)."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


SINGLE = World()  # one process, no process group


def init_world(device_name: str) -> tuple[World, torch.device | None]:
    """The process group `torchrun` describes in the environment, and this rank's device
    (None: let the caller pick, as in a single process)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return SINGLE, None
    # "cuda" or "cuda:N": each rank takes its LOCAL_RANK's GPU; "auto": the same where there is CUDA
    use_cuda = torch.cuda.is_available() and (device_name == "auto" or device_name.startswith("cuda"))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    world = World(dist.get_rank(), dist.get_world_size())
    if not world.main:  # rank 0 speaks for the run (its epochs, auto decisions, refit); the others only warn
        logging.getLogger("seqrec").setLevel(max(logging.WARNING, logging.getLogger("seqrec").level))
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", world.rank)))
        torch.cuda.set_device(device)
        return world, device
    return world, torch.device("cpu")


class ShardedBatches:
    """Rank r's share of an epoch: batches r, r + W, ...; every rank gets len(batches) // W of them
    (the last few batches of an epoch are dropped so that no rank waits for a missing step)."""

    def __init__(self, batches: EpochBatches, world: World) -> None:
        self.batches, self.world = batches, world

    @property
    def rng(self) -> Any:  # the feeder's generator, for `seqrec.train.state`
        return getattr(self.batches, "rng", None)

    @property
    def n_targets(self) -> int:
        return self.batches.n_targets // self.world.size

    def __len__(self) -> int:
        return len(self.batches) // self.world.size

    def __iter__(self) -> Iterator[Batch]:
        stop = len(self) * self.world.size
        for i, batch in enumerate(self.batches):
            if i >= stop:
                break
            if i % self.world.size == self.world.rank:
                yield batch


class LossModule(nn.Module):
    """`model.loss` as a module's forward, which is what DistributedDataParallel synchronises."""

    def __init__(self, model: SequentialModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.model.loss(batch)


def loss_module(model: SequentialModel, world: World, device: torch.device) -> nn.Module:
    """What a training step calls: the model's loss, wrapped in DDP when there are several ranks."""
    module = LossModule(model)
    if not world.distributed:
        return module
    ids = [device.index] if device.type == "cuda" else None
    # a model whose loss may leave a parameter out (UniSRec's noise gate with gate_noise=false) has DDP look for
    # them each step; the others not (DDP would warn on every rank that it looked for nothing)
    unused = getattr(model, "may_leave_parameters_unused", True)
    return nn.parallel.DistributedDataParallel(module, device_ids=ids, find_unused_parameters=unused)
