"""Retrievers: exact equals the full ranking; HNSW / IVF find most of it and score it exactly; the
catalogue grows, shrinks and changes under them; the benchmark script runs."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest
import torch

from seqrec.data.dataset import PreparedDataset
from seqrec.errors import SeqrecError
from seqrec.serve.ann import INDEX_KINDS, FaissRetriever, Retriever, build_retriever, default_n_lists
from tests.bench_helpers import run_benchmark
from tests.serve_helpers import hold_rebuilds

ROOT = Path(__file__).resolve().parents[1]
ANN_KINDS = ("hnsw", "ivf")


def clustered(n: int = 3000, d: int = 16, clusters: int = 30, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(N+1, D) vectors (row 0 padding) around `clusters` centres, norms spread by a log-normal factor
    (popular items are longer), and a bias (N+1,)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(clusters, d, generator=g) * 2
    x = centres[torch.randint(clusters, (n,), generator=g)] + torch.randn(n, d, generator=g)
    x = x * torch.exp(0.3 * torch.randn(n, 1, generator=g))
    return torch.cat([torch.zeros(1, d), x]), torch.cat([torch.zeros(1), torch.randn(n, generator=g)])


def full_ranking(vectors: torch.Tensor, bias: torch.Tensor | None, q: torch.Tensor, k: int,
                 drop: list[list[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: every item scored, padding and `drop[r]` at -inf, torch top-k."""
    scores = q @ vectors.T + (0 if bias is None else bias)
    scores[:, 0] = -torch.inf
    for r, items in enumerate(drop or []):
        scores[r, items] = -torch.inf
    top = scores.topk(k, dim=1)
    return top.values, top.indices


def recall(ids: torch.Tensor, truth: torch.Tensor) -> float:
    return sum(len(set(a) & set(b)) for a, b in zip(ids.tolist(), truth.tolist(), strict=True)) / truth.numel()


def queries(n: int, d: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed)) * 2


def assert_exact(r: Retriever, vectors: torch.Tensor, bias: torch.Tensor | None, q: torch.Tensor, k: int,
                 drop: list[list[int]] | None = None, exclude: list[list[int]] | None = None) -> None:
    values, ids = r.search(q, k, exclude=exclude)
    ref_values, ref_ids = full_ranking(vectors, bias, q, k, drop)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(values, ref_values, atol=1e-5, rtol=0)


@pytest.mark.parametrize("with_bias", [False, True])
def test_exact_equals_the_full_ranking(with_bias: bool) -> None:
    x, b = clustered()
    bias = b if with_bias else None
    q = queries(64, x.shape[1])
    assert_exact(build_retriever("exact", x, bias), x, bias, q, 10)


def test_exact_with_exclusions_removals_and_additions() -> None:
    x, b = clustered(n=500)
    q = queries(8, x.shape[1])
    r = build_retriever("exact", x, b)
    _, top = full_ranking(x, b, q, 3)
    exclude = [top[i, :2].tolist() if i % 2 else [] for i in range(len(q))]
    assert_exact(r, x, b, q, 10, drop=exclude, exclude=exclude)
    r.remove(top[:, 0].tolist())
    removed = [top[:, 0].tolist()] * len(q)
    assert_exact(r, x, b, q, 10, drop=removed)
    new = torch.randn(5, x.shape[1]) * 3
    assert r.add(new, torch.full((5,), 4.0)) == range(501, 506)
    x2, b2 = torch.cat([x, new]), torch.cat([b, torch.full((5,), 4.0)])
    assert_exact(r, x2, b2, q, 10, drop=removed)
    r.restore(top[:, 0].tolist())
    assert_exact(r, x2, b2, q, 10)


