"""The contract every sequential model meets.

    encode(batch)      -> (B, D)   the state that predicts the next item
    item_embeddings()  -> (N+1, D) what states are scored against (row 0 = padding)
    item_bias()        -> (N+1,)   output bias added to scores, or None
    loss(batch)        -> scalar   the training objective

Ranking, evaluation, checkpoints and serving are written once against these.
"""

from __future__ import annotations

import torch
from torch import nn

from seqrec.data.batching import Batch


class SequentialModel(nn.Module):
    name: str = ""

    def encode(self, batch: Batch) -> torch.Tensor:
        raise NotImplementedError  # abstract: each model defines it

    def item_embeddings(self) -> torch.Tensor:
        raise NotImplementedError  # abstract: each model defines it

    def item_bias(self) -> torch.Tensor | None:
        return None

    def loss(self, batch: Batch) -> torch.Tensor:
        raise NotImplementedError  # abstract: each model defines it

    @torch.no_grad()
    def score(self, batch: Batch) -> torch.Tensor:
        """(B, N+1) scores of every item for each row of the batch."""
        scores = self.encode(batch) @ self.item_embeddings().T
        bias = self.item_bias()
        return scores if bias is None else scores + bias
