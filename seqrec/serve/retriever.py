"""The exact retriever and what every retriever shares: an immutable snapshot of the item tables,
a readers-writer lock, the ranking of candidates. See `seqrec.serve.ann` for the whole picture.

Shapes: N items (ids 1..N, 0 = padding, never returned), D width, Q queries, k.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from seqrec.errors import SeqrecError
from seqrec.nn.rows import append_rows

_CHUNK = 1 << 24  # exact search scores at most this many (query, item) pairs at once (64 MiB)


@dataclass(frozen=True)
class _Items:
    """One immutable snapshot of the catalogue: vectors (N+1, D), bias (N+1,), removed (N+1,) bool."""

    vectors: torch.Tensor
    bias: torch.Tensor
    removed: torch.Tensor  # removed[0] is True: the padding item is never returned
    n_active: int  # items not removed

    @staticmethod
    def make(vectors: torch.Tensor, bias: torch.Tensor | None) -> _Items:
        if vectors.dim() != 2 or len(vectors) < 2:
            raise SeqrecError(f"item vectors must be (N+1, D) with N >= 1, got {tuple(vectors.shape)}")
        v, b = _rows(vectors, bias, len(vectors), vectors.shape[1])
        # its own copy: a caller writing into the tensors it passed (a catalogue replacing an item's
        # vector) would otherwise change a snapshot that readers are searching
        return _Items(v.clone(), b.clone(), torch.arange(len(v)) == 0, len(v) - 1)

    def check_ids(self, ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        t = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        if len(t) and (int(t.min()) < 1 or int(t.max()) >= len(self.vectors)):
            raise SeqrecError(f"item ids must be in 1..{len(self.vectors) - 1}")
        return t


def _rows(vectors: torch.Tensor, bias: torch.Tensor | None, n: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Item vectors (n, d) and bias (n,) (zeros if None) as contiguous float32 CPU tensors."""
    if tuple(vectors.shape) != (n, d) or (bias is not None and bias.numel() != n):
        raise SeqrecError(f"expected item vectors ({n}, {d}) and a bias of {n}, got {tuple(vectors.shape)} and "
                          f"{None if bias is None else tuple(bias.shape)}")
    b = torch.zeros(n) if bias is None else bias.detach().float().cpu().reshape(n)
    return vectors.detach().float().cpu().contiguous(), b.contiguous()


class _RWLock:
    """Many readers or one writer."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writing)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writing)
            self._writing = True  # no new readers from here on
            self._cond.wait_for(lambda: self._readers == 0)
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


def rank(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(Q, C) float32 candidate scores and int64 ids -> the best k per row (Q, k), by score then lower
    id; -inf means unreachable: such places get id 0 and sort last, as does the padding of short rows."""
    if scores.shape[1] < k:
        pad = ((0, 0), (0, k - scores.shape[1]))
        scores, ids = np.pad(scores, pad, constant_values=-np.inf), np.pad(ids, pad)
    order = np.lexsort((ids, -scores), axis=1)[:, :k]
    scores, ids = np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)
    return scores, np.where(np.isneginf(scores), 0, ids)


