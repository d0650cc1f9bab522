"""Cost of full ranking: 100,000 users against 100,000 items, D = 64, exact ranks.

Runs seqrec's ranking path (`stream_ranks`, blocked: groups of users against tiles of items,
counted in cache) on random states and item vectors, in a fresh process per repeat, and records
wall time, peak resident memory and the achieved FLOP/s as a fraction of the matmul peak measured
in the same process (a 4096 x 4096 float32 product on the same threads). A dense score matrix
would need 100k x 100k x 4 B = 40 GB; the ranking holds one tile per thread.

    python benchmarks/eval_cost.py [--users 100000 --items 100000 --repeats 3 --threads 2]
    python benchmarks/eval_cost.py --tiny      # seconds; what the test suite runs
    python benchmarks/eval_cost.py --against ../old-checkout   # also that checkout's ranking, runs alternated

With `--against`, each repeat runs the other checkout's seqrec (its folder first on PYTHONPATH) right
after this one's, so the two share the machine's state of the moment; the results hold both medians and
their ratio (a change's speed-up, measured in one run on a machine whose speed drifts from day to day).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from common import RESULTS, checkout_env, machine, matmul_gflops, median_run, write_result


def one(users: int, items: int, d: int, threads: int, peak_n: int) -> dict[str, float]:
    import torch

    import seqrec
    from seqrec.eval.metrics import metrics_from_ranks
    from seqrec.eval.ranking import RankRequest, stream_ranks, user_chunk_size

    peak = matmul_gflops(threads, peak_n)
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    item_emb = torch.randn(items + 1, d, generator=g)
    h_all = torch.randn(users, d, generator=g)
    target = torch.randint(1, items + 1, (users,), generator=g)
    chunk = user_chunk_size(items)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    reqs = (RankRequest(h_all[i : i + chunk], target[i : i + chunk]) for i in range(0, users, chunk))
    ranks = stream_ranks(reqs, item_emb)
    seconds = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    gflops = 2 * users * (items + 1) * d / seconds / 1e9
    return {"seconds": seconds, "peak_rss_mb": rss, "rss_before_mb": base, "user_chunk": chunk,
            "gflops": gflops, "matmul_peak_gflops": peak, "fraction_of_peak": gflops / peak,
            "recall@10_random": metrics_from_ranks(ranks, [10])["recall@10"],
            "seqrec": str(Path(seqrec.__file__).resolve().parent)}  # which checkout's code ranked


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--users", type=int, default=100_000)
    p.add_argument("--items", type=int, default=100_000)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tiny", action="store_true", help="2,000 x 2,000, one repeat, to a separate file")
    p.add_argument("--out", type=Path)
    p.add_argument("--against", type=Path, help="another checkout, whose ranking is run alternately as a reference")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--peak-n", type=int, default=4096, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tiny:
        args.users, args.items, args.repeats, args.peak_n = 2000, 2000, 1, 512
    if args.child:
        print(json.dumps(one(args.users, args.items, args.d, args.threads, args.peak_n)))
        return
    runs, against = [], []
    cmd = [sys.executable, __file__, "--child", "--users", str(args.users), "--items", str(args.items),
           "--d", str(args.d), "--threads", str(args.threads), "--peak-n", str(args.peak_n)]
    for _ in range(args.repeats):
        runs.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
        print(json.dumps(runs[-1]), flush=True)
        if args.against:
            theirs = args.against.resolve()
            against.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                                     env=checkout_env(theirs)).stdout))
            if not Path(against[-1]["seqrec"]).is_relative_to(theirs):  # (an installed seqrec found first)
                raise SystemExit(f"--against {args.against}: its child imported seqrec from {against[-1]['seqrec']}")
            print("against:", json.dumps(against[-1]), flush=True)
    middle = median_run({"runs": runs})
    med = {k: middle[k] for k in ("seconds", "peak_rss_mb", "rss_before_mb", "gflops", "matmul_peak_gflops",
                                  "fraction_of_peak")}
    result = {"users": args.users, "items": args.items, "d": args.d, "threads": args.threads,
              "naive_matrix_gb": args.users * (args.items + 1) * 4 / 1e9, "user_chunk": runs[0]["user_chunk"],
              "median": med, "runs": runs, "machine": machine()}
    if against:
        theirs = float(np.median([r["seconds"] for r in against]))
        result["against"] = {"checkout": str(args.against), "commit": _commit(args.against), "runs": against,
                             "median_seconds": theirs, "seconds_ratio": med["seconds"] / theirs}
    out = args.out or RESULTS / ("eval_cost_tiny.json" if args.tiny else "eval_cost.json")
    write_result(out, result)
    print(f"median {med['seconds']:.1f} s, {med['gflops']:.0f} GFLOP/s = {med['fraction_of_peak']:.2f} of the "
          f"{med['matmul_peak_gflops']:.0f} GFLOP/s matmul peak -> {out}")


def _commit(checkout: Path) -> str | None:
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False)
    return done.stdout.strip() or None


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
