"""An explicit table: model name -> (config class, model class)."""

from __future__ import annotations

from typing import Any

from seqrec.data.dataset import PreparedDataset
from seqrec.data.features import FeatureInputs, FeaturesConfig, feature_inputs
from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel
from seqrec.models.bert4rec import BERT4Rec, BERT4RecConfig
from seqrec.models.gru4rec import GRU4Rec, GRU4RecConfig
from seqrec.models.item2vec import Item2Vec, Item2VecConfig
from seqrec.models.sasrec import SASRec, SASRecConfig
from seqrec.models.unisrec import UniSRec, UniSRecConfig

MODELS: dict[str, tuple[type, type[SequentialModel]]] = {
    "sasrec": (SASRecConfig, SASRec),
    "item2vec": (Item2VecConfig, Item2Vec),
    "gru4rec": (GRU4RecConfig, GRU4Rec),
    "bert4rec": (BERT4RecConfig, BERT4Rec),
    "unisrec": (UniSRecConfig, UniSRec),
}


def model_config_class(name: str) -> type:
    if name not in MODELS:
        raise SeqrecError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[name][0]


FEATURE_MODELS = ("sasrec", "gru4rec", "bert4rec", "unisrec")  # sequence models that take a feature block


def _feature_kwargs(name: str, features: FeatureInputs | None) -> dict[str, Any]:
    if features is None:
        return {}
    if name not in FEATURE_MODELS:
        raise SeqrecError(f"{name} takes no side features; the [features] section works with "
                          f"{', '.join(FEATURE_MODELS)}")
    return {"features": features}


def build_model(config: Any, n_items: int, max_len: int, features: FeatureInputs | None = None) -> SequentialModel:
    _, cls = MODELS[config.name]
    return cls(config, n_items, max_len, **_feature_kwargs(config.name, features))


def build_model_for(config: Any, data: PreparedDataset, max_len: int,
                    features: FeaturesConfig | None = None) -> SequentialModel:
    """A fresh model for `data`: models that need more than the item count (UniSRec's item text
    vectors) define `from_dataset`; the others are built from the count alone. Side features
    (`features`) are fitted here, on the training split."""
    _, cls = MODELS[config.name]
    inputs = feature_inputs(features, data) if features is not None else None
    kwargs = _feature_kwargs(config.name, inputs)
    from_dataset = getattr(cls, "from_dataset", None)
    if from_dataset is not None:
        return from_dataset(config, data, max_len, **kwargs)
    return cls(config, data.n_items, max_len, **kwargs)
