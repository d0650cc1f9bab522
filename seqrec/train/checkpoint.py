"""Checkpoints: safetensors weights + JSON config + the item id map. Never pickle.

A checkpoint folder is self-contained: loading it needs no other file.
    model.safetensors   weights (tied tensors stored once)
    model.json          model name, its config, n_items, max_len, dataset fingerprint, the fitted
                        side-feature schema (vocabularies, normalisation statistics) when there is one,
                        and `files`: {name: {"sha256", "bytes"}} of every other file of the folder
    items.parquet       idx -> raw item id and item fields (title, ...), for serving

Loading checks every file against its size and sha256 first, so a truncated or damaged file is a
one-line `SeqrecError` naming it rather than a deserialisation traceback (or, worse, weights that
load and are wrong). Checkpoints written before the hashes existed still load: their files are only
checked for being readable (safetensors header, parquet footer).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_model

from seqrec import __version__
from seqrec.config import build
from seqrec.data.features import FeatureInputs
from seqrec.data.io import atomic_dir
from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel
from seqrec.registry import build_model, model_config_class

log = logging.getLogger(__name__)

META = "model.json"
WEIGHTS = "model.safetensors"
REQUIRED_KEYS = ("model", "config", "n_items", "max_len")
CHUNK = 1 << 20  # bytes hashed at a time: memory stays flat whatever the file size


def file_digest(path: Path) -> dict[str, Any]:
    """{"sha256": hex digest, "bytes": size} of a file, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return {"sha256": h.hexdigest(), "bytes": size}


def folder_digests(folder: Path, skip: tuple[str, ...] = (META,)) -> dict[str, dict[str, Any]]:
    """`file_digest` of every file under `folder` (relative posix path -> digest), but `skip`."""
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file())
    return {p.relative_to(folder).as_posix(): file_digest(p) for p in files
            if p.relative_to(folder).as_posix() not in skip}


