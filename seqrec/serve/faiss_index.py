"""FAISS HNSW and IVF behind the `Retriever` interface (see `seqrec.serve.ann` for the design).

Shapes: N items, D width, Q queries, R index rows, k.
"""

from __future__ import annotations

import importlib
import logging
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from seqrec.errors import SeqrecError
from seqrec.serve.retriever import Retriever, _Items, _RWLock, rank

log = logging.getLogger(__name__)
faiss: Any = importlib.import_module("faiss")  # typed as Any: the SWIG module's own annotations are wrong

_DEAD_SHARE = 0.25  # rebuild a FAISS index when this share of its rows are tombstones
_GROWTH = 4  # rebuild an IVF index grown to this many times the items it was built over (its lists too few)
# an added item may exceed the IVF transform's M by this share before the index is rebuilt: rounding
# alone puts unit vectors a hair over it, and a row a hair long only loses a little as a candidate (the
# candidates are rescored exactly)
_NORM_SLACK = 1e-4


@dataclass(frozen=True)
class _Index:
    """A FAISS index over the transformed items and its bookkeeping (R rows)."""

    index: Any  # faiss.IndexHNSWFlat | faiss.IndexIVFFlat
    max_norm: float  # M of the IVF transform (inf for HNSW: no transform)
    row_to_id: np.ndarray  # (R,) int64: the item id each row was added for
    id_to_row: np.ndarray  # (N+1,) int64: each item's current row (-1: none)
    live: np.ndarray  # (R,) uint8 bitmap (little-endian bits) of the rows searches may return
    n_live: int
    n_built: int = 0  # the items it was built over (an IVF index that grows past GROWTH times that is rebuilt)

    def select(self, items: _Items) -> _Index:
        """Recompute the live rows: an item's current row, unless the item is removed."""
        ids = self.row_to_id
        ok = (self.id_to_row[ids] == np.arange(len(ids))) & ~items.removed.numpy()[ids]
        return replace(self, live=np.packbits(ok, bitorder="little"), n_live=int(ok.sum()))


def item_rows(kind: str, vectors: torch.Tensor, bias: torch.Tensor, max_norm: float) -> np.ndarray:
    """(n, D), (n,) -> float32 rows of the index: [v, b] for HNSW (n, D+1); for IVF (n, D+2) with
    sqrt(M^2 - |[v, b]|^2) appended, so every row has norm M."""
    vb = torch.cat([vectors, bias.unsqueeze(1)], dim=1)
    if kind == "hnsw":
        return vb.float().contiguous().numpy()
    extra = (max_norm**2 - (vb.double() ** 2).sum(1, keepdim=True)).clamp(min=0).sqrt()
    return torch.cat([vb.double(), extra], dim=1).float().numpy()


def query_rows(kind: str, q: np.ndarray) -> np.ndarray:
    """(Q, D) -> float32 [q, 1] for HNSW, [q, 1, 0] for IVF."""
    y = np.zeros((len(q), q.shape[1] + (1 if kind == "hnsw" else 2)), dtype=np.float32)
    y[:, : q.shape[1]] = q
    y[:, q.shape[1]] = 1.0
    return y