class Retriever(ABC):
    """Top-k items for user states; the catalogue can grow, shrink and change while serving."""

    kind: str

    def __init__(self, vectors: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self._items = _Items.make(vectors, bias)
        # the stores the items' vectors, bias and removed flags grow in (seqrec.nn.rows)
        self._store: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None] = (None, None, None)
        self._writer = threading.Lock()  # one mutation at a time; readers are never blocked by it

    @property
    def n_items(self) -> int:
        return len(self._items.vectors) - 1

    @property
    def dim(self) -> int:
        return int(self._items.vectors.shape[1])

    @property
    def rebuilding(self) -> bool:
        """Whether the index is being rebuilt in the background (a FAISS index after heavy changes)."""
        return False

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no rebuild runs in the background; False if `timeout` seconds passed first."""
        return True

    @abstractmethod
    def search(self, queries: torch.Tensor, k: int, exclude: list[list[int]] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """queries (Q, D) -> (scores (Q, k) float32, ids (Q, k) int64, 1-based), best first, by exact
        score q . v_i + b_i (ties: lower id first). Fewer than k reachable items: -inf and id 0 fill the
        tail. exclude: per query, item ids never returned. Removed items are never returned."""

    def _check_queries(self, queries: torch.Tensor, k: int, exclude: list[list[int]] | None) -> torch.Tensor:
        q = queries.detach().float().cpu()
        if q.dim() != 2 or q.shape[1] != self.dim:
            raise SeqrecError(f"queries must be (Q, {self.dim}), got {tuple(q.shape)}")
        if k < 1:
            raise SeqrecError(f"k must be at least 1, got {k}")
        if exclude is not None and len(exclude) != len(q):
            raise SeqrecError(f"exclude has {len(exclude)} lists for {len(q)} queries")
        return q.contiguous()

    def add(self, vectors: torch.Tensor, bias: torch.Tensor | None = None) -> range:
        """Append items (n, D) [+ bias (n,), zeros if None]; they get ids N+1..N+n (returned)."""
        with self._writer:
            old = self._items
            n, m = len(vectors), len(old.vectors)
            v, b = _rows(vectors, bias, n, self.dim)
            # appended in place after the rows a snapshot holds (seqrec.nn.rows): no copy of the table per add
            self._store = (append_rows(old.vectors, v, self._store[0]), append_rows(old.bias, b, self._store[1]),
                           append_rows(old.removed, torch.zeros(n, dtype=torch.bool), self._store[2]))
            vecs, bs, removed = self._store
            new = _Items(vecs[: m + n], bs[: m + n], removed[: m + n], old.n_active + n)
            ids = range(m, m + n)
            self._commit(new, torch.arange(ids.start, ids.stop))
        return ids

    def remove(self, ids: Sequence[int] | torch.Tensor) -> None:
        """Items never returned again (a tombstone; ids are not reused; `restore` undoes it)."""
        self._set_removed(ids, True)

    def restore(self, ids: Sequence[int] | torch.Tensor) -> None:
        """Removed items are returned again, under the same ids and with the same vectors."""
        self._set_removed(ids, False)

    def _set_removed(self, ids: Sequence[int] | torch.Tensor, value: bool) -> None:
        with self._writer:
            old = self._items
            t = torch.unique(old.check_ids(ids))
            flipped = t[old.removed[t] != value]
            removed = old.removed.clone()  # a copy: readers keep the old flags
            removed[flipped] = value
            self._commit(replace(old, removed=removed, n_active=old.n_active + len(flipped) * (-1 if value else 1)),
                         torch.zeros(0, dtype=torch.long), flipped)

    def update(self, ids: Sequence[int] | torch.Tensor, vectors: torch.Tensor,
               bias: torch.Tensor | None = None) -> None:
        """Replace the vectors (n, D) [and bias (n,); None keeps the old bias] of existing ids."""
        with self._writer:
            old = self._items
            t = old.check_ids(ids)
            if len(torch.unique(t)) != len(t):
                raise SeqrecError("update: an id is given twice")
            v, b = _rows(vectors, bias, len(t), self.dim)
            # a copy (readers keep the old rows), into stores with room: the next add does not copy again
            self._store = (append_rows(old.vectors, v[:0]), append_rows(old.bias, b[:0]), self._store[2])
            vecs, bs = self._store[0][: len(old.vectors)], self._store[1][: len(old.bias)]
            vecs[t] = v
            if bias is not None:
                bs[t] = b
            self._commit(replace(old, vectors=vecs, bias=bs), t)

    def _commit(self, items: _Items, changed: torch.Tensor, flipped: torch.Tensor | None = None) -> None:
        """Make `items` current; `changed`: ids whose vectors are new (added or updated); `flipped`: ids
        removed or restored."""
        self._items = items


class ExactRetriever(Retriever):
    """Every item scored: q V^T + b, top-k. Equal to the evaluation's full ranking."""

    kind = "exact"

    @torch.no_grad()
    def search(self, queries: torch.Tensor, k: int, exclude: list[list[int]] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        q = self._check_queries(queries, k, exclude)
        items = self._items  # one snapshot for the whole call
        step = max(1, _CHUNK // len(items.vectors))
        out = [self._top(q[lo : lo + step], items, k, exclude[lo : lo + step] if exclude else None)
               for lo in range(0, max(len(q), 1), step)]
        scores, ids = zip(*out, strict=True)
        return torch.from_numpy(np.concatenate(scores)), torch.from_numpy(np.concatenate(ids))

    @staticmethod
    def _top(q: torch.Tensor, items: _Items, k: int, exclude: list[list[int]] | None
             ) -> tuple[np.ndarray, np.ndarray]:
        scores = torch.addmm(items.bias, q, items.vectors.T)  # (q, N+1), bias added in the product's pass
        if items.n_active < len(items.removed) - 1:  # (a count, not a pass over the flags)
            scores.masked_fill_(items.removed, -torch.inf)
        else:  # nothing removed but the padding: one column, not a pass over every score
            scores[:, 0] = -torch.inf
        if exclude and any(exclude):  # every row's exclusions in one indexed write
            cols = torch.as_tensor([i for drop in exclude for i in drop], dtype=torch.long)
            rows = torch.repeat_interleave(torch.arange(len(exclude)), torch.as_tensor([len(d) for d in exclude]))
            inside = (cols >= 0) & (cols < scores.shape[1])
            scores[rows[inside], cols[inside]] = -torch.inf
        kk = min(k, scores.shape[1])
        values, ids = scores.topk(min(kk + 1, scores.shape[1]), dim=1)
        if values.shape[1] > kk:  # a tie across the k-th place is decided by lower id: stable sort of the row
            rows = (values[:, kk] == values[:, kk - 1]).nonzero().view(-1)
            values, ids = values[:, :kk], ids[:, :kk]
            if len(rows):
                values[rows], ids[rows] = (t[:, :kk] for t in scores[rows].sort(dim=1, descending=True, stable=True))
        return rank(values.numpy(), ids.numpy(), k)

