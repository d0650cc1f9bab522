"""The contract every sequential model meets.

    encode(batch)      -> (B, D)   the state that predicts the next item
    item_embeddings()  -> (N+1, D) what states are scored against (row 0 = padding)
    item_bias()        -> (N+1,)   output bias added to scores, or None
    loss(batch)        -> scalar   the training objective
    fit_data(data)     -> None     optional: read what training needs from the training split
                                   (item counts, ...) before the first step; called by `fit`
    feature_block                  optional side-feature block (seqrec.nn.features); models that
                                   take one accept `features=FeatureInputs` in their constructor

Ranking, evaluation, checkpoints and serving are written once against these.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn

from seqrec.data.batching import Batch
from seqrec.data.dataset import PreparedDataset
from seqrec.nn.features import FeatureBlock


class EpochBatches(Protocol):
    """What `fit` iterates over once per epoch (`TrainBatches` by default)."""

    @property
    def n_targets(self) -> int: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Batch]: ...


class SequentialModel(nn.Module, abc.ABC):
    name: str = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # nn.Module's signature, as subclasses are called
        super().__init__(*args, **kwargs)
        # an instance attribute, not a class one: nn.Module keeps submodules in _modules, which a class
        # attribute of the same name would shadow
        self.feature_block: FeatureBlock | None = None

    def event_feature_names(self) -> list[str]:
        """Event-level features the batches must carry (`Batch.events`)."""
        return [] if self.feature_block is None else list(self.feature_block.event_names)

    @abc.abstractmethod
    def encode(self, batch: Batch) -> torch.Tensor:
        ...

    @abc.abstractmethod
    def item_embeddings(self) -> torch.Tensor:
        ...

    def item_bias(self) -> torch.Tensor | None:
        return None

    @abc.abstractmethod
    def loss(self, batch: Batch) -> torch.Tensor:
        ...

    def fit_data(self, data: PreparedDataset) -> None:
        """Hook run by `fit` before training; only the training split may be read.

        Whatever it stores must live in persistent buffers, so checkpoints carry it."""

    def train_batches(self, data: PreparedDataset, max_len: int, batch_size: int, seed: int) -> EpochBatches | None:
        """A model-specific feeder of training batches, or None for the default `TrainBatches`."""
        return None

    @torch.no_grad()
    def score(self, batch: Batch) -> torch.Tensor:
        """(B, N+1) scores of every item for each row of the batch."""
        scores = self.encode(batch) @ self.item_embeddings().T
        bias = self.item_bias()
        return scores if bias is None else scores + bias
