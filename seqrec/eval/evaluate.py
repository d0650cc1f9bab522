"""Evaluate a model on the validation or test targets of a prepared dataset."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from seqrec.config import EvalConfig
from seqrec.data.batching import eval_batches
from seqrec.data.dataset import PreparedDataset
from seqrec.data.features import dataset_event_values
from seqrec.errors import SeqrecError
from seqrec.eval.metrics import metrics_from_ranks
from seqrec.eval.ranking import RankRequest, stream_ranks, user_chunk_size
from seqrec.models.base import SequentialModel

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=64)
def warn_once(message: str) -> None:
    log.warning("%s", message)


def protocol(data: PreparedDataset, cfg: EvalConfig, which: str, max_len: int,
             model: SequentialModel | None = None) -> dict[str, Any]:
    """Everything a reader needs to know how a number was obtained (with `model`, whether it scores items
    already in the history with a learned offset: not the published models, though the ranking is the same)."""
    options = data.meta["options"]
    return {
        **({} if model is None else {"history_bias": model.history is not None}),
        **({} if data.training_users is None else  # data.train_fraction: the users whose events trained it
           {"training_users": f"{int(data.training_users.sum()):,} of {data.n_users:,} (data.train_fraction)"}),
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
    if which not in ("valid", "test"):
        raise SeqrecError(f"the split evaluated is 'valid' or 'test', not {which!r}")
    n_items = int(getattr(model, "n_items", data.n_items))
    if n_items != data.n_items:
        raise SeqrecError(f"the model scores {n_items:,} items and {data.meta['name']} has {data.n_items:,}: a "
                          "model is evaluated on the dataset it was trained on")
    was_training = model.training
    model.eval()
    item_emb, bias = model.item_embeddings().detach(), model.item_bias()
    bias = None if bias is None else bias.detach()
    chunk = min(cfg.batch_size, user_chunk_size(data.n_items, cfg.budget))
    events = dataset_event_values(data, model.event_feature_names())

    def requests() -> Iterator[RankRequest]:
        for batch in eval_batches(data, which, max_len, chunk, events, seen=cfg.filter_seen):
            batch = batch.to(device)
            assert batch.target is not None
            yield RankRequest(model.encode(batch).float(), batch.target, batch.items,
                              model.history_offsets(batch.items), batch.seen)

    ranks = stream_ranks(requests(), item_emb.float(), None if bias is None else bias.float(),
                         cfg.filter_seen)
    model.train(was_training)
    return ranks


def evaluate(model: SequentialModel, data: PreparedDataset, which: str, max_len: int,
             cfg: EvalConfig, device: torch.device) -> dict[str, float]:
    """Recall, NDCG and MRR at each of `cfg.ks` over the users with a `which` ("valid" or "test")
    target: full ranking over every item, ties counted against the target (`evaluate_ranks`)."""
    if max(cfg.ks) >= data.n_items and which == "valid":  # said once a run, not at every epoch's end
        warn_once(f"eval.ks: at {', '.join(str(k) for k in cfg.ks if k >= data.n_items)} (not below the "
                  f"{data.n_items:,} items of {data.meta['name']}) every target counts as found: those metrics say "
                  "nothing about the model")
    ranks = evaluate_ranks(model, data, which, max_len, cfg, device)
    out = metrics_from_ranks(ranks, cfg.ks)
    out["n_users"] = float(len(ranks))
    return out
