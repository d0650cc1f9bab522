"""Top-k retrieval, exact against FAISS HNSW and IVF (seqrec.serve.ann), on a real and a 1M-item catalogue.

Catalogues
  yelp-p5    20,033 Yelp businesses: item vectors and bias of a SASRec run trained on them (the command
             below); queries: the model's states for validation histories (model.encode).
  synthetic  N items (1,000,000) of width 64: 1,000 Gaussian clusters, norms scaled by a log-normal
             factor, a Gaussian bias; queries drawn around the same cluster centres.

Per index kind, at build_retriever's defaults: recall@10 and @100 of the returned ids against the
exact top-k; build seconds (2 threads); bytes (the FAISS index as faiss.serialize_index writes it;
every kind also keeps the float32 vectors and bias, for exact scores); one query at a time, p50 and
p99 latency (1 thread); batches of 256, queries per second (2 threads). Medians over repeats. A sweep
of ef_search (HNSW) and n_probe (IVF) gives recall@10 against p50 latency (results/retrieval.png), and
two threads of single queries measure the FAISS readers' lock (shared) against an exclusive one.
The machine may be shared: the load average before and after is recorded.

    seqrec train --dataset benchmarks/work/prepared/yelp-p5 --model sasrec --set train.time_budget_s=900 \\
        --set train.batch_size=256 --set train.lr=0.002 --set data.max_len=50 \\
        --set 'train.optimizer="adam"' --set train.ema=0 --set train.refit=false \\
        --out benchmarks/work/runs/sasrec-yelp-p5-retrieval-900
    python benchmarks/retrieval.py            # -> results/retrieval.json, results/retrieval.png
    python benchmarks/retrieval.py --tiny --out /tmp/retrieval.json   # seconds: a small synthetic catalogue
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import RESULTS, WORK, machine, prepared, write_result

from seqrec.serve.ann import (
    INDEX_KINDS,
    FaissRetriever,
    Retriever,
    build_retriever,
    default_n_lists,
    faiss,
    item_rows,
    query_rows,
)

log = logging.getLogger("retrieval")
HNSW_SWEEP = [20, 32, 64, 128, 256, 512]  # k = 10: the candidate list is at least 2k = 20 long
IVF_SWEEP = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def set_threads(n: int) -> None:
    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)


def synthetic(n: int, d: int, n_queries: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N+1, D) vectors (row 0 padding), (N+1,) bias, (Q, D) queries: clustered, unequal norms."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(min(1000, max(1, n // 20)), d, generator=g)

    def around(m: int) -> torch.Tensor:
        return centres[torch.randint(len(centres), (m,), generator=g)] + 0.5 * torch.randn(m, d, generator=g)

    items = around(n) * torch.exp(0.3 * torch.randn(n, 1, generator=g))  # popular items: longer vectors
    bias = torch.cat([torch.zeros(1), 2.0 * torch.randn(n, generator=g)])
    return torch.cat([torch.zeros(1, d), items]), bias, around(n_queries)


@torch.no_grad()
def real(run: Path, dataset: str, n_queries: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A trained run's item vectors, bias and the states of its first n_queries validation users."""
    from seqrec.data.batching import eval_batches
    from seqrec.train.checkpoint import load_checkpoint

    model, meta = load_checkpoint(run / "checkpoint")
    states = []
    for batch in eval_batches(prepared(dataset), "valid", int(meta["max_len"]), 1024):
        states.append(model.encode(batch))
        if sum(len(s) for s in states) >= n_queries:
            break
    bias = model.item_bias()
    vectors = model.item_embeddings().detach()
    return vectors, torch.zeros(len(vectors)) if bias is None else bias.detach(), torch.cat(states)[:n_queries]


def recall(ids: torch.Tensor, truth: torch.Tensor) -> float:
    """Share of the exact top-k (Q, k) found among the returned ids (Q, k)."""
    hits = sum(int((a.unsqueeze(2) == b.unsqueeze(1)).any(2).sum())
               for a, b in zip(ids.split(512), truth.split(512), strict=True))
    return hits / truth.numel()


def latency_ms(r: Retriever, q: torch.Tensor, repeats: int) -> tuple[float, float]:
    """Median over repeats of the p50 and p99 of one-query searches (k = 10), in ms; 1 thread."""
    set_threads(1)
    r.search(q[:1], 10)
    p50, p99 = [], []
    for _ in range(repeats):
        times = []
        for i in range(len(q)):
            t0 = time.perf_counter()
            r.search(q[i : i + 1], 10)
            times.append(time.perf_counter() - t0)
        p50.append(float(np.percentile(times, 50)) * 1e3)
        p99.append(float(np.percentile(times, 99)) * 1e3)
    return statistics.median(p50), statistics.median(p99)


