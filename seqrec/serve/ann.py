"""Top-k retrieval over item vectors: exact (torch) or approximate (FAISS HNSW / IVF), one interface.

The model scores item i for a user state q as

    s_i = q . v_i + b_i

and serving wants the k items of highest s_i. `ExactRetriever` computes every s_i (one matrix
product, as the evaluation does). `FaissRetriever` finds candidates with an index and then
recomputes s_i exactly for them, so what it returns is always the model's own score; only
which items it finds can differ from exact.

Both indexes search the items as x_i = [v_i, b_i] for the query y = [q, 1], so s_i = y . x_i.

HNSW (Malkov & Yashunin, TPAMI 2018) is built and searched on the inner product itself, a
non-metric similarity graph (Morozov & Babenko, "Non-metric similarity graphs for maximum inner
product search", NeurIPS 2018). IVF (Jegou et al., TPAMI 2011) clusters by L2, so for it maximum
inner product with unequal norms is first turned into nearest-neighbour search (Bachrach et al.,
"Speeding up the Xbox recommender system using a Euclidean transformation for inner-product
spaces", RecSys 2014): with M = max_i |x_i|,

    x'_i = [x_i, sqrt(M^2 - |x_i|^2)]      (every x'_i has norm M),   y' = [y, 0]
    |y' - x'_i|^2 = |y|^2 + M^2 - 2 s_i

so the nearest x'_i under L2 are the items of highest s_i. An added item with |x| > M does not fit
the transform: it is scored exactly beside the index until the IVF index is rebuilt with a new M.
HNSW does without the transform, which cost it much of its recall on items of unequal norms, while
IVF gains from it on real vectors (benchmarks/retrieval.py, "spaces").

Mutation: `add`, `remove`, `restore` and `update` build a new snapshot of the item tables and
swap it in; a search reads one snapshot, so readers never see a half-applied change (`add`
writes its rows after those of the current snapshot, in a store that grows by doubling, so it
does not copy the table). FAISS indexes must not be searched while items are added: searches
share a readers' lock, writers take it alone (a rebuild is done outside it and only swapped in
under it). Removed items and replaced vectors are tombstones: their index rows stay, masked out
of searches by an `IDSelectorBitmap` of the live rows; when a quarter of the rows are dead the
index is rebuilt over the live items alone, and an item restored after that gets a row again.
Rebuilds (also for an IVF index that has grown to 4x the items it was built over, or that was given an
item too long for its transform, which is scored exactly beside the index meanwhile) run in a background
thread over a snapshot; the change that made one due returns at once, and at the swap the new index gets
rows for whatever changed since the snapshot. `Retriever.wait()` blocks until no rebuild runs.

Shapes: N items (ids 1..N, 0 = padding, never returned), D width, Q queries, R index rows, k.
"""


from __future__ import annotations

import torch

from seqrec.errors import SeqrecError
from seqrec.serve.faiss_index import FaissRetriever, default_n_lists, default_n_probe, faiss, item_rows, query_rows
from seqrec.serve.retriever import ExactRetriever, Retriever, rank

__all__ = ["INDEX_KINDS", "INDEX_OPTIONS", "ExactRetriever", "FaissRetriever", "Retriever", "build_retriever",
           "default_n_lists", "default_n_probe", "faiss", "item_rows", "query_rows", "rank"]

INDEX_KINDS = ("exact", "hnsw", "ivf")
INDEX_OPTIONS = ("hnsw_m", "ef_construction", "ef_search", "n_lists", "n_probe", "threads", "seed")  # build_retriever's


def build_retriever(kind: str, vectors: torch.Tensor, bias: torch.Tensor | None = None, *,
                    hnsw_m: int = 32, ef_construction: int = 100, ef_search: int = 128,
                    n_lists: int | None = None, n_probe: int | None = None, threads: int | None = None,
                    seed: int = 0) -> Retriever:
    """vectors (N+1, D) with row 0 the padding item; bias (N+1,) or None. `threads`: FAISS's OpenMP
    threads, a process-wide setting (None leaves it as it is); `seed`: the IVF training sample and
    k-means initialisation."""
    if kind not in INDEX_KINDS:
        raise SeqrecError(f"unknown index kind {kind!r}; one of {', '.join(INDEX_KINDS)}")
    for name, value, least in (("hnsw_m", hnsw_m, 2), ("ef_construction", ef_construction, 1),
                               ("ef_search", ef_search, 1), ("n_lists", n_lists, 1), ("n_probe", n_probe, 1),
                               ("threads", threads, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise SeqrecError(f"index option {name} must be a whole number >= {least}, got {value!r}")
    if threads is not None:
        faiss.omp_set_num_threads(threads)
    if kind == "exact":
        return ExactRetriever(vectors, bias)
    return FaissRetriever(kind, vectors, bias, hnsw_m=hnsw_m, ef_construction=ef_construction,
                          ef_search=ef_search, n_lists=n_lists, n_probe=n_probe, seed=seed)
