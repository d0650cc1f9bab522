"""Evaluate a model on the validation or test targets of a prepared dataset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from seqrec.config import EvalConfig
from seqrec.data.batching import eval_batches
from seqrec.data.dataset import PreparedDataset
from seqrec.data.features import dataset_event_values
from seqrec.eval.metrics import metrics_from_ranks
from seqrec.eval.ranking import RankRequest, stream_ranks, user_chunk_size
from seqrec.models.base import SequentialModel


def protocol(data: PreparedDataset, cfg: EvalConfig, which: str, max_len: int) -> dict[str, Any]:
    """Everything a reader needs to know how a number was obtained."""
    options = data.meta["options"]
    return {
        "split": options.get("split", "leave-one-out"),
        **{k: options[k] for k in ("valid_from", "test_from") if k in options},  # a time split's cutoffs
        "evaluated_on": which,
        "ranking": "full (all items)",
        "ties": "pessimistic: every other item scoring >= the target ranks above it",
        "filter_seen": cfg.filter_seen,
        "ks": list(cfg.ks),
        "max_len": max_len,
        "dataset": data.meta["name"],
        "dataset_fingerprint": data.fingerprint,
        "n_items": data.n_items,
    }


@torch.no_grad()
def evaluate_ranks(model: SequentialModel, data: PreparedDataset, which: str, max_len: int,
                   cfg: EvalConfig, device: torch.device) -> np.ndarray:
    """1-based rank of each user's `which` target among all items."""
    was_training = model.training
    model.eval()
    item_emb, bias = model.item_embeddings().detach(), model.item_bias()
    bias = None if bias is None else bias.detach()
    chunk = min(cfg.batch_size, user_chunk_size(data.n_items, cfg.budget))
    events = dataset_event_values(data, model.event_feature_names())

    def requests() -> Iterator[RankRequest]:
        for batch in eval_batches(data, which, max_len, chunk, events):
            batch = batch.to(device)
            assert batch.target is not None
            yield RankRequest(model.encode(batch).float(), batch.target, batch.items,
                              model.history_offsets(batch.items))

    ranks = stream_ranks(requests(), item_emb.float(), None if bias is None else bias.float(),
                         cfg.filter_seen)
    model.train(was_training)
    return ranks


def evaluate(model: SequentialModel, data: PreparedDataset, which: str, max_len: int,
             cfg: EvalConfig, device: torch.device) -> dict[str, float]:
    """Recall, NDCG and MRR at each of `cfg.ks` over the users with a `which` ("valid" or "test")
    target: full ranking over every item, ties counted against the target (`evaluate_ranks`)."""
    ranks = evaluate_ranks(model, data, which, max_len, cfg, device)
    out = metrics_from_ranks(ranks, cfg.ks)
    out["n_users"] = float(len(ranks))
    return out
