"""Export a trained run for serving outside Python: an ONNX sequence encoder plus the item table.

    encoder.onnx        items (B, L) int64, left-padded (0 = PAD), L <= max_len
                        [+ item_inputs (N+1, D) float32, text models: every item's input vector]
                        [+ event_<name> (B, L) float32 per event feature, aligned with items: its raw
                           value (gap, hour: from the history's times), NaN = missing, 0 at padding]
                        -> state (B, D) float32          = model.encode(Batch(items))
                        [-> history_offsets (B, L) float32, only for models with a learned history bias]
    items.safetensors   item_vectors (N+1, D) float32 = model.item_embeddings()  (row 0: padding)
                        [item_bias (N+1,) float32      = model.item_bias(), when the model has one]
                        [item_inputs (N+1, D) float32  = model.input_table(), text models]
    adaptor.onnx        text models: text (n, D_text) -> item_inputs (n, D), item_vectors (n, D) of
                        items added by text after the export (manifest "text" says how)
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
batches of other shapes (text models: also on an item table grown after the export; max abs difference
`ATOL`); the manifest names the exporter that passed.
Item features travel inside the encoder (their per-item tables are the checkpoint's buffers); event
features are inputs, computed by the caller exactly as `Recommender.history_events` does.
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
from seqrec.errors import SeqrecError, not_a_run
from seqrec.models.base import SequentialModel
from seqrec.serve.export_inputs import (
    check_vocabularies,
    event_inputs,
    example_events,
    example_items,
    features_section,
    interface,
    text_section,
)
from seqrec.train.checkpoint import file_digest, folder_digests, load_checkpoint

log = logging.getLogger(__name__)

FORMATS = ("onnx",)
EXPORTERS = ("dynamo", "torchscript")
ATOL = 1e-4  # max |ONNX - PyTorch| accepted on the self-check batches
DIM_MIN = {"N": 2}  # the item table has padding and at least one item
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
    """The model's `encode` (and history offsets) as a function of the item tensor alone; for text
    models, of the items and the table of every item's input vector (`item_inputs`), so that an
    exported encoder sees items added by text after the export."""

    model: SequentialModel

    def __init__(self, model: SequentialModel, n_items: int, max_len: int) -> None:
        super().__init__()
        self.model, self.n_items, self.max_len = model, n_items, max_len
        self.takes_table = takes_table(model)
        self.event_names = model.event_feature_names()  # each one an input after items (and item_inputs)
        check_vocabularies(model)
        self.table: torch.Tensor | None = None  # text models: (N+1, D) every item's input vector, computed once
        if self.takes_table:
            with torch.no_grad():
                self.table = model.input_table().float()  # type: ignore[operator]

    def forward(self, items: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """items (B, L), then a text model's item_inputs (N+1, D), then each event feature (B, L)."""
        item_inputs = rest[0] if self.takes_table else None
        events = dict(zip(self.event_names, rest[int(self.takes_table):], strict=True)) or None
        batch = Batch(items=items, events=events)
        state = (self.model.encode(batch) if item_inputs is None
                 else self.model.encode(batch, table=item_inputs)).float()  # type: ignore[call-arg]  # (B, D)
        if self.model.history is None:
            return state
        return state, self.model.history.offsets(items).float()  # (B, L)

    def input_names(self) -> list[str]:
        return ["items", *(["item_inputs"] if self.takes_table else []), *event_inputs(self.event_names)]

    def input_dims(self) -> list[dict[int, str]]:
        """The dynamic axes of each input, in `input_names` order."""
        per_position = {0: "B", 1: "L"}
        return [per_position, *([{0: "N"}] if self.takes_table else []), *[per_position] * len(self.event_names)]

    def example(self, batch: int, width: int, seed: int = 0, extra: int = 0) -> tuple[torch.Tensor, ...]:
        """Inputs of the given shape; text models' table grown by `extra` random rows, which the items use;
        event values drawn around each feature's training values, some missing, 0 at padding."""
        g = torch.Generator().manual_seed(seed)
        items = example_items(self.n_items, batch, width, seed)
        table: tuple[torch.Tensor, ...] = ()
        if self.table is not None:
            if extra:  # every row ends with one of the rows added after the export
                items[:, -1] = self.n_items + 1 + torch.arange(batch) % extra
            table = (torch.cat([self.table, torch.randn(extra, self.table.shape[1], generator=g)]),)
        events = tuple(example_events(self.model.feature_block, name, items, g) for name in self.event_names)
        return (items, *table, *events)


