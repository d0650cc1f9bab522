"""The live catalogue of a service: raw item ids, titles, item vectors (+ output bias) and a retriever, and
the texts of the items given one while it runs (added or replaced by text).

Item ids only grow (1..N; 0 is padding) and a removed item is a tombstone, so an id a reader
holds never changes meaning. Writers (add, replace, remove) take `lock`; readers take no lock:
they read `vectors`, a view of the first N+1 rows of a buffer that grows by doubling
(`seqrec.nn.rows`), and rows are written before N moves past them, so a reader sees a consistent
catalogue of some size.
These vectors live on the model's device, for the exact scores of history items and candidates;
the retriever keeps its own copy where it searches (the CPU, for FAISS and the exact scorer).
Shapes: N items, D width.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import torch

from seqrec.errors import SeqrecError
from seqrec.nn.rows import append_rows
from seqrec.serve.ann import INDEX_KINDS, INDEX_OPTIONS, Retriever, build_retriever

log = logging.getLogger(__name__)


class UnknownItem(SeqrecError):
    """An item id the catalogue does not hold."""


class Catalogue:
    def __init__(self, raw_ids: Sequence[str], titles: Sequence[str | None], vectors: torch.Tensor,
                 bias: torch.Tensor | None, index: str = "exact", **index_options: object) -> None:
        """vectors (N+1, D) and bias (N+1,) with row 0 the padding item; raw_ids/titles of items 1..N."""
        if len(raw_ids) != vectors.shape[0] - 1 or len(titles) != len(raw_ids):
            raise ValueError("raw_ids, titles and vectors must describe the same items")
        self.lock = threading.RLock()
        self.on_unknown: Callable[[], object] | None = None  # brings in changes made elsewhere (`lookup`)
        self.raw_ids, self.titles = list(raw_ids), list(titles)
        self.index = {raw: i + 1 for i, raw in enumerate(self.raw_ids)}
        self.removed: set[int] = set()
        self.texts: dict[int, str] = {}  # index -> text, for the items added or given a text while serving
        self.generation = 0  # counts replacements of existing items' vectors (caches of them go stale)
        self._vectors, self._bias = vectors.detach().float().clone(), None if bias is None else bias.detach().float()
        self._n = len(self.raw_ids)
        self.retriever = self._build(index, dict(index_options))

    @property
    def n_items(self) -> int:
        return self._n

    @property
    def n_active(self) -> int:
        return self._n - len(self.removed)

    def counts(self) -> dict[str, int]:
        """n_items (known, removed ones included) and n_active (recommendable). Without the lock: /health
        answers on the event loop, which must never wait for a catalogue change (a change under way may
        show in one count and not yet in the other)."""
        return {"n_items": self._n, "n_active": self.n_active}

    @property
    def vectors(self) -> torch.Tensor:
        """(N+1, D) item vectors, row 0 padding."""
        n = self._n  # read first: `append` puts the larger table in place before it counts the new rows
        return self._vectors[: n + 1]

    @property
    def bias(self) -> torch.Tensor | None:
        n = self._n
        return None if self._bias is None else self._bias[: n + 1]

    def _build(self, kind: str, options: dict[str, object]) -> Retriever:
        if kind not in INDEX_KINDS:
            raise SeqrecError(f"unknown index {kind!r}; choose one of {', '.join(INDEX_KINDS)}")
        unknown = sorted(set(options) - set(INDEX_OPTIONS))
        if unknown:
            raise SeqrecError(f"unknown index option(s) {', '.join(unknown)}; the options are "
                              f"{', '.join(INDEX_OPTIONS)}")
        retriever = build_retriever(kind, self.vectors, self.bias, **options)  # type: ignore[arg-type]
        if self.removed:
            retriever.remove(sorted(self.removed))
        return retriever

    def use_index(self, kind: str, **options: object) -> Retriever:
        """Serve top-k from another index over the same items (exact, hnsw or ivf)."""
        with self.lock:
            self.retriever = self._build(kind, options)
        return self.retriever

    def lookup(self, raws: Sequence[str], where: str = "", follow: bool = True) -> list[int]:
        """Raw ids -> item indices; unknown ids are an error naming them (and `where` they were). With
        `follow`, an unknown id is looked up again after `on_unknown` (a followed catalogue log) has
        brought in the changes other processes made."""
        try:
            return [self.index[r] for r in raws]
        except KeyError:
            if follow and self.on_unknown is not None:
                self.on_unknown()
                return self.lookup(raws, where, follow=False)
            unknown = [r for r in raws if r not in self.index]
            shown = ", ".join(repr(u) for u in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
            raise UnknownItem(f"unknown item id(s){where}: {shown}") from None

    def known(self, raws: Sequence[str]) -> list[bool]:
        """Whether each raw id is an item here (after one `on_unknown` catch-up when one is not)."""
        if self.on_unknown is not None and any(r not in self.index for r in raws):
            self.on_unknown()
        return [r in self.index for r in raws]

    def split_known(self, raws: Sequence[str]) -> tuple[list[str], list[str]]:
        """`raws` -> (the ids this catalogue holds, the others), each in the order given (`known`)."""
        keep = self.known(raws)
        return ([r for r, k in zip(raws, keep, strict=True) if k],
                [r for r, k in zip(raws, keep, strict=True) if not k])

    def is_active(self, idx: int) -> bool:
        return 1 <= idx <= self._n and idx not in self.removed

    def title(self, idx: int) -> str | None:
        return self.titles[idx - 1]

    def append(self, raws: Sequence[str], titles: Sequence[str | None], vectors: torch.Tensor,
               bias: torch.Tensor | None, texts: Sequence[str] | None = None) -> list[int]:
        """New items (raw ids not yet known) with their vectors (n, D) [+ bias (n,)] [and the texts they
        were made from] -> their indices."""
        n = len(raws)
        if len(titles) != n or len(vectors) != n or (bias is not None and len(bias) != n):
            raise SeqrecError(f"append: {n} ids, {len(titles)} titles, {len(vectors)} vectors"
                              + ("" if bias is None else f" and {len(bias)} biases") + ": they must match")
        with self.lock:
            first = self._n + 1
            self._vectors = append_rows(self.vectors, vectors, self._vectors)
            if self._bias is not None:
                self._bias = append_rows(self._bias[:first], torch.zeros(n) if bias is None else bias, self._bias)
            self.raw_ids.extend(raws)
            self.titles.extend(titles)
            ids = list(range(first, first + n))
            if texts is not None:
                self.texts.update(zip(ids, texts, strict=True))
            # known (usable in histories) before the search can return them: a client may send back at once
            # an id it was just recommended
            self._n += n  # readers see the new rows from here on
            self.index.update(zip(raws, ids, strict=True))
            try:
                self.retriever.add(vectors, None if self._bias is None else self._bias[first : first + n])
            except BaseException:  # nothing half-added
                self._n -= n
                for raw in raws:
                    del self.index[raw]
                for i in ids:
                    self.texts.pop(i, None)
                del self.raw_ids[first - 1 :], self.titles[first - 1 :]
                raise
            return ids

    def replace(self, ids: Sequence[int], titles: Sequence[str | None], vectors: torch.Tensor,
                texts: Sequence[str] | None = None) -> None:
        """New vectors and titles [and the texts they were made from] for known items; a removed one is
        recommendable again."""
        with self.lock:
            if texts is not None:
                self.texts.update(zip(ids, texts, strict=True))
            at = torch.as_tensor(list(ids), dtype=torch.long)
            table = self._vectors.clone()  # a new table: a reader scoring the old one never sees a row half-written
            table[at] = vectors.to(table)
            self._vectors = table
            for i, title in zip(ids, titles, strict=True):
                self.titles[i - 1] = title
            self.retriever.update(list(ids), vectors, None if self._bias is None else self._bias[at])
            self.generation += 1
            back = [i for i in ids if i in self.removed]
            if back:
                self.retriever.restore(back)
                self.removed.difference_update(back)

    def remove(self, ids: Sequence[int]) -> None:
        """Never recommend these items again (they stay known: histories may hold them)."""
        with self.lock:
            fresh = sorted(set(ids) - self.removed)
            if fresh:
                self.retriever.remove(fresh)
                self.removed.update(fresh)


def item_ids(ids: Sequence[str], what: str) -> list[str]:
    """`ids` as a list of raw item ids (strings, as the log wrote them). One string is refused (a str is a
    sequence of its characters, which would be taken as one-character ids), as is an id of another type."""
    if isinstance(ids, str):
        raise SeqrecError(f"the {what} is a list of item ids, not one string: give [{ids!r}] for one item")
    out = list(ids)
    other = next((i for i in out if not isinstance(i, str)), None)
    if other is not None:
        raise SeqrecError(f"the {what} holds {other!r}, a {type(other).__name__}: item ids are strings, as the "
                          f"log wrote them (give {str(other)!r})")
    return out
