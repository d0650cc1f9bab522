"""Top-k recommendations for raw histories of item ids, from a saved run or checkpoint.

One `Recommender` serves the CLI, Python and the HTTP service. It holds the model and a live
`Catalogue` (raw ids, titles, item vectors + bias, and a retriever: exact, FAISS HNSW or IVF):

    h = model.encode(history)                     (B, D) the state after the history
    top-k = retriever.search(h, k)                scores h · v_i + b_i, exact ones for the returned ids
    + history offsets                             a model with a learned history bias shifts the scores
                                                  of the history's own items: they are kept out of the
                                                  search, scored exactly and merged in

Text models (UniSRec) take new items by their text alone: the text goes through the run's frozen
encoder and adaptor, and the item joins the catalogue and its index without retraining.

Models with side features use the same features as in training: event features are derived from
the history's `times` (gap, hour) and `events` (e.g. rating) exactly as `seqrec.data.features`
derives them from a prepared log; values not given are missing (the model's learned "missing").
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from seqrec.data.batching import Batch, history_batch
from seqrec.data.features import DERIVED_EVENTS, event_values
from seqrec.errors import SeqrecError, not_a_run
from seqrec.models.base import SequentialModel
from seqrec.nn.history import window_scores
from seqrec.serve.ann import Retriever
from seqrec.serve.catalogue import Catalogue, UnknownItem, item_ids
from seqrec.serve.catalogue_log import CatalogueLog
from seqrec.serve.live import LiveCatalogue
from seqrec.serve.onnx_engine import OnnxEncoder
from seqrec.train.checkpoint import load_checkpoint
from seqrec.train.device import pick_device

log = logging.getLogger(__name__)
NOTHING_LEFT = "no item is left to recommend after excluding the history"


@dataclass(frozen=True)
class Recommendation:
    """One recommended item: its raw id, the model's score and its title when the catalogue has one."""

    item: str  # raw item id
    score: float
    title: str | None = None


