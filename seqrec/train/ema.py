"""Exponential moving average of a model's weights (`train.ema`).

After every optimiser step the averaged copy moves towards the trained weights,

    w_avg <- d_t w_avg + (1 - d_t) w,    d_t = min(decay, (1 + t) / (10 + t)),

t the number of updates so far: the warm-up term keeps the first steps from tying the
average to the random initial weights (TensorFlow's ExponentialMovingAverage with
num_updates). Buffers (item counts, ...) are copied, not averaged. Validation, the saved
checkpoint, a refit's tested model and the test all use the averaged weights; training
goes on with the raw ones. The average smooths the sharp validation peak of models that
overfit within a few epochs (full-softmax SASRec on sparse data).
"""

from __future__ import annotations

import copy

import torch

from seqrec.models.base import SequentialModel


class WeightAverage:
    def __init__(self, model: SequentialModel, decay: float) -> None:
        self.decay, self.updates = decay, 0
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)

    def rate(self) -> float:
        """The decay of the coming update."""
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self, model: SequentialModel) -> None:
        avg: list[torch.Tensor] = list(self.model.parameters())
        torch._foreach_lerp_(avg, [p.detach() for p in model.parameters()], 1.0 - self.rate())
        for mine, theirs in zip(self.model.buffers(), model.buffers(), strict=True):
            mine.copy_(theirs)
        self.updates += 1
