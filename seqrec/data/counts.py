"""Item counts over the training part of every sequence (what popularity samplers need)."""

from __future__ import annotations

import numpy as np

from seqrec.data.dataset import PreparedDataset


def train_event_mask(data: PreparedDataset) -> np.ndarray:
    """(E,) bool: the events that are training data (validation and test targets and later excluded)."""
    lengths = data.lengths
    position = np.arange(len(data.items)) - np.repeat(data.offsets[:-1], lengths)  # index inside its sequence
    return position < np.repeat(data.train_end(), lengths)


def train_item_counts(data: PreparedDataset) -> np.ndarray:
    """(N+1,) int64 number of training events of each item; validation and test targets excluded."""
    keep = train_event_mask(data)
    return np.bincount(data.items[keep].astype(np.int64), minlength=data.n_items + 1)
