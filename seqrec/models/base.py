"""The contract every sequential model meets.

    encode(batch)      -> (B, D)   the state that predicts the next item
    item_embeddings()  -> (N+1, D) what states are scored against (row 0 = padding)
    item_bias()        -> (N+1,)   output bias added to scores, or None
    history_offsets(items) -> (B, L) or None: what each history position adds to its item's score
                                   (a learned `seqrec.nn.history.HistoryBias`, when the model has one)
    loss(batch)        -> scalar   the training objective
    extend(items, cache) -> ((B, D), cache)  optional: incremental encoding of new items appended to
                                   a cached history (sessions); `can_extend()` says whether it is exact
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
from seqrec.errors import SeqrecError
from seqrec.nn.features import FeatureBlock
from seqrec.nn.history import HistoryBias, add_offsets
from seqrec.nn.objective import Objective

# Training defaults of a model (seqrec.config.with_model_train_defaults reads a config class's
# TRAIN_DEFAULTS, groups of `[train]` settings). Every sequence model refits by default: once
# validation has chosen the epoch count, it trains again on training + validation events, so the
# tested and served model has seen each user's latest events (benchmarks/defaults.py measures it).
REFIT_DEFAULT: dict[str, Any] = {"refit": True}


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
        self.history: HistoryBias | None = None  # learned offsets for items already in the history

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

    def item_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        """(n,) item ids -> (n, D) rows of `item_embeddings()`; models that compute item vectors
        (text adaptors) override it to compute only these rows."""
        return self.item_embeddings()[ids]

    def can_extend(self) -> bool:
        """Whether `extend` gives exactly what `encode` gives on the whole history (up to max_len)."""
        return False

    def extend(self, items: torch.Tensor, cache: Any | None) -> tuple[torch.Tensor, Any]:
        """(B, T) items appended after the history held in `cache` (None: empty) -> (B, D) the state
        after the last of them (what `encode` gives on the whole history) and the grown cache."""
        raise SeqrecError(f"{self.name} has no incremental encoding; re-encode the history")

    def history_offsets(self, items: torch.Tensor) -> torch.Tensor | None:
        """(B, L) left-padded histories -> (B, L) score offsets of their items, or None."""
        return None if self.history is None else self.history.offsets(items)

    def next_item_loss(self, objective: Objective, states: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The objective at every position of `states` (B, L, D) that has a target in `batch`."""
        assert batch.targets is not None, "training batches carry targets"
        keep = batch.targets != 0
        W, b = self.item_embeddings(), self.item_bias()
        history = None if self.history is None else self.history.training_rows(states, batch.items, W, b, keep)
        return objective(states[keep], W, b, batch.targets[keep], history)

    @abc.abstractmethod
    def loss(self, batch: Batch) -> torch.Tensor:
        ...

    def item_tables(self) -> list[nn.Embedding]:
        """The tables with a row per item (input, and output when untied): what `train.sparse_items`
        gives sparse gradients (seqrec.train.sparse)."""
        return [m for name in ("item_emb", "out_emb") if isinstance(m := getattr(self, name, None), nn.Embedding)]

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
        scores = scores if bias is None else scores + bias
        offsets = self.history_offsets(batch.items)
        return scores if offsets is None else add_offsets(scores, batch.items, offsets)