class AdaptorForExport(nn.Module):
    """A text model's item side for items added after the export: text vectors (n, D_text) from the run's
    text encoder -> their input vectors (rows to append to `item_inputs`) and output vectors (rows to
    append to `item_vectors`)."""

    def __init__(self, model: SequentialModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = self.model.text_inputs(text).float()  # type: ignore[operator]
        return inputs, self.model.scored(inputs).float()  # type: ignore[operator]


def takes_table(model: SequentialModel) -> bool:
    """Whether the model's items enter its encoder as a table of vectors that can grow (text models)."""
    return hasattr(model, "input_table")


def checkpoint_dir(run: Path) -> Path:
    """A run folder (with checkpoint/) or a checkpoint folder."""
    run = Path(run)
    ckpt = run / "checkpoint" if (run / "checkpoint").is_dir() else run
    if not (ckpt / "model.json").is_file():
        raise not_a_run(run, "checkpoint/model.json")
    return ckpt


def output_names(model: SequentialModel) -> list[str]:
    return ["state"] + (["history_offsets"] if model.history is not None else [])


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


def export_onnx(wrapper: nn.Module, path: Path, exporter: str, opset: int | None, example: tuple[torch.Tensor, ...],
                input_names: list[str], output_names: list[str], dims: list[dict[int, str]]) -> None:
    """Write `wrapper` to `path` with one exporter; `dims` names the dynamic axes of each input (for
    dynamo, with their bounds in `DIM_MIN` / `wrapper.max_len`), outputs follow from them."""
    with quiet_exporter(), torch.no_grad():
        if exporter == "dynamo":
            bounds = {"L": (1, getattr(wrapper, "max_len", None))}

            def dim(name: str) -> Any:
                low, high = bounds.get(name, (DIM_MIN.get(name, 1), None))
                return None if high is not None and high < 2 else torch.export.Dim(name, min=low, max=high)

            shapes: tuple[Any, ...] = tuple({axis: dim(name) for axis, name in d.items()} for d in dims)
            if isinstance(wrapper, EncoderForExport) and len(shapes) > 1:  # forward(items, *rest): nested
                shapes = (shapes[0], shapes[1:])
            size = sum(t.numel() * t.element_size() for t in (*wrapper.parameters(), *wrapper.buffers()))
            torch.onnx.export(wrapper, example, str(path), input_names=input_names, output_names=output_names,
                              opset_version=opset, dynamo=True, dynamic_shapes=shapes, verbose=False,
                              external_data=size > INLINE_LIMIT)
        else:
            axes = dict(zip(input_names, dims, strict=True))
            torch.onnx.export(wrapper, example, str(path), input_names=input_names, output_names=output_names,
                              opset_version=opset, dynamo=False, dynamic_axes=axes, verbose=False)


def check_onnx(path: Path, wrapper: nn.Module, examples: list[tuple[torch.Tensor, ...]], input_names: list[str],
               output_names: list[str]) -> None:
    """onnx.checker, then ONNX Runtime against PyTorch on the example inputs (when installed)."""
    import onnx

    onnx.checker.check_model(str(path), full_check=True)
    try:
        import onnxruntime as ort
    except ImportError:
        log.warning("onnxruntime is not installed: %s is not compared with PyTorch", path.name)
        return
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for example in examples:
        why = differs(session, wrapper, example, input_names, output_names)
        if why is not None:
            raise ValueError(why)


def differs(session: Any, wrapper: nn.Module, example: tuple[torch.Tensor, ...], input_names: list[str],
            output_names: list[str]) -> str | None:
    """How an ONNX Runtime session's outputs on `example` differ from `wrapper`'s beyond ATOL, or None."""
    with torch.no_grad():
        ref = wrapper(*example)
    refs = ref if isinstance(ref, tuple) else (ref,)
    got = session.run(None, {n: t.numpy() for n, t in zip(input_names, example, strict=True)})
    shapes = " ".join(str(tuple(t.shape)) for t in example)
    for name, r, g in zip(output_names, refs, got, strict=True):
        if g.shape != tuple(r.shape) or not np.allclose(g, r.numpy(), rtol=0.0, atol=ATOL):
            diff = float(np.abs(g - r.numpy()).max()) if g.shape == tuple(r.shape) else float("nan")
            return f"{name} differs from PyTorch on inputs {shapes} (shape {g.shape}, max abs difference {diff:.3g})"
    return None


def write_graph(wrapper: nn.Module, path: Path, opset: int | None, example: tuple[torch.Tensor, ...],
                checks: list[tuple[torch.Tensor, ...]], input_names: list[str], output_names: list[str],
                dims: list[dict[int, str]], what: str) -> str:
    """`path` from the first exporter whose graph passes `check_onnx`; returns its name."""
    failures = []
    for exporter in EXPORTERS:
        try:
            export_onnx(wrapper, path, exporter, opset, example, input_names, output_names, dims)
            check_onnx(path, wrapper, checks, input_names, output_names)
        except Exception as exc:  # any exporter failure: try the next one, say why if none works
            log.debug("%s exporter failed on %s", exporter, what, exc_info=True)
            reason = str(exc).strip().splitlines()
            failures.append(f"{exporter}: {type(exc).__name__}: {reason[0] if reason else ''}"[:300])
            for stale in path.parent.glob(f"{path.name}*"):  # the model and any external data file
                stale.unlink()
            continue
        log.info("exported %s with the %s exporter", what, exporter)
        return exporter
    raise SeqrecError(f"could not export {what} to ONNX ({'; '.join(failures)}); run with -v for details")


def write_encoder(wrapper: EncoderForExport, path: Path, opset: int | None) -> str:
    """encoder.onnx (B and L dynamic, L <= max_len; a text model's table rows N too), checked against
    PyTorch on batches of several shapes and, for text models, on a table grown after the export."""
    width = wrapper.max_len
    shapes = [(2, width, 0), (1, 1, 0), (3, min(2, width), 3), (5, max(1, width - 1), 7)]
    checks = [wrapper.example(b, w, seed=i + 1, extra=extra) for i, (b, w, extra) in enumerate(shapes)]
    return write_graph(wrapper, path, opset, wrapper.example(2, width), checks, wrapper.input_names(),
                       output_names(wrapper.model), wrapper.input_dims(), wrapper.model.name)


def write_adaptor(model: SequentialModel, path: Path, opset: int | None) -> str:
    """adaptor.onnx: a text model's new items, from text vectors to input and output vectors."""
    g = torch.Generator().manual_seed(0)
    config: Any = model.config
    examples: list[tuple[torch.Tensor, ...]] = [(torch.randn(n, int(config.text_dim), generator=g),)
                                                for n in (3, 1, 17)]
    return write_graph(AdaptorForExport(model).eval(), path, opset, examples[0], examples,
                       ["text"], ["item_inputs", "item_vectors"], [{0: "n"}], f"the {model.name} text adaptor")


def onnx_opset(path: Path) -> int:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return next(int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def write_items(model: SequentialModel, path: Path, item_inputs: torch.Tensor | None = None) -> dict[str, list[int]]:
    """items.safetensors: the item vectors (and bias) that states are scored against, and a text model's
    input table (`EncoderForExport.table`); returns shapes."""
    with torch.no_grad():
        tensors = {"item_vectors": model.item_embeddings().detach().float().contiguous().cpu()}
        bias = model.item_bias()
        if bias is not None:
            tensors["item_bias"] = bias.detach().float().contiguous().cpu()
        if item_inputs is not None:
            tensors["item_inputs"] = item_inputs.detach().float().contiguous().cpu()
    save_file(tensors, str(path))
    return {k: list(v.shape) for k, v in tensors.items()}


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
        "features": features_section(wrapper.model),
        "item_ids": [None, *item_ids],  # index i -> raw id; 0 is padding
    }


MIN_OPSET = 18  # torch's ONNX exporter writes opset 18 or later (an older one was silently raised to it)


def export_run(run: Path, dest: Path, format: str = "onnx", opset: int | None = None) -> dict[str, Any]:
    """Export the checkpoint of `run` (a run or checkpoint folder) into the folder `dest`, replaced
    atomically; returns the manifest (also written as dest/manifest.json)."""
    if format not in FORMATS:
        raise SeqrecError(f"unknown export format {format!r}; known: {', '.join(FORMATS)}")
    try:
        import onnx  # the exporters and the checker need it
    except ImportError:
        raise SeqrecError("ONNX export needs the onnx package: pip install 'seqrec[serve]'") from None
    newest = onnx.defs.onnx_opset_version()
    if opset is not None and not MIN_OPSET <= opset <= newest:
        raise SeqrecError(f"--opset {opset}: the exporter writes opset {MIN_OPSET} to {newest} (the installed onnx's "
                          "newest); leave it out for the exporter's default")
    check_destination(Path(dest))
    ckpt = checkpoint_dir(Path(run))
    model, meta = load_checkpoint(ckpt, "cpu")
    item_ids = pl.read_parquet(ckpt / "items.parquet").sort("idx")["item"].to_list()
    if len(item_ids) != meta["n_items"]:
        raise SeqrecError(f"{ckpt / 'items.parquet'}: {len(item_ids)} items, model.json says {meta['n_items']}")
    with atomic_dir(Path(dest)) as tmp:
        wrapper = EncoderForExport(model, int(meta["n_items"]), int(meta["max_len"])).eval()
        exporter = write_encoder(wrapper, tmp / "encoder.onnx", opset)
        tensors = write_items(model, tmp / "items.safetensors", wrapper.table)
        shutil.copyfile(ckpt / "items.parquet", tmp / "items.parquet")
        manifest = build_manifest(wrapper, meta, exporter, onnx_opset(tmp / "encoder.onnx"), tensors, item_ids)
        if wrapper.takes_table:
            manifest["text"] = text_section(model, write_adaptor(model, tmp / "adaptor.onnx", opset))
        manifest["files"] = folder_digests(tmp, skip=(MANIFEST,))
        (tmp / MANIFEST).write_text(_dumps(manifest))
    log.info("wrote %s (%s, opset %d, %s exporter)", dest, model.name, manifest["opset"], exporter)
    return manifest


def check_destination(dest: Path) -> None:
    """An export replaces `dest` whole: it must be absent, an empty folder, or an earlier export (it holds a
    manifest), never a folder of other files, which the replacement would delete."""
    if dest.exists() and not dest.is_dir():
        raise SeqrecError(f"--out {dest}: a file is there, not an export folder")
    if dest.is_dir() and any(dest.iterdir()) and not (dest / MANIFEST).is_file():
        raise SeqrecError(f"--out {dest}: the folder holds other files, not an export (an export replaces its "
                          "folder whole); choose another --out")


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
