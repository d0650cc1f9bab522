"""Initialise a model's item table from another run's item vectors (e.g. item2vec).

`seqrec train ... --init-items-from RUN` copies the source checkpoint's input item
vectors (`item_emb`, rows 0..N) into the target's `item_embeddings()` table, after
checking that both were trained on the same prepared dataset (fingerprint) and
that the catalogue size and the vector width agree.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from seqrec.data.dataset import PreparedDataset
from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel
from seqrec.train.checkpoint import load_checkpoint

log = logging.getLogger(__name__)


def source_item_vectors(run: Path, data: PreparedDataset) -> torch.Tensor:
    """(N+1, D) input item vectors of the checkpoint in `run` (a run or checkpoint folder)."""
    run = Path(run)
    ckpt = run / "checkpoint" if (run / "checkpoint").is_dir() else run
    source, meta = load_checkpoint(ckpt)
    if meta.get("dataset_fingerprint") != data.fingerprint:
        raise SeqrecError(f"{run}: trained on dataset fingerprint {meta.get('dataset_fingerprint')}, "
                          f"this run uses {data.fingerprint}; item ids would not line up")
    table = getattr(source, "item_emb", None)
    vectors = table.weight if isinstance(table, torch.nn.Embedding) else source.item_embeddings()
    return vectors.detach()[: data.n_items + 1]


@torch.no_grad()
def init_item_embeddings(model: SequentialModel, run: Path, data: PreparedDataset) -> None:
    """Copy the item vectors of `run` into `model.item_embeddings()` in place."""
    vectors = source_item_vectors(run, data)
    target = model.item_embeddings()
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    if target.untyped_storage().data_ptr() not in storages:  # e.g. computed from text (UniSRec)
        raise SeqrecError(f"model {model.name!r} computes its item table instead of learning one; "
                          "--init-items-from needs an ID embedding table")
    if tuple(vectors.shape) != tuple(target.shape):
        raise SeqrecError(f"{run}: item vectors of shape {tuple(vectors.shape)} do not fit the model's "
                          f"item table {tuple(target.shape)}; set model.d to {vectors.shape[1]}")
    target.copy_(vectors.to(target.device, target.dtype))
    target[0].zero_()  # padding stays a zero vector
    log.info("item table initialised from %s (%d x %d)", run, *vectors.shape)