def throughput(r: Retriever, q: torch.Tensor, repeats: int, batch: int = 256) -> float:
    """Median over repeats of queries per second, batches of `batch` (k = 10), 2 threads."""
    set_threads(2)
    r.search(q[:batch], 10)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for lo in range(0, len(q), batch):
            r.search(q[lo : lo + batch], 10)
        rates.append(len(q) / (time.perf_counter() - t0))
    return statistics.median(rates)


def measure(kind: str, vectors: torch.Tensor, bias: torch.Tensor, q: torch.Tensor, truth: torch.Tensor,
            args: argparse.Namespace) -> tuple[Retriever, dict[str, Any]]:
    set_threads(2)
    t0 = time.perf_counter()
    r = build_retriever(kind, vectors, bias)
    build_s = time.perf_counter() - t0
    _, ids = r.search(q, 100)
    table_bytes = vectors.numel() * 4 + bias.numel() * 4
    index_bytes = int(faiss.serialize_index(r.index).nbytes) if isinstance(r, FaissRetriever) else 0
    p50, p99 = latency_ms(r, q[: args.latency_queries if kind != "exact" else args.exact_latency_queries],
                          args.repeats)
    out = {"build_s": build_s, "recall@10": recall(ids[:, :10], truth[:, :10]), "recall@100": recall(ids, truth),
           "index_bytes": index_bytes, "total_bytes": index_bytes + table_bytes, "latency_ms_p50": p50,
           "latency_ms_p99": p99, **params(r),
           "qps_batch256_2threads": throughput(r, q[: args.throughput_queries // (5 if kind == "exact" else 1)],
                                               args.repeats)}
    log.info("%s: %s", kind, {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()})
    return r, out


def params(r: Retriever) -> dict[str, Any]:
    if not isinstance(r, FaissRetriever):
        return {}
    if r.kind == "hnsw":
        return {"hnsw_m": r.hnsw_m, "ef_construction": r.ef_construction, "ef_search": r.ef_search}
    return {"n_lists": r.n_lists, "n_probe": r.n_probe}


def sweep(r: FaissRetriever, q: torch.Tensor, truth: torch.Tensor, args: argparse.Namespace) -> list[dict[str, Any]]:
    """recall@10 and @100 (batched searches for k = 10 and k = 100, 2 threads) and single-query p50
    (k = 10, 1 thread) per ef_search / n_probe."""
    attr, values = ("ef_search", HNSW_SWEEP) if r.kind == "hnsw" else ("n_probe", IVF_SWEEP)
    default, rows = getattr(r, attr), []
    for v in values:
        if r.kind == "ivf" and v > r.n_lists:
            break
        setattr(r, attr, v)
        set_threads(2)
        _, ids = r.search(q[: args.sweep_queries], 10)
        _, ids100 = r.search(q[: args.sweep_queries], 100)
        p50, _ = latency_ms(r, q[: args.latency_queries // 2], 1)
        rows.append({attr: v, "recall@10": recall(ids, truth[: args.sweep_queries, :10]),
                     "recall@100": recall(ids100, truth[: args.sweep_queries]), "latency_ms_p50": p50})
        log.info("%s %s=%d: recall@10 %.4f, @100 %.4f, p50 %.3f ms", r.kind, attr, v, rows[-1]["recall@10"],
                 rows[-1]["recall@100"], p50)
    setattr(r, attr, default)
    return rows


class _Exclusive:
    """A lock with _RWLock's interface where readers exclude each other too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._lock:
            yield

    write = read


def _hammer(r: FaissRetriever, q: torch.Tensor, seconds: float) -> float:
    """Queries per second of single-query searches from 2 threads."""
    counts = [0, 0]
    stop = time.perf_counter() + seconds

    def work(t: int) -> None:
        i = t
        while time.perf_counter() < stop:
            r.search(q[i % len(q) : i % len(q) + 1], 10)
            counts[t] += 1
            i += 2

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def concurrent_qps(r: FaissRetriever, q: torch.Tensor, seconds: float) -> dict[str, float]:
    """Single-query searches from 2 threads (FAISS 1 thread each): shared readers' lock vs exclusive."""
    set_threads(1)
    shared = _hammer(r, q, seconds)
    rw_lock = r._lock
    r._lock = _Exclusive()  # type: ignore[assignment]
    try:
        exclusive = _hammer(r, q, seconds)
    finally:
        r._lock = rw_lock
    return {"shared": shared, "exclusive": exclusive}


def catalogue(name: str, vectors: torch.Tensor, bias: torch.Tensor, q: torch.Tensor,
              args: argparse.Namespace) -> dict[str, Any]:
    log.info("%s: %d items of width %d, %d queries", name, len(vectors) - 1, vectors.shape[1], len(q))
    set_threads(2)
    t0 = time.perf_counter()
    _, truth = build_retriever("exact", vectors, bias).search(q, 100)
    out: dict[str, Any] = {"n_items": len(vectors) - 1, "dim": int(vectors.shape[1]), "n_queries": len(q),
                           "truth_s": time.perf_counter() - t0, "kinds": {}, "sweep": {}}
    for kind in INDEX_KINDS:
        r, out["kinds"][kind] = measure(kind, vectors, bias, q, truth, args)
        if isinstance(r, FaissRetriever):
            out["sweep"][kind if kind == "hnsw" else f"ivf n_lists={r.n_lists}"] = sweep(r, q, truth, args)
            if kind == "hnsw":
                out["concurrent_qps_2threads"] = concurrent_qps(r, q, args.concurrency_s)
        del r
    for mult in args.ivf_mults:  # other list counts, for the choice of the default
        set_threads(2)
        t0 = time.perf_counter()
        r = build_retriever("ivf", vectors, bias, n_lists=round(mult * math.sqrt(len(vectors) - 1)))
        assert isinstance(r, FaissRetriever)
        out.setdefault("ivf_build_s", {})[f"n_lists={r.n_lists}"] = time.perf_counter() - t0
        out["sweep"][f"ivf n_lists={r.n_lists}"] = sweep(r, q, truth, args)
        del r
    out["spaces"] = spaces(vectors, bias, q, args.spaces_items)
    return out


def spaces(vectors: torch.Tensor, bias: torch.Tensor, q: torch.Tensor, n: int) -> dict[str, Any]:
    """recall@10 of plain FAISS HNSW and IVF built on the inner product of [v, b] and on the L2
    transform (seqrec.serve.ann's docstring), on the first n items: the choice of space per kind."""
    n = min(n, len(vectors) - 1)
    vectors, bias = vectors[: n + 1], bias[: n + 1]
    set_threads(2)
    _, truth = build_retriever("exact", vectors, bias).search(q, 10)
    vb = torch.cat([vectors, bias.unsqueeze(1)], dim=1)[1:]
    max_norm = float(vb.double().norm(dim=1).max())
    n_lists = default_n_lists(n)
    out: dict[str, Any] = {"n_items": n, "n_lists": n_lists}
    for space, x, y, metric, flat in (
            ("inner product", item_rows("hnsw", vectors[1:], bias[1:], max_norm), query_rows("hnsw", q.numpy()),
             faiss.METRIC_INNER_PRODUCT, faiss.IndexFlatIP),
            ("L2 transform", item_rows("ivf", vectors[1:], bias[1:], max_norm), query_rows("ivf", q.numpy()),
             faiss.METRIC_L2, faiss.IndexFlatL2)):
        hnsw = faiss.IndexHNSWFlat(x.shape[1], 32, metric)
        hnsw.hnsw.efConstruction = 100
        hnsw.add(x)
        ivf = faiss.IndexIVFFlat(flat(x.shape[1]), x.shape[1], n_lists, metric)
        ivf.train(x)
        ivf.add(x)
        rows = {}
        for ef in (16, 64, 128):
            hnsw.hnsw.efSearch = ef
            rows[f"hnsw ef_search={ef}"] = recall(torch.from_numpy(hnsw.search(y, 10)[1] + 1), truth)
        for probe in (1, 4, 16):
            ivf.nprobe = probe
            rows[f"ivf n_probe={probe}"] = recall(torch.from_numpy(ivf.search(y, 10)[1] + 1), truth)
        out[space] = rows
        log.info("space %s: %s", space, {k: round(v, 4) for k, v in rows.items()})
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = result["catalogues"]
    fig, axes = plt.subplots(1, len(cats), figsize=(6 * len(cats), 4.5), squeeze=False)
    for ax, (name, c) in zip(axes[0], cats.items(), strict=True):
        for kind, rows in c["sweep"].items():
            attr = "ef_search" if "ef_search" in rows[0] else "n_probe"
            ax.plot([r["latency_ms_p50"] for r in rows], [r["recall@10"] for r in rows], "o-", label=f"{kind} ({attr})")
            for r in rows:
                ax.annotate(str(r[attr]), (r["latency_ms_p50"], r["recall@10"]), fontsize=7)
        ax.axvline(c["kinds"]["exact"]["latency_ms_p50"], color="grey", ls="--", label="exact")
        ax.set(xscale="log", xlabel="p50 latency per query, ms (1 thread)", ylabel="recall@10 vs exact",
               title=f"{name}: {c['n_items']:,} items, d={c['dim']}")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(result: dict[str, Any]) -> str:
    lines = ["| catalogue | kind | params | recall@10 | recall@100 | build s | MB (index + vectors) | "
             "p50 ms | p99 ms | q/s (256, 2 thr) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in result["catalogues"].items():
        for kind, r in c["kinds"].items():
            p = ", ".join(f"{k}={v}" for k, v in params_of(r).items()) or "–"
            mb = r["index_bytes"] / 2**20, (r["total_bytes"] - r["index_bytes"]) / 2**20
            lines.append(f"| {name} ({c['n_items']:,}) | {kind} | {p} | {r['recall@10']:.4f} | {r['recall@100']:.4f} | "
                         f"{r['build_s']:.1f} | {mb[0]:.1f} + {mb[1]:.1f} | {r['latency_ms_p50']:.3f} | "
                         f"{r['latency_ms_p99']:.3f} | {r['qps_batch256_2threads']:,.0f} |")
    return "\n".join(lines)


def params_of(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r[k] for k in ("hnsw_m", "ef_construction", "ef_search", "n_lists", "n_probe") if k in r}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="a 2,000-item synthetic catalogue only (seconds)")
    p.add_argument("--run", default=str(WORK / "runs" / "sasrec-yelp-p5-retrieval-900"), help="the trained run")
    p.add_argument("--dataset", default="yelp-p5")
    p.add_argument("--real-queries", type=int, default=5000)
    p.add_argument("--n-synthetic", type=int, default=1_000_000)
    p.add_argument("--synthetic-queries", type=int, default=10_000)
    p.add_argument("--ivf-mults", type=float, nargs="*", default=[4.0],
                   help="also sweep IVF with round(m sqrt(N)) lists, for each m")
    p.add_argument("--spaces-items", type=int, default=100_000,
                   help="items of each catalogue for the inner-product vs L2-transform comparison")
    p.add_argument("--out", default=str(RESULTS / "retrieval.json"))
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    small = {"latency_queries": 50, "exact_latency_queries": 20, "throughput_queries": 256, "sweep_queries": 100,
             "repeats": 1, "concurrency_s": 0.2}
    full = {"latency_queries": 1000, "exact_latency_queries": 200, "throughput_queries": 2560, "sweep_queries": 2000,
            "repeats": 3, "concurrency_s": 5.0}
    for k, v in (small if args.tiny else full).items():
        setattr(args, k, v)
    load_before = os.getloadavg()
    result: dict[str, Any] = {"catalogues": {}}
    if args.tiny:
        args.ivf_mults, args.spaces_items = [4.0], 1000
        result["catalogues"]["synthetic"] = catalogue("synthetic", *synthetic(2000, 16, 200), args)
    else:
        vectors, bias, q = real(Path(args.run), args.dataset, args.real_queries)
        run = json.loads((Path(args.run) / "results.json").read_text())
        result["catalogues"][args.dataset] = {"run": args.run, "run_valid": run["valid"], "run_test": run["test"],
                                              **catalogue(args.dataset, vectors, bias, q, args)}
        result["catalogues"]["synthetic"] = catalogue(
            "synthetic", *synthetic(args.n_synthetic, 64, args.synthetic_queries), args)
    result.update(machine=machine(), load_avg_before=load_before, load_avg_after=os.getloadavg(),
                  command=" ".join(["python", "benchmarks/retrieval.py", *sys.argv[1:]]), faiss=faiss.__version__)
    out = Path(args.out)
    write_result(out, result)
    plot(result, out.with_suffix(".png"))
    print(table(result))


if __name__ == "__main__":
    main()
