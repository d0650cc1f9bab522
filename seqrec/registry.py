"""An explicit table: model name -> (config class, model class)."""

from __future__ import annotations

from typing import Any

from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel
from seqrec.models.bert4rec import BERT4Rec, BERT4RecConfig
from seqrec.models.gru4rec import GRU4Rec, GRU4RecConfig
from seqrec.models.item2vec import Item2Vec, Item2VecConfig
from seqrec.models.sasrec import SASRec, SASRecConfig

MODELS: dict[str, tuple[type, type[SequentialModel]]] = {
    "sasrec": (SASRecConfig, SASRec),
    "item2vec": (Item2VecConfig, Item2Vec),
    "gru4rec": (GRU4RecConfig, GRU4Rec),
    "bert4rec": (BERT4RecConfig, BERT4Rec),
}


def model_config_class(name: str) -> type:
    if name not in MODELS:
        raise SeqrecError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[name][0]


def build_model(config: Any, n_items: int, max_len: int) -> SequentialModel:
    _, cls = MODELS[config.name]
    return cls(config, n_items, max_len)