@torch.no_grad()
def test_exact_equals_a_trained_models_ranking(tiny_dataset: PreparedDataset) -> None:
    from seqrec.config import build
    from seqrec.data.batching import TrainBatches, eval_batches
    from seqrec.registry import build_model, model_config_class

    torch.manual_seed(0)
    cfg = build(model_config_class("sasrec"), {"name": "sasrec", "d": 16, "n_heads": 1}, "model")
    model = build_model(cfg, tiny_dataset.n_items, 8)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with torch.enable_grad():
        for batch in list(TrainBatches(tiny_dataset, 8, 32, seed=0))[:20]:
            opt.zero_grad()
            model.loss(batch).backward()
            opt.step()
    model.eval()
    h = torch.cat([model.encode(batch) for batch in eval_batches(tiny_dataset, "valid", 8, 64)])
    emb, bias = model.item_embeddings(), model.item_bias()
    assert bias is not None and float(bias.std()) > 0  # trained: the bias is part of the score
    assert_exact(build_retriever("exact", emb, bias), emb, bias, h, 10)


@pytest.mark.parametrize("kind", ANN_KINDS)
def test_approximate_kinds_find_most_of_the_exact_top_and_score_it_exactly(kind: str) -> None:
    x, b = clustered()
    g = torch.Generator().manual_seed(2)
    q = x[1 + torch.randint(len(x) - 1, (200,), generator=g)] + 0.3 * torch.randn(200, x.shape[1], generator=g)
    r = build_retriever(kind, x, b)
    values, ids = r.search(q, 10)
    _, truth = full_ranking(x, b, q, 10)
    assert recall(ids, truth) >= 0.9
    torch.testing.assert_close(values, (q @ x.T + b).gather(1, ids), atol=1e-5, rtol=1e-6)  # float32 rounding
    assert (values[:, :-1] >= values[:, 1:]).all()  # best first
    r2 = build_retriever(kind, x, b, ef_search=1, n_probe=1)
    assert recall(r2.search(q, 10)[1], truth) < recall(ids, truth)  # the knob matters: the test can fail


@pytest.mark.parametrize("kind", INDEX_KINDS)
def test_an_added_item_that_is_best_is_found(kind: str) -> None:
    x, b = clustered(n=1000)
    r = build_retriever(kind, x, b)
    q = queries(4, x.shape[1])
    new = r.add(q[:1] * 0.1, torch.tensor([1000.0]))  # a huge bias: first for every query
    assert list(new) == [1001] and r.n_items == 1001
    values, ids = r.search(q, 5)
    assert (ids[:, 0] == 1001).all()
    torch.testing.assert_close(values[:, 0], q @ q[0] * 0.1 + 1000.0)


@pytest.mark.parametrize("kind", INDEX_KINDS)
def test_removed_items_are_never_returned_and_can_come_back(kind: str) -> None:
    x, b = clustered(n=1000)
    r = build_retriever(kind, x, b)
    q = queries(20, x.shape[1])
    _, before = r.search(q, 10)
    gone = sorted(set(before[:, :3].flatten().tolist()))
    r.remove(gone)
    _, after = r.search(q, 10, exclude=[before[i, 3:5].tolist() for i in range(len(q))])
    assert not torch.isin(after, torch.tensor(gone)).any()
    assert not any(set(after[i].tolist()) & set(before[i, 3:5].tolist()) for i in range(len(q)))
    assert (after > 0).all()  # exclusions and tombstones do not starve k
    r.restore(gone)
    assert torch.equal(r.search(q, 10)[1], before)


@pytest.mark.parametrize("kind", INDEX_KINDS)
def test_updated_vectors_keep_their_id(kind: str) -> None:
    x, b = clustered(n=1000)
    r = build_retriever(kind, x, b)
    q = queries(3, x.shape[1])
    r.update([7], q[:1] * 0.1, torch.tensor([1000.0]))
    values, ids = r.search(q, 3)
    assert (ids[:, 0] == 7).all() and r.n_items == 1000
    torch.testing.assert_close(values[:, 0], q @ q[0] * 0.1 + 1000.0)
    r.update([7], x[7:8], b[7:8])  # back: scores are the original ones again
    values, ids = r.search(q, 10)
    assert 7 not in ids[:, 0].tolist()
    torch.testing.assert_close(values, (q @ x.T + b).gather(1, ids), atol=1e-5, rtol=1e-6)  # float32 rounding
    if kind == "exact":
        assert torch.equal(ids, full_ranking(x, b, q, 10)[1])


