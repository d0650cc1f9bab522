"""The onnx engine: a model's encoder exported to ONNX (`seqrec.serve.export`) and run by ONNX Runtime.

A text model's exported encoder takes every item's input vector as its second input (`item_inputs`,
(N+1, D)); `OnnxEncoder` keeps that table beside the catalogue and grows it as items are added by text.
A model with event features takes each one's (B, L) values as an input of its own (`event_<name>`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel


class OnnxEncoder:
    """The model's encoder exported to ONNX and run by ONNX Runtime on the CPU. A text model's exported
    encoder takes every item's input vector as an input: this keeps that table beside the catalogue
    (`set_rows` as items are added or replaced), in a buffer with room to grow, so that ONNX Runtime
    reads it in place."""

    def __init__(self, model: SequentialModel, n_items: int, max_len: int) -> None:
        import tempfile

        try:
            import onnxruntime as ort
        except ImportError:
            raise SeqrecError("the onnx engine needs onnxruntime (pip install 'seqrec[serve]')") from None
        from seqrec.serve.export import EncoderForExport, event_inputs, write_encoder

        wrapper = EncoderForExport(model, n_items, max_len)
        self.event_names = wrapper.event_names
        self._inputs = dict(zip(self.event_names, event_inputs(self.event_names), strict=True))
        with tempfile.TemporaryDirectory(prefix="seqrec-onnx-") as tmp:
            path = Path(tmp) / "encoder.onnx"
            write_encoder(wrapper, path, None)
            options = ort.SessionOptions()
            options.intra_op_num_threads, options.inter_op_num_threads = torch.get_num_threads(), 1
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        # rows 0..N of a buffer that may be longer (one reference, so swapping it is atomic)
        self._table: np.ndarray | None = None
        if wrapper.table is not None:
            self._table = _with_room(wrapper.table.numpy(), len(wrapper.table))[: len(wrapper.table)]

    def set_rows(self, ids: Sequence[int], rows: torch.Tensor) -> None:
        """Write the input vectors (n, D) of items `ids`: known ones replaced, new ones appended (they
        must be the next indices, in order). One writer at a time (the catalogue's lock); requests under
        way keep the table they started with: a replaced row is written into a copy."""
        if self._table is None:
            return
        table, values = self._table, rows.detach().float().cpu().numpy()
        ids = list(ids)
        new = [i for i in ids if i >= len(table)]
        if new != list(range(len(table), len(table) + len(new))):
            raise SeqrecError(f"new items must take the next indices from {len(table)}, got {new}")
        n = len(table) + len(new)
        buffer = table.base if table.base is not None else table
        if n > len(buffer) or len(new) < len(ids):  # a new buffer: readers of the old one are not disturbed
            buffer = _with_room(table, max(len(buffer) // 2, n))
        buffer[np.asarray(ids)] = values
        self._table = buffer[:n]

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


def _with_room(rows: np.ndarray, n: int) -> np.ndarray:
    """A new float32 buffer of 2n rows with `rows` copied to its top."""
    buffer = np.zeros((2 * n, rows.shape[1]), np.float32)
    buffer[: len(rows)] = rows
    return buffer
