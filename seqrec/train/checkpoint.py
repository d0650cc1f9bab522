"""Checkpoints: safetensors weights + JSON config + the item id map. Never pickle.

A checkpoint folder is self-contained: loading it needs no other file.
    model.safetensors   weights (tied tensors stored once)
    model.json          model name, its config, n_items, max_len, dataset fingerprint, and the fitted
                        side-feature schema (vocabularies, normalisation statistics) when there is one
    items.parquet       idx -> raw item id and item fields (title, ...), for serving
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import polars as pl
import torch
from safetensors.torch import load_model, save_model

from seqrec import __version__
from seqrec.config import build
from seqrec.data.features import FeatureInputs
from seqrec.data.io import atomic_dir, read_json
from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel
from seqrec.registry import build_model, model_config_class


def save_checkpoint(model: SequentialModel, dest: Path, *, max_len: int, item_table: pl.DataFrame,
                    extra: dict[str, Any] | None = None) -> None:
    meta = {
        "seqrec_version": __version__,
        "model": model.name,
        "config": dataclasses.asdict(model.config),  # type: ignore[call-overload]
        "n_items": model.n_items,
        "max_len": max_len,
        **(extra or {}),
    }
    if model.feature_block is not None:
        meta["features"] = FeatureInputs(model.feature_block.fitted, model.feature_block.fusion).to_json()
    with atomic_dir(Path(dest)) as tmp:
        save_model(model, str(tmp / "model.safetensors"))
        (tmp / "model.json").write_text(json.dumps(meta, indent=2) + "\n")
        item_table.write_parquet(tmp / "items.parquet")


def load_checkpoint(path: Path, device: str | torch.device = "cpu") -> tuple[SequentialModel, dict[str, Any]]:
    path = Path(path)
    if not (path / "model.json").is_file():
        raise SeqrecError(f"{path}: not a checkpoint (no model.json)")
    meta = read_json(path / "model.json")
    config = build(model_config_class(meta["model"]), meta["config"], "model")
    features = FeatureInputs.from_json(meta["features"]) if "features" in meta else None
    model = build_model(config, int(meta["n_items"]), int(meta["max_len"]), features)
    load_model(model, str(path / "model.safetensors"), device=str(device))
    model.to(device)
    model.eval()
    return model, meta