@pytest.mark.parametrize("kind", INDEX_KINDS)
def test_fewer_reachable_items_than_k_pad_with_minus_inf_and_zero(kind: str) -> None:
    x, b = clustered(n=20, clusters=3)
    r = build_retriever(kind, x, b)
    r.remove([1, 2, 3, 4, 5])
    values, ids = r.search(queries(2, x.shape[1]), 30, exclude=[[6], []])
    assert (ids[0, :14] > 5).all() and (ids[0, 14:] == 0).all() and torch.isneginf(values[0, 14:]).all()
    assert (ids[1, :15] > 5).all() and (ids[1, 15:] == 0).all() and torch.isneginf(values[1, 15:]).all()
    assert 6 not in ids[0].tolist() and sorted(ids[1, :15].tolist()) == list(range(6, 21))


def test_ivf_is_rebuilt_when_an_item_exceeds_the_largest_norm(caplog: pytest.LogCaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    release = hold_rebuilds(monkeypatch)
    x, b = clustered(n=1000)
    r = build_retriever("ivf", x, b, n_probe=4)
    assert isinstance(r, FaissRetriever)
    q = queries(4, x.shape[1])
    with caplog.at_level(logging.INFO, logger="seqrec.serve.faiss_index"):
        r.add(q[:1] * 0.1, torch.tensor([1.0]))  # fits: appended
        assert "rebuilding" not in caplog.text
        r.add(q[:1] * 50, torch.tensor([0.0]))  # longer than every item: the transform needs a new M
    assert "rebuilding" in caplog.text
    _, ids = r.search(q[:1], 1)  # while the rebuild waits: scored exactly beside the index
    assert ids.tolist() == [[1002]] and r.rebuilding and r.index.ntotal == 1001
    release.set()
    assert r.wait(60)
    assert r.index.ntotal == 1002 and r.search(q[:1], 1)[1].tolist() == [[1002]]


def test_searches_run_while_items_are_added() -> None:
    x, b = clustered(n=2000)
    q = queries(16, x.shape[1])
    for kind in INDEX_KINDS:
        r = build_retriever(kind, x, b)
        errors: list[BaseException] = []

        def search(r: Retriever = r, errors: list[BaseException] = errors) -> None:
            try:
                for _ in range(30):
                    values, ids = r.search(q, 5)
                    assert (ids > 0).all() and torch.isfinite(values).all()
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        readers = [threading.Thread(target=search) for _ in range(2)]
        for t in readers:
            t.start()
        for i in range(20):
            r.add(torch.randn(3, x.shape[1]) * 0.1, torch.zeros(3))
            r.remove([1 + i])
        for t in readers:
            t.join()
        assert not errors, errors
        assert r.n_items == 2060


def test_bad_arguments_are_errors() -> None:
    x, b = clustered(n=50)
    with pytest.raises(SeqrecError):
        build_retriever("annoy", x, b)
    with pytest.raises(SeqrecError):
        build_retriever("exact", torch.zeros(1, 4))
    r = build_retriever("exact", x, b)
    with pytest.raises(SeqrecError):
        r.search(torch.zeros(2, 3), 5)
    with pytest.raises(SeqrecError):
        r.remove([51])
    with pytest.raises(SeqrecError):
        r.search(torch.zeros(2, x.shape[1]), 5, exclude=[[1]])


def test_the_benchmark_runs_tiny(tmp_path: Path) -> None:
    out = tmp_path / "retrieval.json"
    run_benchmark("retrieval.py", "--tiny", "--out", str(out))
    result = json.loads(out.read_text())
    cat = result["catalogues"]["synthetic"]
    assert set(cat["kinds"]) == set(INDEX_KINDS) and {key.split()[0] for key in cat["sweep"]} == set(ANN_KINDS)
    assert {"inner product", "L2 transform"} <= set(cat["spaces"])
    for r in cat["kinds"].values():
        assert {"recall@10", "recall@100", "build_s", "index_bytes", "total_bytes", "latency_ms_p50",
                "latency_ms_p99", "qps_batch256_2threads"} <= set(r)
    assert cat["kinds"]["exact"]["recall@10"] == 1.0
    assert {"machine", "command", "faiss"} <= set(result) and out.with_suffix(".png").is_file()


def test_the_change_cost_benchmark_runs_tiny(tmp_path: Path) -> None:
    out = tmp_path / "changes.json"
    run_benchmark("catalogue_changes.py", "--tiny", "--out", str(out))
    result = json.loads(out.read_text())
    assert set(result["cells"]) == {f"2000/{kind}" for kind in INDEX_KINDS} and "against" not in result
    for cell in result["cells"].values():
        assert all(0 < cell["this"][op]["ms_p50"] <= cell["this"][op]["ms_p99"]
                   for op in ("add", "update", "remove", "restore"))


def test_ties_go_to_the_lower_id() -> None:
    x = torch.zeros(11, 2)
    x[1:, 0] = torch.tensor([1.0, 2, 2, 2, 3, 3, 0, 0, 2, 1])  # scores for q = [1, 0]
    r = build_retriever("exact", x)
    values, ids = r.search(torch.tensor([[1.0, 0.0]]), 4)
    assert ids.tolist() == [[5, 6, 2, 3]] and values.tolist() == [[3.0, 3.0, 2.0, 2.0]]
    r.remove([5])
    assert r.search(torch.tensor([[1.0, 0.0]]), 4)[1].tolist() == [[6, 2, 3, 4]]


def test_default_ivf_lists_train_on_enough_items():
    # FAISS's k-means wants about 39 training points per centroid: a small catalogue gets fewer lists
    for n in (1, 40, 500, 4385):
        lists = default_n_lists(n)
        assert lists >= 1 and (lists == 1 or n // lists >= 39), (n, lists)
    assert default_n_lists(20_000) == round(2 * 20_000 ** 0.5)  # large catalogues keep 2 sqrt(N)


def test_a_tiny_catalogue_builds_an_ivf_index_without_faiss_warnings(capfd: pytest.CaptureFixture[str]) -> None:
    """Fewer items than FAISS wants per list (one list, 31 items): no clustering warning on stderr, and the
    index still finds the exact top-k."""
    vectors = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    retriever = FaissRetriever("ivf", vectors)
    assert "WARNING" not in capfd.readouterr().err
    queries = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    _, ids = retriever.search(queries, 5)
    exact = (queries @ vectors[1:].T).topk(5).indices + 1
    assert torch.equal(torch.as_tensor(ids), exact)


def test_an_exclusion_list_with_repeats_or_removed_items_still_gets_k_items() -> None:
    """A history that repeats an item, or holds removed ones, excludes fewer live items than its length: a
    short graph search (a tiny HNSW candidate list here) must still be widened to k."""
    g = torch.Generator().manual_seed(1)
    vectors, bias = torch.randn(301, 8, generator=g), torch.randn(301, generator=g) * 0.1
    exact, hnsw = build_retriever("exact", vectors, bias), build_retriever("hnsw", vectors, bias, hnsw_m=4,
                                                                            ef_search=4)
    q = torch.randn(1, 8, generator=g)
    for k, excl in ((299, [1]), (299, [1] * 30)):
        want, got = exact.search(q, k, [excl]), hnsw.search(q, k, [excl])
        assert int((got[1] > 0).sum()) == int((want[1] > 0).sum()) == k
    gone = list(range(2, 32))
    for r in (exact, hnsw):
        r.remove(gone)
    assert isinstance(hnsw, FaissRetriever) and hnsw.wait(60)
    _, got = hnsw.search(q, 270, [gone])
    assert int((got > 0).sum()) == 270 and not set(got[0].tolist()) & set(gone)


def test_an_n_probe_set_at_run_time_outlives_a_rebuild() -> None:
    r = build_retriever("ivf", torch.randn(2001, 8, generator=torch.Generator().manual_seed(0)), n_lists=40,
                        n_probe=20)
    assert isinstance(r, FaissRetriever)
    r.n_probe = 2
    r.remove(list(range(1, 700)))  # over a quarter of the rows dead: rebuilt in the background
    assert r.wait(60) and r.n_probe == 2


def assert_rows_consistent(r: FaissRetriever) -> None:
    """The rows kept up to date change by change equal the rows recomputed from scratch: the same live
    bitmap and count, every live item's current row added for it (or the item in the overflow)."""
    ix, items = r._index, r._items
    removed = items.removed.numpy()
    fresh = ix.rows.select(removed)
    assert ix.n_live == fresh.n_live and bytes(ix.rows.live) == bytes(fresh.live)
    assert items.n_active == int((~removed).sum())
    live_ids = torch.arange(len(removed))[~items.removed].numpy()
    rows = ix.rows.id_to_row[live_ids]
    in_overflow = torch.isin(torch.from_numpy(live_ids), torch.from_numpy(ix.overflow)).numpy()
    assert ((rows >= 0) | in_overflow).all()
    assert (ix.rows.row_to_id[rows[rows >= 0]] == live_ids[rows >= 0]).all()


@pytest.mark.parametrize("kind", ANN_KINDS)
def test_rows_kept_change_by_change_equal_rows_recomputed(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adds, updates (some too long for the IVF transform), removals and restorations in a seeded random
    order, a background rebuild held while changes go on and then released: after each change the rows
    equal a recomputation, and (IVF searching every list) search equals the full ranking of the live items."""
    release = hold_rebuilds(monkeypatch)
    x, b = clustered(n=400, d=8, clusters=8)
    r = build_retriever(kind, x, b, **({"n_lists": 8, "n_probe": 8} if kind == "ivf" else {"ef_search": 512}))
    assert isinstance(r, FaissRetriever)
    g = torch.Generator().manual_seed(3)
    vectors, bias, gone = x.clone(), b.clone(), set[int]()
    q = queries(6, x.shape[1])
    for step in range(120):
        op = int(torch.randint(4, (1,), generator=g))
        pick = torch.randint(1, len(vectors), (3,), generator=g).tolist()
        if op == 0:
            v = torch.randn(2, x.shape[1], generator=g) * (8 if step % 17 == 0 else 1)  # now and then too long
            r.add(v, torch.zeros(2))
            vectors, bias = torch.cat([vectors, v]), torch.cat([bias, torch.zeros(2)])
        elif op == 1:
            v = torch.randn(1, x.shape[1], generator=g) * (8 if step % 13 == 0 else 1)
            r.update(pick[:1], v, torch.ones(1))
            vectors[pick[0]], bias[pick[0]] = v[0], 1.0
        elif op == 2:
            r.remove(pick)
            gone.update(pick)
        else:
            back = sorted(gone)[: int(torch.randint(1, 4, (1,), generator=g))]
            r.restore(back)
            gone.difference_update(back)
        if step == 60:  # over a quarter of the rows dead: a rebuild (held) for either kind
            r.remove(list(range(1, 130)))
            gone.update(range(1, 130))
        if step == 80:
            release.set()
            assert r.wait(60)
        assert_rows_consistent(r)
        if kind == "ivf" and not r.rebuilding:
            assert_exact(r, vectors, bias, q, 10, drop=[sorted(gone)] * len(q))
    assert r.wait(60)
    assert_rows_consistent(r)
