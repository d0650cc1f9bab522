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
from seqrec.nn.rows import append_rows


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

