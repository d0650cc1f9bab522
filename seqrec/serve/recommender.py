"""Top-k recommendations for a raw history of item ids, from a saved run or checkpoint.

Models with side features use the same features as in training: the item
features of every history item and candidate come from the checkpoint's item
tables; event features are derived from the history's `times` (gap, hour) and
`events` (e.g. rating) exactly as `seqrec.data.features` derives them from a
prepared log. Values not given are missing, which the model encodes with its
learned "missing" vector (the policy it was trained with for unknown values).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from seqrec.data.batching import Batch, history_batch
from seqrec.data.features import DERIVED_EVENTS, event_values
from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel
from seqrec.serve.ann import IVFIndex
from seqrec.train.checkpoint import load_checkpoint


@dataclass(frozen=True)
class Recommendation:
    item: str  # raw item id
    score: float
    title: str | None = None


class Recommender:
    def __init__(self, model: SequentialModel, items: pl.DataFrame, max_len: int) -> None:
        self.model, self.max_len = model.eval(), max_len
        self.raw_ids: list[str] = items.sort("idx")["item"].to_list()
        self.titles: list[str | None] | None = (
            items.sort("idx")["title"].cast(pl.Utf8).to_list() if "title" in items.columns else None
        )
        self.index = {raw: i + 1 for i, raw in enumerate(self.raw_ids)}
        self.ann: IVFIndex | None = None
        self._ann_options: tuple[int | None, int | None] | None = None

    @classmethod
    def from_run(cls, path: Path | str, device: str = "cpu") -> Recommender:
        """A run folder (with checkpoint/) or a checkpoint folder."""
        path = Path(path)
        ckpt = path / "checkpoint" if (path / "checkpoint").is_dir() else path
        if not (ckpt / "model.json").is_file():
            raise SeqrecError(f"{path}: no checkpoint found (expected {ckpt / 'model.json'})")
        model, meta = load_checkpoint(ckpt, device)
        return cls(model, pl.read_parquet(ckpt / "items.parquet"), int(meta["max_len"]))

    def use_index(self, n_lists: int | None = None, n_probe: int | None = None) -> IVFIndex:
        """Serve top-k from an approximate (IVF) index of the item vectors instead of scoring every item;
        `candidates` still rank exactly. Defaults: 2 sqrt(N) lists, an eighth of them probed."""
        self._ann_options = (n_lists, n_probe)
        emb, bias = self.model.item_embeddings(), self.model.item_bias()
        self.ann = IVFIndex(emb.detach(), None if bias is None else bias.detach(), n_lists, n_probe)
        return self.ann

    def add_items(self, texts: Mapping[str, str]) -> None:
        """Make new items (raw id -> text) recommendable and usable in histories, from their text alone.

        Needs a text model (UniSRec): the text is encoded with the checkpoint's own encoder settings."""
        add = getattr(self.model, "add_items", None)
        if add is None:
            raise SeqrecError(f"{self.model.name} has no item text: new items need a text model (unisrec)")
        clash = [r for r in texts if r in self.index]
        if clash:
            raise SeqrecError(f"item id(s) already in the catalogue: {clash[:5]}")
        from seqrec.data.text import encode_texts

        vectors = encode_texts(list(texts.values()), self.model.config.text_options())  # type: ignore[union-attr,operator]
        new = add(vectors.to(self.model.item_embeddings().device))
        for raw, idx, text in zip(texts, new, texts.values(), strict=True):
            self.raw_ids.append(raw)
            self.index[raw] = idx
            if self.titles is not None:
                self.titles.append(text)
        if self._ann_options is not None:  # the new items go into a rebuilt index
            self.use_index(*self._ann_options)

    @property
    def n_items(self) -> int:
        return len(self.raw_ids)

    def to_indices(self, history: Sequence[str]) -> list[int]:
        unknown = [h for h in history if h not in self.index]
        if unknown:
            shown = ", ".join(repr(u) for u in unknown[:5])
            raise SeqrecError(f"unknown item id(s) in history: {shown}" + (" ..." if len(unknown) > 5 else ""))
        return [self.index[h] for h in history]

    def history_events(self, n: int, times: Sequence[float] | None,
                       events: Mapping[str, Sequence[float]] | None) -> dict[str, np.ndarray]:
        """Event feature values of an n-item history; what is not given is NaN (missing)."""
        names = self.model.event_feature_names()
        if times is not None and len(times) != n:
            raise SeqrecError(f"times has {len(times)} values for a history of {n} items")
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
    def recommend(self, history: Sequence[str], k: int = 10, exclude_seen: bool = False,
                  candidates: Sequence[str] | None = None, times: Sequence[float] | None = None,
                  events: Mapping[str, Sequence[float]] | None = None) -> list[Recommendation]:
        """Top-k raw item ids (most recent history item last), best first; only `candidates` when given.

        `times` (seconds) and `events` (name -> one value per history item) feed event features."""
        if not 1 <= k <= self.n_items:
            raise SeqrecError(f"k={k} must be between 1 and the catalogue size {self.n_items}")
        if not history:
            raise SeqrecError("the history is empty; give at least one item id")
        idx = self.to_indices(history)
        device = self.model.item_embeddings().device
        ev = self.history_events(len(idx), times, events)
        batch = history_batch([idx], self.max_len, [ev] if ev else None).to(device)
        if self.ann is not None and candidates is None:
            return self._from_index(batch, idx, k, exclude_seen)
        scores = self.model.score(batch)[0].float()
        scores[0] = -torch.inf
        if candidates is not None:
            allowed = torch.zeros_like(scores, dtype=torch.bool)
            allowed[torch.tensor(self.to_indices(candidates), dtype=torch.long, device=device)] = True
            scores[~allowed] = -torch.inf
        if exclude_seen:
            scores[torch.tensor(idx, device=device)] = -torch.inf
        k = min(k, int(torch.isfinite(scores).sum()))
        if k == 0:
            raise SeqrecError("no item is left to recommend after excluding the history")
        top = torch.topk(scores, k)
        return self._results(top.values.tolist(), top.indices.tolist())

    def _results(self, scores: Sequence[float], ids: Sequence[int]) -> list[Recommendation]:
        return [Recommendation(self.raw_ids[i - 1], float(s), None if self.titles is None else self.titles[i - 1])
                for s, i in zip(scores, ids, strict=True) if i > 0]

    def _from_index(self, batch: Batch, idx: list[int], k: int, exclude_seen: bool) -> list[Recommendation]:
        """Top-k from the ANN index. A model with a learned history bias shifts the scores of history
        items only: the index returns the best items outside the history, and the history items are
        scored exactly and merged in (unless excluded)."""
        assert self.ann is not None
        h = self.model.encode(batch)
        offsets = self.model.history_offsets(batch.items)
        if exclude_seen or offsets is None:
            values, ids = self.ann.search(h, k, exclude=[idx] if exclude_seen else None)
            return self._results(values[0].tolist(), ids[0].tolist())
        seen = torch.unique(batch.items[batch.items != 0])  # the items the offsets apply to (the model's window)
        values, ids = self.ann.search(h, k, exclude=[seen.tolist()])
        # exact scores of the window's items only (not the whole catalogue): base score + history offsets
        bias = self.model.item_bias()
        base = h[0] @ self.model.item_embeddings()[seen].T + (0.0 if bias is None else bias[seen])
        exact = base.float() + (batch.items[0][None, :] == seen[:, None]).float() @ offsets[0].float()
        merged_ids = torch.cat([ids[0], seen])
        merged = torch.cat([values[0].float(), exact])
        top = torch.topk(merged, min(k, len(merged)))
        return self._results(top.values.tolist(), merged_ids[top.indices].tolist())
