"""The onnx engine: a model's encoder exported to ONNX (`seqrec.serve.export`) and run by ONNX Runtime.

A text model's exported encoder takes every item's input vector as its second input (`item_inputs`,
(N+1, D)); `OnnxEncoder` keeps that table beside the catalogue and grows it as items are added by text.
A model with event features takes each one's (B, L) values as an input of its own (`event_<name>`).

The export takes seconds to tens of seconds (longer than the rest of a service's start), so the graph is
kept under `$SEQREC_HOME/onnx/<key>/` (`onnx_cache`) and a restart, a deploy's new worker or a second
worker of the same model loads it instead: the key digests everything the graph depends on (the model's
class, config and every weight, the catalogue size and history length, the versions of torch, onnx and
ONNX Runtime, and seqrec's own code), so a cached graph is the one the export would write. The newest
`CACHE_KEEP` graphs are kept. A cached graph that does not load is exported again.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel
from seqrec.nn.rows import append_rows

log = logging.getLogger(__name__)

CACHE_KEEP = 16  # exported graphs kept in the cache, the most recently used


def onnx_cache() -> Path:
    """Where exported encoder graphs are kept: `$SEQREC_HOME/onnx`."""
    from seqrec.data.fetch import seqrec_home

    return seqrec_home() / "onnx"


@functools.lru_cache(maxsize=1)
def _code_digest() -> bytes:
    """seqrec's own source: a graph exported by other code is not reused."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.digest()


def _onnx_version() -> str:
    """The onnx package's version without importing it (most of a start that loads a kept graph)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onnx")
    except PackageNotFoundError:  # installed under another distribution's name
        import onnx

        return str(onnx.__version__)


def encoder_key(model: SequentialModel, n_items: int, max_len: int) -> str:
    """The cache key of `model`'s exported encoder (module docstring)."""
    import onnxruntime

    h = hashlib.sha256(json.dumps([type(model).__name__, repr(model.config), n_items, max_len, torch.__version__,
                                   _onnx_version(), onnxruntime.__version__]).encode())
    h.update(_code_digest())
    for name, tensor in sorted(model.state_dict().items()):
        h.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}".encode())
        h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()[:32]


