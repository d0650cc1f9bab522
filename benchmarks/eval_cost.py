"""Cost of streaming full ranking: 100,000 users against 100,000 items.

Runs seqrec's ranking path (`stream_ranks`) on random states and item vectors
(D = 64) for several score budgets, in a fresh process each, and records wall
time and peak resident memory. A naive users x items score matrix would need
100k x 100k x 4 B = 40 GB; the streamed one holds `budget` scores at once.

    python benchmarks/eval_cost.py [--users 100000 --items 100000 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, machine, write_result


def one(users: int, items: int, d: int, budget: int, threads: int) -> dict[str, float]:
    import torch

    from seqrec.eval.metrics import metrics_from_ranks
    from seqrec.eval.ranking import RankRequest, stream_ranks, user_chunk_size

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    item_emb = torch.randn(items + 1, d, generator=g)
    h_all = torch.randn(users, d, generator=g)
    target = torch.randint(1, items + 1, (users,), generator=g)
    chunk = user_chunk_size(items, budget)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    reqs = (RankRequest(h_all[i : i + chunk], target[i : i + chunk]) for i in range(0, users, chunk))
    ranks = stream_ranks(reqs, item_emb)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    m = metrics_from_ranks(ranks, [10])
    return {"seconds": seconds, "peak_rss_mb": peak, "rss_before_mb": base, "user_chunk": chunk,
            "recall@10_random": m["recall@10"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--users", type=int, default=100_000)
    p.add_argument("--items", type=int, default=100_000)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--budgets", default=str(1 << 23) + "," + str(1 << 25))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--budget", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(one(args.users, args.items, args.d, args.budget, args.threads)))
        return
    rows = []
    for budget in (int(b) for b in args.budgets.split(",")):
        runs = []
        for _ in range(args.repeats):
            cmd = [sys.executable, __file__, "--child", "--budget", str(budget), "--users", str(args.users),
                   "--items", str(args.items), "--d", str(args.d), "--threads", str(args.threads)]
            runs.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
        rows.append({
            "budget_scores": budget, "budget_mb": budget * 4 / 2**20, "user_chunk": runs[0]["user_chunk"],
            "median_seconds": statistics.median(r["seconds"] for r in runs),
            "seconds": [r["seconds"] for r in runs],
            "median_peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
            "rss_before_ranking_mb": statistics.median(r["rss_before_mb"] for r in runs),
            "users_per_second": args.users / statistics.median(r["seconds"] for r in runs),
        })
        print(json.dumps(rows[-1]))
    result = {"users": args.users, "items": args.items, "d": args.d, "threads": args.threads,
              "naive_matrix_gb": args.users * (args.items + 1) * 4 / 1e9, "runs": rows, "machine": machine()}
    write_result(RESULTS / "eval_cost.json", result)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
