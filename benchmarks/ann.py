"""Approximate top-k (seqrec.serve.ann.IVFIndex) against exact full scoring, on trained models.

For each run: the test users' states are the queries. Reported per n_probe: recall@10 of the
index's top-10 against the exact top-10, the test Recall@10 / NDCG@10 of the index's top-10
(is the target still found?), and the median seconds per query batch (1 and 256 queries),
exact against index, one thread, on the same machine in one process.
`--grow N`: also a synthetic catalogue of N items made from the run's item vectors (each a
random real item plus Gaussian noise of a quarter of the typical coordinate size), with the
same test states as queries, to time the index where exact scoring gets expensive; on it
only recall against exact and time are meaningful.
Writes benchmarks/results/ann.json.

    python benchmarks/ann.py sasrec-amazon-sports-p5-ce-refit:amazon-sports-p5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import RESULTS, WORK, machine, prepared, write_result

from seqrec.data.batching import eval_batches
from seqrec.serve.ann import IVFIndex
from seqrec.train.checkpoint import load_checkpoint


def median_seconds(fn: Any, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def exact_top(items: torch.Tensor, bias: torch.Tensor | None, q: torch.Tensor, k: int) -> torch.Tensor:
    scores = q @ items.T
    if bias is not None:
        scores = scores + bias
    scores[:, 0] = -torch.inf
    return scores.topk(k, dim=1).indices


@torch.no_grad()
def compare(run: str, dataset: str, probes: list[int], grow: int = 0) -> dict[str, Any]:
    model, _ = load_checkpoint(WORK / "runs" / run / "checkpoint")
    model.eval()
    data = prepared(dataset)
    states, targets = [], []
    for batch in eval_batches(data, "test", 50, 1024):
        states.append(model.encode(batch))
        assert batch.target is not None
        targets.append(batch.target)
    q, target = torch.cat(states), torch.cat(targets).view(-1)
    items, bias = model.item_embeddings(), model.item_bias()
    if grow:
        g = torch.Generator().manual_seed(0)
        pick = torch.randint(1, len(items), (grow,), generator=g)
        noise = torch.randn(grow, items.shape[1], generator=g) * 0.25 * items[1:].std()
        items = torch.cat([items[:1], items[pick] + noise])
        bias = None if bias is None else torch.cat([bias[:1], bias[pick]])
        q = q[:2048]  # the exact top-10 of every query against N items is the costly part
        target = torch.full((len(q),), -1)  # no real target in a synthetic catalogue
    truth = exact_top(items, bias, q, 10)
    t0 = time.perf_counter()
    index = IVFIndex(items, bias)
    build_s = time.perf_counter() - t0
    name = dataset if not grow else f"{dataset} grown to {grow} items"
    out: dict[str, Any] = {"run": run, "dataset": name, "n_items": int(items.shape[0] - 1),
                           "n_queries": len(q), "n_lists": index.n_lists, "build_seconds": build_s,
                           "longest_list": max(index.list_sizes()), "exact": {}, "probes": []}
    hit = (truth == target[:, None])
    out["exact"] = {"recall@10": float(hit.any(1).float().mean()), "ndcg@10": ndcg(hit)}
    for size in (1, 256):
        out["exact"][f"seconds_per_batch_{size}"] = median_seconds(lambda s=size: exact_top(items, bias, q[:s], 10))
    for n_probe in probes:
        _, ids = index.search(q, 10, n_probe=n_probe)
        ann_hit = ids == target[:, None]
        row = {"n_probe": n_probe,
               "share_scored": sum(index.list_sizes()) / index.n_lists * n_probe / out["n_items"],
               "recall_vs_exact@10": float(sum(len(set(a) & set(b)) for a, b in
                                               zip(ids.tolist(), truth.tolist(), strict=True)) / truth.numel()),
               "recall@10": float(ann_hit.any(1).float().mean()), "ndcg@10": ndcg(ann_hit)}
        for size in (1, 256):
            row[f"seconds_per_batch_{size}"] = median_seconds(
                lambda s=size, p=n_probe: index.search(q[:s], 10, n_probe=p))
        out["probes"].append(row)
        print(f"{run} n_probe {n_probe:>3}: recall vs exact {row['recall_vs_exact@10']:.3f}  R@10 "
              f"{row['recall@10']:.4f} (exact {out['exact']['recall@10']:.4f})  1 query "
              f"{row['seconds_per_batch_1'] * 1e3:.2f} ms (exact {out['exact']['seconds_per_batch_1'] * 1e3:.2f} ms)",
              flush=True)
    return out


def ndcg(hit: torch.Tensor) -> float:
    """(Q, 10) bool, one target per row -> mean NDCG@10."""
    gains = hit.float() / torch.log2(torch.arange(2, hit.shape[1] + 2, dtype=torch.float32))
    return float(gains.sum(1).mean())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="+", help="RUN:DATASET (a run folder under benchmarks/work/runs)")
    p.add_argument("--probes", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--grow", type=int, default=0, help="also time a synthetic catalogue of this many items")
    p.add_argument("--out", default=str(RESULTS / "ann.json"))
    args = p.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    table = json.loads(out.read_text()) if out.exists() else {}
    for spec in args.runs:
        run, dataset = spec.split(":")
        command = " ".join(["python", "benchmarks/ann.py", *sys.argv[1:]])
        table[run] = {**compare(run, dataset, args.probes), "machine": machine(), "command": command}
        if args.grow:
            table[f"{run}+grown"] = {**compare(run, dataset, args.probes, args.grow), "machine": machine(),
                                     "command": command}
    write_result(out, table)


if __name__ == "__main__":
    main()