class OnnxEncoder:
    """The model's encoder exported to ONNX and run by ONNX Runtime on the CPU. A text model's exported
    encoder takes every item's input vector as an input: this keeps that table beside the catalogue
    (`set_rows` as items are added or replaced), in a buffer with room to grow, so that ONNX Runtime
    reads it in place."""

    def __init__(self, model: SequentialModel, n_items: int, max_len: int) -> None:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            raise SeqrecError("the onnx engine needs onnxruntime (pip install 'seqrec[serve]')") from None
        from seqrec.serve.export import EncoderForExport, event_inputs

        wrapper = EncoderForExport(model, n_items, max_len)
        self.event_names = wrapper.event_names
        self._inputs = dict(zip(self.event_names, event_inputs(self.event_names), strict=True))
        self.session, self.cached = _session(wrapper, encoder_key(model, n_items, max_len))
        # rows 0..N of a store with room to grow (seqrec.nn.rows); one reference, so swapping it is atomic
        self._store: torch.Tensor | None = None
        self._table: np.ndarray | None = None
        if wrapper.table is not None:
            table = wrapper.table.detach().float().cpu()
            self._store = append_rows(table, table[:0])
            self._table = self._store[: len(table)].numpy()

    def set_rows(self, ids: Sequence[int], rows: torch.Tensor) -> None:
        """Write the input vectors (n, D) of items `ids`: known ones replaced, new ones appended (they
        must be the next indices, in order). One writer at a time (the catalogue's lock); requests under
        way keep the table they started with: a replaced row is written into a copy."""
        if self._table is None:
            return
        table, values, ids = torch.from_numpy(self._table), rows.detach().float().cpu(), list(ids)
        new = [j for j, i in enumerate(ids) if i >= len(table)]
        if [ids[j] for j in new] != list(range(len(table), len(table) + len(new))):
            raise SeqrecError(f"new items must take the next indices from {len(table)}, got {[ids[j] for j in new]}")
        known = [j for j, i in enumerate(ids) if i < len(table)]
        # appended in place while the store has room; replaced rows go into a copy (no store given)
        store = append_rows(table, values[new], None if known else self._store)
        if known:
            store[torch.tensor([ids[j] for j in known])] = values[known]
        self._store, self._table = store, store[: len(table) + len(new)].numpy()

    def __call__(self, items: np.ndarray, events: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """(B, L) left-padded item indices (and each event feature's (B, L) values) -> (B, D) states."""
        feeds = {"items": items}
        table = self._table
        if table is not None:
            feeds["item_inputs"] = table
        missing = [n for n in self.event_names if n not in (events or {})]
        if missing:
            raise SeqrecError(f"the batch lacks event feature(s) {missing}")
        feeds.update({self._inputs[name]: np.asarray(events[name], dtype=np.float32) for name in self.event_names}
                     if events else {})
        return self.session.run(["state"], feeds)[0]



def _open(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = torch.get_num_threads(), 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _session(wrapper: Any, key: str) -> tuple[Any, bool]:
    """An ONNX Runtime session of `wrapper`'s graph: the cached one under `key`, or a new export (then
    cached) -> (session, whether it came from the cache). Processes starting together export once (a lock
    per key); a cache that cannot be read or written is a miss, and the graph is exported to a scratch folder."""
    try:
        cache = onnx_cache()
        cache.mkdir(parents=True, exist_ok=True)
        lock = os.open(cache / f".{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except (OSError, RuntimeError) as exc:  # unwritable, or no home folder to put it in
        log.info("cannot keep the exported ONNX graph in $SEQREC_HOME/onnx (%s): exporting for this process only",
                 getattr(exc, "strerror", None) or exc)
        return _scratch_export(wrapper), False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process exporting the same graph: wait, then load its graph
        folder = cache / key
        found = _cached_session(folder)
        if found is not None and _answers_as(found, wrapper):
            return found, True
        if found is not None:  # (a graph the key missed a cause of: an exporter package's version, say)
            log.warning("the cached ONNX graph %s differs from the model on a check batch: exporting it again", folder)
            shutil.rmtree(folder, ignore_errors=True)
        try:
            return _export_into(wrapper, cache, folder), False
        except OSError as exc:  # a full disk, a folder made unwritable meanwhile: not this process's problem
            log.warning("cannot keep the exported ONNX graph in %s (%s): exporting for this process only", cache,
                        exc.strerror or exc)
            return _scratch_export(wrapper), False
    finally:
        os.close(lock)  # lets the lock go


def _cached_session(folder: Path) -> Any | None:
    """The session of the graph kept in `folder`, or None (absent, or damaged: then removed)."""
    try:
        if not (folder / "encoder.onnx").is_file():
            if folder.exists():  # left without its graph (a removal stopped part-way): in the way of a new one
                shutil.rmtree(folder, ignore_errors=True)
            return None
        session = _open(folder / "encoder.onnx")
    except OSError as exc:
        log.info("the cached ONNX graph %s cannot be read (%s): exporting it", folder, exc.strerror or exc)
        return None
    except Exception as exc:  # a graph cut short or damaged: exported again
        log.warning("the cached ONNX graph %s does not load (%s): exporting it again", folder, exc)
        shutil.rmtree(folder, ignore_errors=True)
        return None
    with contextlib.suppress(OSError):
        os.utime(folder)  # most recently used
    return session


def _answers_as(session: Any, wrapper: Any) -> bool:
    """Whether a loaded graph gives the model's own outputs on a check batch (milliseconds)."""
    from seqrec.serve.export import differs, output_names

    try:
        return differs(session, wrapper, wrapper.example(2, wrapper.max_len, seed=1), wrapper.input_names(),
                       output_names(wrapper.model)) is None
    except Exception:  # inputs the graph does not take
        return False


def _export_into(wrapper: Any, cache: Path, folder: Path) -> Any:
    """Export into a new folder of `cache`, open it, and put it in `folder`'s place whole."""
    from seqrec.serve.export import write_encoder

    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=cache))
    try:
        write_encoder(wrapper, tmp / "encoder.onnx", None)
        session = _open(tmp / "encoder.onnx")
        tmp.chmod(0o755)  # mkdtemp's 0700 would keep other users' services from loading it
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _prune(cache)
    return session


def _scratch_export(wrapper: Any) -> Any:
    from seqrec.serve.export import write_encoder

    with tempfile.TemporaryDirectory(prefix="seqrec-onnx-") as scratch:
        write_encoder(wrapper, Path(scratch) / "encoder.onnx", None)
        return _open(Path(scratch) / "encoder.onnx")


def _prune(cache: Path) -> None:
    """Keep the `CACHE_KEEP` most recently used graphs, and exports under way (those of a process stopped
    while exporting go after an hour)."""
    import time

    with contextlib.suppress(OSError):
        for stale in cache.glob(".export-*"):
            if stale.stat().st_mtime < time.time() - 3600:
                shutil.rmtree(stale, ignore_errors=True)
        graphs = [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")]
        for lock in cache.glob(".*.lock"):  # the lock files of graphs no longer kept
            if not (cache / lock.name[1:-5]).exists() and lock.stat().st_mtime < time.time() - 3600:
                lock.unlink(missing_ok=True)
        graphs.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        for old in graphs[CACHE_KEEP:]:
            shutil.rmtree(old, ignore_errors=True)
