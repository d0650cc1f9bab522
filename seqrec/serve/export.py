"""Export a trained run for serving outside Python: an ONNX sequence encoder plus the item table.

    encoder.onnx        items (B, L) int64, left-padded (0 = PAD), L <= max_len
                        -> state (B, D) float32          = model.encode(Batch(items))
                        [-> history_offsets (B, L) float32, only for models with a learned history bias]
    items.safetensors   item_vectors (N+1, D) float32 = model.item_embeddings()  (row 0: padding)
                        [item_bias (N+1,) float32      = model.item_bias(), when the model has one]
    items.parquet       the checkpoint's item table (idx -> raw id, title, ...)
    manifest.json       model, config, shapes, the scoring rule, opset, exporter, raw ids by index,
                        and the sha256 and size of every other file

The scores of `Recommender.recommend` are reproduced exactly by

    scores = state @ item_vectors.T (+ item_bias)
    scores[b, items[b, l]] += history_offsets[b, l]   for every position l (repeats add up; pads add 0)
    scores[:, 0] = -inf                               (padding is never recommended)

The exporter is torch.export-based (`dynamo=True`) first; when it cannot trace a model (GRU4Rec's
packed sequences) or its graph does not reproduce PyTorch, the TorchScript exporter is tried. Every
candidate is checked with `onnx.checker` and, when onnxruntime is installed, against PyTorch on a few
batches of other shapes (max abs difference `ATOL`); the manifest names the exporter that passed.
Models with side features (event or item features) are not exported yet.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from safetensors.torch import save_file
from torch import nn

from seqrec import __version__
from seqrec.data.batching import Batch
from seqrec.data.io import atomic_dir
from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel
from seqrec.train.checkpoint import file_digest, folder_digests, load_checkpoint

log = logging.getLogger(__name__)

FORMATS = ("onnx",)
EXPORTERS = ("dynamo", "torchscript")
ATOL = 1e-4  # max |ONNX - PyTorch| accepted on the self-check batches
INLINE_LIMIT = 1 << 30  # weights above this many bytes go to encoder.onnx.data (protobuf stops at 2 GiB)
MANIFEST = "manifest.json"
QUIET_LOGGERS = ("torch.onnx", "torch.export", "onnxscript", "onnx_ir")
SCORING = (
    "Input: the last max_len items of a history (item indices from item_ids, oldest first), left-padded with 0 "
    "to a common length L. scores = state @ item_vectors.T, plus item_bias when present; then, when the "
    "encoder has a history_offsets output, history_offsets[b, l] is added to the score of item items[b, l] "
    "for every position l (repeated items add up; padding adds 0). Index 0 is padding: never recommend it. "
    "The top-k indices map to raw ids through item_ids (index i -> item_ids[i])."
)


class EncoderForExport(nn.Module):
    """The model's `encode` (and history offsets) as a function of the item tensor alone."""

    model: SequentialModel

    def __init__(self, model: SequentialModel, n_items: int, max_len: int) -> None:
        super().__init__()
        self.model, self.n_items, self.max_len = model, n_items, max_len

    def forward(self, items: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        state = self.model.encode(Batch(items=items)).float()  # (B, D)
        if self.model.history is None:
            return state
        return state, self.model.history.offsets(items).float()  # (B, L)


def checkpoint_dir(run: Path) -> Path:
    """A run folder (with checkpoint/) or a checkpoint folder."""
    run = Path(run)
    ckpt = run / "checkpoint" if (run / "checkpoint").is_dir() else run
    if not (ckpt / "model.json").is_file():
        raise SeqrecError(f"{run}: no checkpoint found (expected {ckpt / 'model.json'})")
    return ckpt


def output_names(model: SequentialModel) -> list[str]:
    return ["state"] + (["history_offsets"] if model.history is not None else [])


def example_items(n_items: int, batch: int, width: int, seed: int = 0) -> torch.Tensor:
    """(batch, width) left-padded rows of valid item indices, of assorted lengths (row 0 full)."""
    g = torch.Generator().manual_seed(seed)
    items = torch.randint(1, n_items + 1, (batch, width), generator=g)
    lengths = torch.randint(1, width + 1, (batch,), generator=g)
    lengths[0] = width
    return items * (torch.arange(width)[None, :] >= width - lengths[:, None])


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """The exporters' deprecation notes, 'torchvision is not installed' warnings and graph-optimiser
    chatter (INFO lines per pass) are not ours to show."""
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def export_onnx(wrapper: EncoderForExport, path: Path, exporter: str, opset: int | None) -> None:
    """Write `wrapper` to `path` with one exporter; B and L (up to max_len) are dynamic."""
    names = output_names(wrapper.model)
    width = wrapper.max_len
    example = example_items(wrapper.n_items, 2, width)
    with quiet_exporter(), torch.no_grad():
        if exporter == "dynamo":
            length = torch.export.Dim("L", min=1, max=width) if width >= 2 else None
            shapes = ({0: torch.export.Dim("B", min=1), 1: length},)
            size = sum(t.numel() * t.element_size() for t in (*wrapper.parameters(), *wrapper.buffers()))
            torch.onnx.export(wrapper, (example,), str(path), input_names=["items"], output_names=names,
                              opset_version=opset, dynamo=True, dynamic_shapes=shapes, verbose=False,
                              external_data=size > INLINE_LIMIT)
        else:
            axes: dict[str, dict[int, str]] = {"items": {0: "B", 1: "L"}, "state": {0: "B"}}
            if "history_offsets" in names:
                axes["history_offsets"] = {0: "B", 1: "L"}
            torch.onnx.export(wrapper, (example,), str(path), input_names=["items"], output_names=names,
                              opset_version=opset, dynamo=False, dynamic_axes=axes, verbose=False)


def check_onnx(path: Path, wrapper: EncoderForExport) -> None:
    """onnx.checker, then ONNX Runtime against PyTorch on batches of several shapes (when installed)."""
    import onnx

    onnx.checker.check_model(str(path), full_check=True)
    try:
        import onnxruntime as ort
    except ImportError:
        log.warning("onnxruntime is not installed: %s is not compared with PyTorch", path.name)
        return
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    max_len = wrapper.max_len
    shapes = [(2, max_len), (1, 1), (3, min(2, max_len)), (5, max(1, max_len - 1))]
    for seed, (batch, width) in enumerate(shapes):
        items = example_items(wrapper.n_items, batch, width, seed=seed + 1)
        with torch.no_grad():
            ref = wrapper(items)
        refs = ref if isinstance(ref, tuple) else (ref,)
        got = session.run(None, {"items": items.numpy()})
        for name, r, g in zip(output_names(wrapper.model), refs, got, strict=True):
            if g.shape != tuple(r.shape) or not np.allclose(g, r.numpy(), rtol=0.0, atol=ATOL):
                diff = float(np.abs(g - r.numpy()).max()) if g.shape == tuple(r.shape) else float("nan")
                raise ValueError(f"{name} differs from PyTorch on a ({batch}, {width}) batch "
                                 f"(shape {g.shape}, max abs difference {diff:.3g})")


def write_encoder(wrapper: EncoderForExport, path: Path, opset: int | None) -> str:
    """encoder.onnx from the first exporter whose graph passes `check_onnx`; returns its name."""
    model = wrapper.model
    failures = []
    for exporter in EXPORTERS:
        try:
            export_onnx(wrapper, path, exporter, opset)
            check_onnx(path, wrapper)
        except Exception as exc:  # any exporter failure: try the next one, say why if none works
            log.debug("%s exporter failed on %s", exporter, model.name, exc_info=True)
            reason = str(exc).strip().splitlines()
            failures.append(f"{exporter}: {type(exc).__name__}: {reason[0] if reason else ''}"[:300])
            for stale in path.parent.glob(f"{path.name}*"):  # the model and any external data file
                stale.unlink()
            continue
        log.info("exported %s with the %s exporter", model.name, exporter)
        return exporter
    raise SeqrecError(f"could not export {model.name} to ONNX ({'; '.join(failures)}); run with -v for details")


def onnx_opset(path: Path) -> int:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return next(int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def write_items(model: SequentialModel, path: Path) -> dict[str, list[int]]:
    """items.safetensors: the item vectors (and bias) that states are scored against; returns shapes."""
    with torch.no_grad():
        tensors = {"item_vectors": model.item_embeddings().detach().float().contiguous().cpu()}
        bias = model.item_bias()
        if bias is not None:
            tensors["item_bias"] = bias.detach().float().contiguous().cpu()
    save_file(tensors, str(path))
    return {k: list(v.shape) for k, v in tensors.items()}


def interface(wrapper: EncoderForExport, d: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(inputs, outputs) of encoder.onnx: name, dtype, shape (symbolic dims by letter)."""
    inputs = [{"name": "items", "dtype": "int64", "shape": ["B", "L"],
               "doc": f"item indices, left-padded with 0, 1 <= L <= {wrapper.max_len}"}]
    outputs = [{"name": "state", "dtype": "float32", "shape": ["B", d],
                "doc": "the state that predicts the next item"}]
    if wrapper.model.history is not None:
        outputs.append({"name": "history_offsets", "dtype": "float32", "shape": ["B", "L"],
                        "doc": "added to the score of the item at the same position of items"})
    return inputs, outputs


def build_manifest(wrapper: EncoderForExport, meta: dict[str, Any], exporter: str, opset: int,
                   tensors: dict[str, list[int]], item_ids: list[Any]) -> dict[str, Any]:
    inputs, outputs = interface(wrapper, tensors["item_vectors"][1])
    return {
        "format": "onnx",
        "seqrec_version": __version__,
        "torch_version": torch.__version__,
        "exporter": exporter,
        "opset": opset,
        "model": wrapper.model.name,
        "config": meta["config"],
        "max_len": wrapper.max_len,
        "n_items": wrapper.n_items,
        "dataset_fingerprint": meta.get("dataset_fingerprint"),
        "encoder": {"file": "encoder.onnx", "inputs": inputs, "outputs": outputs},
        "items": {"file": "items.safetensors", "tensors": tensors},
        "scoring": SCORING,
        "item_ids": [None, *item_ids],  # index i -> raw id; 0 is padding
    }


def export_run(run: Path, dest: Path, format: str = "onnx", opset: int | None = None) -> dict[str, Any]:
    """Export the checkpoint of `run` (a run or checkpoint folder) into the folder `dest`, replaced
    atomically; returns the manifest (also written as dest/manifest.json)."""
    if format not in FORMATS:
        raise SeqrecError(f"unknown export format {format!r}; known: {', '.join(FORMATS)}")
    try:
        import onnx  # noqa: F401  (the exporters and the checker need it)
    except ImportError:
        raise SeqrecError("ONNX export needs the onnx package: pip install 'seqrec[serve]'") from None
    ckpt = checkpoint_dir(Path(run))
    model, meta = load_checkpoint(ckpt, "cpu")
    if model.feature_block is not None:
        raise SeqrecError(f"{ckpt}: {model.name} uses side features; event/item features are not exported yet")
    item_ids = pl.read_parquet(ckpt / "items.parquet").sort("idx")["item"].to_list()
    if len(item_ids) != meta["n_items"]:
        raise SeqrecError(f"{ckpt / 'items.parquet'}: {len(item_ids)} items, model.json says {meta['n_items']}")
    with atomic_dir(Path(dest)) as tmp:
        wrapper = EncoderForExport(model, int(meta["n_items"]), int(meta["max_len"])).eval()
        exporter = write_encoder(wrapper, tmp / "encoder.onnx", opset)
        tensors = write_items(model, tmp / "items.safetensors")
        shutil.copyfile(ckpt / "items.parquet", tmp / "items.parquet")
        manifest = build_manifest(wrapper, meta, exporter, onnx_opset(tmp / "encoder.onnx"), tensors, item_ids)
        manifest["files"] = folder_digests(tmp, skip=(MANIFEST,))
        (tmp / MANIFEST).write_text(_dumps(manifest))
    log.info("wrote %s (%s, opset %d, %s exporter)", dest, model.name, manifest["opset"], exporter)
    return manifest


def verify_export(dest: Path) -> dict[str, Any]:
    """The manifest of an export folder, after checking every file's size and sha256."""
    dest = Path(dest)
    try:
        manifest = json.loads((dest / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise SeqrecError(f"{dest / MANIFEST}: not a readable export manifest ({exc})") from None
    for name, want in manifest.get("files", {}).items():
        found: dict[str, Any] = file_digest(dest / name) if (dest / name).is_file() else {"sha256": "missing"}
        if found != want:
            raise SeqrecError(f"{dest / name}: corrupt or truncated export file "
                              f"(expected sha256 {want['sha256'][:12]}..., found {found['sha256'][:12]}...)")
    return manifest


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2) + "\n"