class Recommender(LiveCatalogue):
    """Top-k recommendations from a trained run for raw histories, with a live catalogue.

    `Recommender.from_run(RUN)` loads a run; `recommend(history, k)` ranks every item (or an ANN
    index's candidates, `use_index`) for one history of raw item ids, most recent last;
    `recommend_many` does many at once. Text models also take new items by text (`add_items`) and
    stop recommending some (`remove_items`). Thread-safe: the HTTP service shares one."""

    def __init__(self, model: SequentialModel, items: pl.DataFrame, max_len: int, index: str = "exact",
                 **index_options: Any) -> None:
        self.model, self.max_len = model.eval(), max_len
        self._onnx: OnnxEncoder | None = None  # the encoder in ONNX Runtime (`use_engine("onnx")`), or None
        items = items.sort("idx")
        # what people see and search: the title, else the text (UniSRec's files; items added by text show theirs)
        named = next((c for c in ("title", "text") if c in items.columns), None)
        titles = items[named].cast(pl.Utf8).to_list() if named else [None] * items.height
        with torch.no_grad():
            vectors, bias = model.item_embeddings(), model.item_bias()
        self.catalogue = Catalogue(items["item"].cast(pl.Utf8).to_list(), titles, vectors, bias, index,
                                   **index_options)
        self._text_encoder: Any = None  # loaded on the first new item
        self._no_new_text: str | None = None  # why this catalogue takes no item by text, if it takes none
        self._log: CatalogueLog | None = None  # where catalogue changes are kept (`keep_log`), if anywhere
        self.run: str | None = None  # the run folder it was loaded from (links resolved), if any
        self.version: str | None = None  # which checkpoint: the start of its model.json's sha256

    @classmethod
    def from_run(cls, path: Path | str, device: str = "cpu", index: str = "exact", engine: str = "torch",
                 **index_options: Any) -> Recommender:
        """A run folder (with checkpoint/) or a checkpoint folder; `engine` as in `use_engine`."""
        path = Path(path)
        ckpt = path / "checkpoint" if (path / "checkpoint").is_dir() else path
        if not (ckpt / "model.json").is_file():
            raise not_a_run(path, "checkpoint/model.json")
        model, meta = load_checkpoint(ckpt, str(pick_device(device, "device")))
        rec = cls(model, pl.read_parquet(ckpt / "items.parquet"), int(meta["max_len"]), index, **index_options)
        rec.run = str(path.resolve())
        # model.json holds the config and every other file's sha256: its own digest names the checkpoint
        rec.version = hashlib.sha256((ckpt / "model.json").read_bytes()).hexdigest()[:12]
        if "pretrain" in meta and getattr(model.config, "text_centre", False):
            rec._no_new_text = (f"{path} is a pre-training run whose domains' texts are each centred by their own "
                                "mean (model.text_centre): a new item has no domain mean to take; serve the run "
                                "on a catalogue instead (--dataset TARGET)")
        rec.use_engine(engine)
        return rec

    def use_engine(self, engine: str = "onnx") -> None:
        """Which runtime encodes histories: "torch" (the model itself) or "onnx": the encoder exported
        to ONNX (`seqrec.serve.export`, checked against PyTorch when it is written) and run by ONNX
        Runtime on the CPU, with as many threads as torch has. ONNX Runtime costs a fraction of
        PyTorch's per-operator overhead on small batches and runs without holding Python's GIL, so a
        service answers more requests per core. Sessions (KV cache) and top-k stay in PyTorch. Text
        models keep taking items by text: the exported encoder reads a table of item input vectors
        that grows with the catalogue; event features are inputs of the exported encoder. Not for a
        model on a GPU.
        "auto": onnx where it can serve the model (and its export passes the check against PyTorch),
        else torch; the choice and its reason are logged."""
        if engine == "auto":
            why = self._no_onnx()
            if why is None:
                try:
                    self.use_engine("onnx")
                    log.info("engine: onnx (auto: %s runs on the CPU; its export matched PyTorch)", self.model.name)
                    return
                except SeqrecError as exc:
                    why = str(exc)
            log.info("engine: torch (%s)", why)
            engine = "torch"
        if engine == "torch":
            self._onnx = None
            return
        if engine != "onnx":
            raise SeqrecError(f"unknown engine {engine!r}: auto, torch or onnx")
        why = self._no_onnx()
        if why is not None:
            raise SeqrecError(f"{why}: use --engine torch")
        with self.catalogue.lock:  # no item is added while the engine copies the item table
            self._onnx = OnnxEncoder(self.model, self.n_items, self.max_len)

    def _no_onnx(self) -> str | None:
        """Why the onnx engine cannot serve this model here, or None."""
        if self.catalogue.vectors.device.type != "cpu":
            return f"the onnx engine runs on the CPU; the model is on {self.catalogue.vectors.device}"
        import importlib.util

        missing = [m for m in ("onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
        return f"{' and '.join(missing)} not installed (pip install 'seqrec[serve]')" if missing else None

    # -- the catalogue -------------------------------------------------------------------------------

    @property
    def engine(self) -> str:
        """What encodes histories: "onnx" (ONNX Runtime) or "torch"."""
        return "torch" if self._onnx is None else "onnx"

    @property
    def n_items(self) -> int:
        """The number of items in the catalogue (added ones included)."""
        return self.catalogue.n_items

    @property
    def titles(self) -> list[str | None]:
        """Each item's title (None where it has none), in index order from item 1."""
        return self.catalogue.titles

    @property
    def index(self) -> dict[str, int]:
        """Raw item id -> the model's item index (1..N)."""
        return self.catalogue.index

    def use_index(self, kind: str = "ivf", **options: Any) -> Retriever:
        """Serve top-k from another index (exact, hnsw or ivf; FAISS options such as ef_search or
        n_probe); `candidates` still rank exactly. IVF is the default: in `benchmarks/retrieval.py` it
        beat HNSW on recall@100, latency, build time and memory."""
        return self.catalogue.use_index(kind, **options)

    def to_indices(self, history: Sequence[str]) -> list[int]:
        """Raw item ids -> item indices; an unknown id is a `SeqrecError` naming it."""
        return self.catalogue.lookup(item_ids(history, "history"), " in history")

    def drop_unknown(self, history: Sequence[str], times: Sequence[float] | None = None,
                     events: Mapping[str, Sequence[float]] | None = None
                     ) -> tuple[list[str], list[float] | None, dict[str, list[float]] | None, list[str]]:
        """The history without the ids the catalogue does not hold (items a run trained again left out, or
        not added yet), with their times and event values -> (history, times, events, the ids dropped).
        A history with no known id left is an `UnknownItem` naming them."""
        self.history_events(len(history), times, events)  # one value per history item, as given
        keep = self.catalogue.known(history)
        dropped = [raw for raw, k in zip(history, keep, strict=True) if not k]
        if dropped and not any(keep):
            raise UnknownItem("no item of the history is known: " + ", ".join(repr(r) for r in dropped[:5])
                              + (" ..." if len(dropped) > 5 else ""))

        def kept(values: Sequence[float]) -> list[float]:
            return [v for v, k in zip(values, keep, strict=True) if k]

        return ([raw for raw, k in zip(history, keep, strict=True) if k], None if times is None else kept(times),
                None if events is None else {name: kept(v) for name, v in events.items()}, dropped)

    # -- states --------------------------------------------------------------------------------------

    def check_event_names(self, names: Sequence[str]) -> None:
        """A `SeqrecError` unless the model takes every event feature named (a typo would otherwise
        leave the feature missing without a word); gap and hour come from times, not by name."""
        takes = [n for n in self.model.event_feature_names() if n not in DERIVED_EVENTS]
        unknown = sorted(set(names) - set(takes))
        if unknown:
            raise SeqrecError(f"unknown event feature(s) {unknown}; this model takes {', '.join(takes) or 'none'}"
                              " (gap and hour come from times)")

    def history_events(self, n: int, times: Sequence[float] | None,
                       events: Mapping[str, Sequence[float]] | None) -> dict[str, np.ndarray]:
        """Event feature values of an n-item history; what is not given is NaN (missing)."""
        names = self.model.event_feature_names()
        if times is not None and len(times) != n:
            raise SeqrecError(f"times has {len(times)} values for a history of {n} items")
        if not names and not events:  # a model without event features: nothing to build
            return {}
        given = {k: np.asarray(v, dtype=np.float64) for k, v in (events or {}).items()}
        bad = [k for k, v in given.items() if len(v) != n]
        if bad:
            raise SeqrecError(f"event values {bad} must have one value per history item ({n})")
        starts = np.arange(n) == 0
        t = None if times is None else np.asarray(times, dtype=np.float64)
        missing = np.full(n, np.nan)
        out = {}
        for name in names:
            available = t is not None if name in DERIVED_EVENTS else name in given
            out[name] = event_values(name, t, starts, given) if available else missing
        return out

    @torch.no_grad()
    def encode(self, histories: Sequence[Sequence[int]], events: Sequence[dict[str, np.ndarray]] | None = None,
               table: torch.Tensor | None = None) -> tuple[torch.Tensor, Batch]:
        """Item-index histories -> their states (B, D) and the left-padded batch (the last max_len items);
        a model's event features are missing (NaN) where `events` gives none (sessions, batch requests).
        `table`: a text model's `input_table()`, computed once for many calls while the catalogue is still."""
        if not events and self.model.event_feature_names():
            events = [self.history_events(len(h), None, None) for h in histories]
        batch = history_batch([list(h) for h in histories], self.max_len, events or None)
        if self._onnx is not None:
            values = None if batch.events is None else {k: v.numpy() for k, v in batch.events.items()}
            return torch.from_numpy(self._onnx(batch.items.numpy(), values)), batch
        batch = batch.to(self.catalogue.vectors.device)
        if table is not None:
            return self.model.encode(batch, table=table), batch  # type: ignore[call-arg]
        return self.model.encode(batch), batch

    # -- top-k ---------------------------------------------------------------------------------------

    @torch.no_grad()
    def top_k(self, states: torch.Tensor, windows: torch.Tensor, k: int | Sequence[int],
              exclude: Sequence[Sequence[int] | None] | None = None) -> list[list[Recommendation]]:
        """Best k per state (B, D), in one search; `windows` (B, L) the items each state has seen (for
        the history bias); `k` one for all rows or one per row; `exclude` per row, item indices never
        returned (e.g. the whole history) or None."""
        ks = [k] * len(states) if isinstance(k, (int, np.integer)) else list(k)
        for kk in ks:
            self.check_k(kk)
        values, ids = self.top_k_padded(states, windows, max(ks), exclude)
        # the rows as lists at once: per row tensor slices and masks cost more than the search of a small batch
        return [self._results(v[:kk], i[:kk]) for v, i, kk in zip(values.tolist(), ids.tolist(), ks, strict=True)]

    @torch.no_grad()
    def top_k_padded(self, states: torch.Tensor, windows: torch.Tensor, k: int,
                     exclude: Sequence[Sequence[int] | None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The best k of every row as two (B, k) CPU tensors, scores and item indices, best first; where
        fewer items are left a row ends in -inf scores and index 0 (batch jobs take the tensors whole)."""
        self.check_k(k)
        excl = list(exclude) if exclude is not None else [None] * len(states)
        offsets = self.model.history_offsets(windows)
        # rows whose window items are scored exactly, with their offsets, and merged into what the search finds
        merge = torch.tensor([offsets is not None and row is None for row in excl], dtype=torch.bool)
        seen = windows.tolist() if bool(merge.any()) else []
        search_excl = [list(row) if row is not None else
                       list(dict.fromkeys(i for i in seen[r] if i)) if merge[r] else []
                       for r, row in enumerate(excl)]
        values, ids = self.catalogue.retriever.search(states, k, exclude=search_excl if any(search_excl) else None)
        values = values.float()
        if offsets is not None and bool(merge.any()):
            exact = window_scores(states, windows, offsets, self.catalogue.vectors, self.catalogue.bias)
            if self.catalogue.removed:  # never returned (a look-up per distinct window item, not per removed one)
                seen_ids = windows.unique()
                gone = torch.tensor([i in self.catalogue.removed for i in seen_ids.tolist()], dtype=torch.bool)
                exact[torch.isin(windows, seen_ids[gone.to(seen_ids.device)])] = -torch.inf
            exact = exact.cpu().masked_fill(~merge[:, None], -torch.inf)
            top = torch.topk(torch.cat([values, exact], dim=1), k, dim=1)
            values, ids = top.values, torch.cat([ids, windows.cpu()], dim=1).gather(1, top.indices)
        return values, ids

    def _exact(self, state: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """(D,) state -> exact scores of items `ids` (n,): h · v_i + b_i."""
        bias = self.catalogue.bias
        scores = self.catalogue.vectors[ids] @ state.float()
        return scores if bias is None else scores + bias[ids]

    def check_k(self, k: int) -> None:
        """A `SeqrecError` unless k is a whole number, 1 <= k <= the number of items."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise SeqrecError(f"k must be a whole number, got {k!r}")
        if not 1 <= k <= self.catalogue.n_active:
            raise SeqrecError(f"k={k} must be between 1 and the number of recommendable items "
                              f"({self.catalogue.n_active})")

    def _results(self, scores: Sequence[float], ids: Sequence[int]) -> list[Recommendation]:
        titles = self.catalogue.titles
        raw = self.catalogue.raw_ids
        return [Recommendation(raw[i - 1], float(s), titles[i - 1])
                for s, i in zip(scores, ids, strict=True) if i > 0 and s > -float("inf")]

    @torch.no_grad()
    def recommend(self, history: Sequence[str], k: int = 10, exclude_seen: bool = False,
                  candidates: Sequence[str] | None = None, times: Sequence[float] | None = None,
                  events: Mapping[str, Sequence[float]] | None = None) -> list[Recommendation]:
        """Top-k raw item ids (most recent history item last), best first; only `candidates` when given.

        `times` (seconds) and `events` (name -> one value per history item) feed event features."""
        self.check_k(k)
        history = item_ids(history, "history")
        if not history:
            raise SeqrecError("the history is empty; give at least one item id")
        idx = self.catalogue.lookup(history, " in history")  # (to_indices without checking the ids again)
        if events:
            self.check_event_names(list(events))
        ev = self.history_events(len(idx), times, events)
        if candidates is None:
            return self.recommend_indices([idx], [ev], [k], [exclude_seen])[0]
        candidates = item_ids(candidates, "candidates")
        if not candidates:  # refused before any encoding
            raise SeqrecError("the candidates are empty; give at least one item id (or none, to rank every item)")
        states, batch = self.encode([idx], [ev] if ev else None)
        return self._rank_candidates(states[0], batch.items, idx, self.catalogue.lookup(candidates, " in candidates"),
                                     k, exclude_seen)

    @torch.no_grad()
    def recommend_many(self, histories: Sequence[Sequence[str]], k: int = 10,
                       exclude_seen: bool = False) -> list[list[Recommendation]]:
        """`recommend` for many histories in one forward pass."""
        self.check_k(k)
        if not histories:
            raise SeqrecError("no histories given")
        if any(not h for h in histories):
            raise SeqrecError("every history needs at least one item id")
        idx = []
        for i, history in enumerate(histories):
            try:
                idx.append(self.to_indices(history))
            except SeqrecError as exc:  # which of the histories
                raise type(exc)(f"histories.{i}: {exc}") from None
        return self.recommend_indices(idx, None, [k] * len(idx), [exclude_seen] * len(idx))

    @torch.no_grad()
    def recommend_indices(self, histories: Sequence[list[int]], events: Sequence[dict[str, np.ndarray]] | None,
                          ks: Sequence[int], exclude_seen: Sequence[bool]) -> list[list[Recommendation]]:
        """The batched core of `recommend`: item-index histories (from `to_indices`: not checked again), their
        event values (or None), and per row its k and whether to exclude its history. One pass, one search."""
        states, batch = self.encode(histories, events if events and events[0] else None)
        seen = [h if x else None for h, x in zip(histories, exclude_seen, strict=True)]
        recs = self.top_k(states, batch.items, ks, seen)
        if any(not r for r in recs):
            raise SeqrecError(NOTHING_LEFT)
        return recs

    def _rank_candidates(self, state: torch.Tensor, window: torch.Tensor, history: list[int],
                         candidates: list[int], k: int, exclude_seen: bool) -> list[Recommendation]:
        """Exact ranking of the given items only (removed ones and, when asked, seen ones dropped)."""
        seen = set(history) if exclude_seen else set()
        keep = sorted({c for c in candidates if self.catalogue.is_active(c) and c not in seen})
        if not keep:
            given = set(candidates)
            active = {c for c in given if self.catalogue.is_active(c)}
            raise SeqrecError(f"no candidate is left to recommend: of {len(given)} distinct, {len(given - active)} "
                              "removed from recommendations" + (f", {len(active & seen)} (the others) in the history "
                                                                "(exclude_seen)" if exclude_seen else ""))
        ids = torch.tensor(keep, device=state.device)
        scores = self._exact(state, ids)
        offsets = self.model.history_offsets(window)
        if offsets is not None:
            scores = scores + (window[0][None, :] == ids[:, None]).float() @ offsets[0].float()
        top = torch.topk(scores, min(k, len(keep)))
        return self._results(top.values.tolist(), ids[top.indices].tolist())

    @torch.no_grad()
    def similar(self, item: str, k: int = 10) -> list[Recommendation]:
        """The k items the model scores highest for a state equal to this item's vector (the item excluded)."""
        self.check_k(k)
        (idx,) = self.catalogue.lookup(item_ids([item], "item"))
        query = self.catalogue.vectors[idx : idx + 1]
        values, ids = self.catalogue.retriever.search(query, k, exclude=[[idx]])
        return self._results(values[0].tolist(), ids[0].tolist())