def save_weights(model: torch.nn.Module, path: Path) -> None:
    """The model's weights as safetensors. safetensors refuses a tensor that is a view into a larger
    buffer: cuDNN packs a GRU's weights into one on CUDA. Such tensors are saved from a copy with a
    storage of their own; tied weights (one tensor under two names) stay one tensor."""
    def packed(t: torch.Tensor) -> bool:
        return t.untyped_storage().nbytes() != t.numel() * t.element_size()

    if any(packed(t) for t in model.state_dict().values()):
        model = copy.deepcopy(model)
        for tensor in [*model.parameters(), *model.buffers()]:
            if packed(tensor):
                tensor.data = tensor.data.clone()
    save_model(model, str(path))


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Copy the weights `save_weights` wrote into `model`, on whatever device it is: into its tensors,
    so cuDNN's packed GRU weights stay packed (safetensors' load_model refuses them, as save_model
    did). A name may be absent only where it aliases a loaded tensor (tied weights saved once);
    anything else that does not fit is a RuntimeError naming the keys."""
    from safetensors.torch import load_file

    state = load_file(str(path))
    own = model.state_dict()

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()

    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not any(same(own[k], own[n]) for n in state if n in own)]
    if missing or unexpected:
        raise RuntimeError(f"missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")


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
        save_weights(model, tmp / WEIGHTS)
        item_table.write_parquet(tmp / "items.parquet")
        meta["files"] = folder_digests(tmp)  # model.json last: it vouches for what is already written
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")


def read_meta(path: Path) -> dict[str, Any]:
    """model.json of a checkpoint folder, checked for the keys loading needs."""
    file = Path(path) / META
    if not file.is_file():
        raise SeqrecError(f"{path}: not a checkpoint (no {META})")
    try:
        meta = json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SeqrecError(f"{file}: corrupt checkpoint metadata (not valid JSON: {exc})") from None
    if not isinstance(meta, dict):
        raise SeqrecError(f"{file}: corrupt checkpoint metadata (expected a JSON object)")
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise SeqrecError(f"{file}: corrupt checkpoint metadata (missing {', '.join(missing)})")
    if not isinstance(meta["config"], dict) or not all(isinstance(meta[k], int) for k in ("n_items", "max_len")):
        raise SeqrecError(f"{file}: corrupt checkpoint metadata (config must be an object, "
                          "n_items and max_len integers)")
    files = meta.get("files")
    if files is not None and not (isinstance(files, dict) and all(
            isinstance(v, dict) and isinstance(v.get("sha256"), str) and isinstance(v.get("bytes"), int)
            for v in files.values())):
        raise SeqrecError(f"{file}: corrupt checkpoint metadata (files must map names to sha256 and bytes)")
    return meta


def check_files(path: Path, files: dict[str, dict[str, Any]]) -> None:
    """Every listed file exists with its recorded size and sha256 (sizes first: they cost nothing)."""
    path = Path(path)
    for name in files:
        if not (path / name).is_file():
            raise SeqrecError(f"{path / name}: missing from the checkpoint (listed in {META})")
    for name, want in files.items():
        size = (path / name).stat().st_size
        if size != want["bytes"]:
            raise SeqrecError(f"{path / name}: corrupt or truncated checkpoint file "
                              f"(expected {want['bytes']} bytes, found {size})")
    for name, want in files.items():
        found = file_digest(path / name)["sha256"]
        if found != want["sha256"]:
            raise SeqrecError(f"{path / name}: corrupt checkpoint file (expected sha256 {want['sha256'][:12]}..., "
                              f"found {found[:12]}...)")


def check_readable(path: Path) -> None:
    """For checkpoints without hashes: the weights' header and the item table's footer parse."""
    path = Path(path)
    try:
        with safe_open(str(path / WEIGHTS), framework="pt"):
            pass
    except (SafetensorError, OSError) as exc:
        raise SeqrecError(f"{path / WEIGHTS}: corrupt or truncated checkpoint file ({one_line(exc)})") from None
    if (path / "items.parquet").exists():
        try:
            pq.read_metadata(path / "items.parquet")
        except (OSError, ValueError) as exc:
            raise SeqrecError(f"{path / 'items.parquet'}: corrupt or truncated checkpoint file "
                              f"({one_line(exc)})") from None


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _verify(path: Path) -> dict[str, Any]:
    meta = read_meta(path)
    if "files" in meta:
        check_files(path, meta["files"])
    else:
        log.debug("%s: checkpoint without file hashes (written before they were stored); not hash-checked", path)
        check_readable(path)
    return meta


def verify_checkpoint(path: Path) -> None:
    """Raise `SeqrecError` (one line, naming the file) unless the checkpoint folder `path` is intact:
    model.json valid, every file it lists at its recorded size and sha256 (older checkpoints without
    hashes: the files parse)."""
    _verify(Path(path))


def load_checkpoint(path: Path, device: str | torch.device = "cpu") -> tuple[SequentialModel, dict[str, Any]]:
    """The model saved in the checkpoint folder `path` (a run's `checkpoint/`, or `checkpoint-selected/`), every
    weight file checked against the sha256 its `model.json` records, and that JSON (`meta`: the model's config,
    `max_len`, `n_items`, `epoch`; `refit` when the model was trained again on training + validation events,
    so it must not be validated)."""
    path = Path(path)
    meta = _verify(path)
    config = build(model_config_class(meta["model"]), meta["config"], "model")
    features = FeatureInputs.from_json(meta["features"]) if "features" in meta else None
    model = build_model(config, int(meta["n_items"]), int(meta["max_len"]), features)
    try:
        load_weights(model, path / WEIGHTS)
    except (SafetensorError, OSError) as exc:
        raise SeqrecError(f"{path / WEIGHTS}: corrupt or truncated checkpoint file ({one_line(exc)})") from None
    except RuntimeError as exc:  # the tensors do not fit the model model.json describes
        raise SeqrecError(f"{path / WEIGHTS}: does not match the model in {META} ({one_line(exc)})") from None
    model.to(device)
    model.eval()
    return model, meta