class FaissRetriever(Retriever):
    """Candidates from a FAISS index, then exact scores (module docstring).
    `ef_search` (HNSW) / `n_probe` (IVF) may be changed between searches."""

    def __init__(self, kind: str, vectors: torch.Tensor, bias: torch.Tensor | None = None, *,
                 hnsw_m: int = 32, ef_construction: int = 100, ef_search: int = 128,
                 n_lists: int | None = None, n_probe: int | None = None, seed: int = 0) -> None:
        if kind not in ("hnsw", "ivf"):
            raise SeqrecError(f"unknown FAISS index kind {kind!r}: 'hnsw' or 'ivf'")
        super().__init__(vectors, bias)
        self.kind = kind
        self.hnsw_m, self.ef_construction, self.ef_search = hnsw_m, ef_construction, ef_search
        self._n_lists_given, self._n_probe_given, self.seed = n_lists, n_probe, seed
        self._size_ivf(self.n_items)
        self._lock = _RWLock()
        self._index = self._build(self._items)

    def _size_ivf(self, n: int) -> None:
        """IVF lists and probes for n items: the ones given, else the defaults for n (again at each rebuild,
        so a catalogue grown by POST /items keeps its recall)."""
        self.n_lists = max(1, min(n, self._n_lists_given or default_n_lists(n)))
        self.n_probe = max(1, min(self.n_lists, self._n_probe_given or default_n_probe(self.n_lists, n)))

    @property
    def index(self) -> Any:
        """The current FAISS index (for its size: faiss.serialize_index)."""
        return self._index.index

    def _build(self, items: _Items) -> _Index:
        """An index over the items not removed (removed ones come back as appended rows if restored)."""
        ids = np.flatnonzero(~items.removed.numpy())  # never the padding item 0: removed[0] is True
        vectors, bias = items.vectors[ids], items.bias[ids]
        vb = torch.cat([vectors, bias.unsqueeze(1)], dim=1)
        max_norm = math.inf if self.kind == "hnsw" else float(vb.double().norm(dim=1).max())
        x = item_rows(self.kind, vectors, bias, max_norm)
        if self.kind == "hnsw":
            index = faiss.IndexHNSWFlat(x.shape[1], self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = self.ef_construction
        else:
            index = faiss.IndexIVFFlat(faiss.IndexFlatL2(x.shape[1]), x.shape[1], self.n_lists, faiss.METRIC_L2)
            index.cp.seed = self.seed
            n_train = min(len(x), 256 * self.n_lists)
            pick = np.sort(np.random.default_rng(self.seed).choice(len(x), n_train, replace=False))
            index.train(x[pick] if n_train < len(x) else x)
        index.add(x)
        id_to_row = np.full(len(items.vectors), -1, dtype=np.int64)
        id_to_row[ids] = np.arange(len(ids))
        return _Index(index, max_norm, ids.astype(np.int64), id_to_row, np.zeros(0, dtype=np.uint8), 0,
                      len(ids)).select(items)

    def _params(self, ix: _Index, fetch: int, widen: int) -> Any:
        """Search parameters for `fetch` results: tombstones masked out; HNSW's candidate list at least
        2 `fetch` long, IVF enough lists to hold about 2 `fetch` live items; both `widen` times more."""
        sel = None if ix.n_live == len(ix.row_to_id) else faiss.IDSelectorBitmap(ix.live)  # keeps a reference
        if self.kind == "hnsw":
            return faiss.SearchParametersHNSW(efSearch=max(self.ef_search, 2 * fetch) * widen, sel=sel), sel
        probe = max(self.n_probe * widen, math.ceil(2 * fetch * ix.index.nlist / ix.n_live))
        return faiss.SearchParametersIVF(nprobe=min(ix.index.nlist, probe), sel=sel), sel

    @torch.no_grad()
    def search(self, queries: torch.Tensor, k: int, exclude: list[list[int]] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """As Retriever.search. Rows left with fewer than k items (exclusions and tombstones beyond what
        was over-fetched, small IVF lists) are searched again with 4x wider parameters, up to all the
        IVF lists or an HNSW candidate list as long as the catalogue."""
        q = self._check_queries(queries, k, exclude).numpy()
        with self._lock.read():
            items, ix = self._items, self._index
            scores, ids = self._candidates(items, ix, q, k, exclude, 1)
            need = np.array([min(k, ix.n_live - len(e)) for e in exclude] if exclude else [min(k, ix.n_live)])
            widest = ix.index.nlist / self.n_probe if self.kind == "ivf" else ix.n_live / self.ef_search
            widen = 1
            while widen < widest:
                short = np.flatnonzero((ids > 0).sum(1) < need)
                if len(short) == 0:
                    break
                widen *= 4
                sub = [exclude[i] for i in short] if exclude else None
                scores[short], ids[short] = self._candidates(items, ix, q[short], k, sub, widen)
        return torch.from_numpy(scores), torch.from_numpy(ids)

    def _candidates(self, items: _Items, ix: _Index, q: np.ndarray, k: int, exclude: list[list[int]] | None,
                    widen: int) -> tuple[np.ndarray, np.ndarray]:
        """The index's candidates for q, exactly rescored, excluded and removed ones dropped, top k.
        NumPy, not torch: on one query, torch's per-call overhead is ten times FAISS's search."""
        fetch = min(k + (max((len(e) for e in exclude), default=0) if exclude else 0), ix.n_live)
        if fetch == 0 or len(q) == 0:
            return rank(np.zeros((len(q), 0), np.float32), np.zeros((len(q), 0), np.int64), k)
        params, _sel = self._params(ix, fetch, widen)  # _sel: the selector must outlive the search
        _, rows = ix.index.search(query_rows(self.kind, q), fetch, params=params)
        ids = np.where(rows >= 0, ix.row_to_id[rows], 0)  # (Q, fetch); FAISS pads with row -1
        scores = np.matmul(items.vectors.numpy()[ids], q[:, :, None])[:, :, 0] + items.bias.numpy()[ids]  # exact
        scores[items.removed.numpy()[ids]] = -np.inf  # also the padding, now id 0
        for r, drop in enumerate(exclude or []):
            if drop:
                scores[r, np.isin(ids[r], drop)] = -np.inf
        return rank(scores, ids, k)

    def _commit(self, items: _Items, changed: torch.Tensor) -> None:
        """New and replaced vectors become rows of the index, and so do restored items a rebuild left out;
        the index is rebuilt over the live items instead when a vector exceeds the IVF transform's M, or
        when more than `_DEAD_SHARE` of its rows would be dead (replaced or removed items), so that heavy
        deletions do not leave searches wading through tombstones, and (IVF) when the live items have
        grown to `_GROWTH` times those it was built over, so that its lists grow with the catalogue."""
        ix = self._index
        removed = items.removed.numpy()
        has_row = np.zeros(len(removed), dtype=bool)
        has_row[: len(ix.id_to_row)] = ix.id_to_row >= 0
        rows_for = torch.from_numpy(np.union1d(changed.numpy(), np.flatnonzero(~has_row & ~removed)))
        fresh = items.vectors[rows_for], items.bias[rows_for]
        norms = torch.cat([fresh[0], fresh[1].unsqueeze(1)], dim=1).double().norm(dim=1)
        n_rows, n_live = len(ix.row_to_id) + len(rows_for), int((~removed).sum())
        if n_live and len(rows_for) and float(norms.max()) > ix.max_norm * (1 + _NORM_SLACK):
            log.info("%s index: an item of norm %.4g exceeds M = %.4g; rebuilding", self.kind,
                     float(norms.max()), ix.max_norm)
            self._rebuild(items)
        elif self.kind == "ivf" and n_live > _GROWTH * max(ix.n_built, 1):
            log.info("ivf index: %d live items, built over %d; rebuilding with lists for the catalogue it is now",
                     n_live, ix.n_built)
            self._rebuild(items)
        elif n_live and n_rows - n_live > _DEAD_SHARE * n_rows:
            log.info("%s index: %d of %d rows are replaced or removed items; rebuilding over the %d live ones",
                     self.kind, n_rows - n_live, n_rows, n_live)
            self._rebuild(items)
        else:
            self._append(items, rows_for, item_rows(self.kind, *fresh, ix.max_norm))

    def _rebuild(self, items: _Items) -> None:
        if self.kind == "ivf":
            self._size_ivf(int((~items.removed).sum()))
        built = self._build(items)  # readers go on with the old index meanwhile
        with self._lock.write():
            self._items, self._index = items, built

    def _append(self, items: _Items, changed: torch.Tensor, x: np.ndarray) -> None:
        ix = self._index
        ids = changed.numpy()
        id_to_row = np.concatenate([ix.id_to_row, np.full(len(items.vectors) - len(ix.id_to_row), -1, np.int64)])
        id_to_row[ids] = np.arange(len(ix.row_to_id), len(ix.row_to_id) + len(ids))
        new = replace(ix, row_to_id=np.concatenate([ix.row_to_id, ids]), id_to_row=id_to_row).select(items)
        with self._lock.write():
            if len(x):
                ix.index.add(x)
            self._items, self._index = items, new


MIN_POINTS_PER_LIST = 39  # FAISS's k-means warns (and its centroids are poor) with fewer training points


def default_n_lists(n: int) -> int:
    """IVF lists for N items: 2 sqrt(N). On both catalogues of benchmarks/retrieval.py it matched or beat
    4 sqrt(N) lists in recall@10 at equal probes and latency, and builds 3x faster. A small catalogue
    (under about 6,000 items) gets fewer, so that every list trains on at least 39 items."""
    return max(1, min(round(2 * math.sqrt(n)), n // MIN_POINTS_PER_LIST))


def default_n_probe(n_lists: int, n_items: int) -> int:
    """IVF lists opened per query: 8 (recall@10 >= 0.99 on both benchmark catalogues), or enough lists
    to scan about 2,048 items, which costs next to nothing and protects small catalogues."""
    return min(n_lists, max(8, math.ceil(2048 * n_lists / max(n_items, 1))))

