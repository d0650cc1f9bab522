"""Top-k for every user at once (`seqrec recommend --users all --out FILE`) against one request at a time.

For each (model, dataset): a run is trained once into benchmarks/work/runs/batch (a time budget; the model's
quality is not what is measured here), then
- the batch job, `seqrec.serve.batch`: every user's whole history, top-10, in batches of 1,024 encoded
  shortest first; median wall time of `--repeats` (the histories read from the prepared data included);
- one request at a time: `Recommender.recommend` on a seeded sample of users' histories, the same top-10;
  its per-user time times the number of users is what a loop over the users would take;
- the two lists compared on the sample (items equal, scores within 1e-4);
- the CLI end to end once (model load, histories, top-k, Parquet written).
Both on the same threads in one run, so their ratio is the result; absolute times here are noisy.

    python benchmarks/batch_recommend.py [--sample 300] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, WORK, machine, prepared, seqrec_cmd, train_run, write_result

from seqrec.serve import Recommender, batch

RUNS = {  # name -> (dataset, config or None for the model's defaults, model, text encoding needed)
    "sasrec-amazon-beauty-p5": ("amazon-beauty-p5", None, "sasrec", False),
    "unisrec-amazon-scientific-unisrec": ("amazon-scientific-unisrec", "configs/unisrec.toml", None, True),
}
OUT = RESULTS / "batch_recommend.json"


def ensure_run(name: str, budget: int) -> tuple[Path, dict[str, Any] | None]:
    dataset, config, model, text = RUNS[name]
    out = WORK / "runs" / "batch"
    if (out / name / "checkpoint" / "model.json").is_file():
        return out / name, None
    prepared(dataset)
    if text:
        subprocess.run(seqrec_cmd("text", "encode", dataset), check=True, cwd=ROOT)
    trained = train_run(out, name, dataset, config, [f"train.time_budget_s={budget}"], model=model)
    if "error" in trained:
        raise SystemExit(f"training {name} failed: {trained['error']}")
    return out / name, {k: trained[k] for k in ("command", "train_seconds", "epochs_run", "test")}


def measure(name: str, run: Path, args: argparse.Namespace) -> dict[str, Any]:
    rec = Recommender.from_run(run)
    data = prepared(RUNS[name][0])
    times, frame = [], None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        hist = batch.from_dataset(rec, data)
        frame = batch.recommend_histories(rec, hist, k=args.k)
        times.append(time.perf_counter() - t0)
    assert frame is not None
    users = len(hist.users)
    rng = np.random.default_rng(0)
    sample = sorted(rng.choice(users, size=min(args.sample, users), replace=False).tolist())
    raw = data.item_table.sort("idx")["item"].to_list()
    histories = [[raw[i - 1] for i in data.items[data.offsets[u]: data.offsets[u + 1]]] for u in sample]
    rec.recommend(histories[0], args.k)  # warm-up
    one: list[float] = []
    mismatched = 0
    for u, history in zip(sample, histories, strict=True):
        t0 = time.perf_counter()
        want = rec.recommend(history, args.k)
        one.append(time.perf_counter() - t0)
        got = frame.filter(frame["user"] == hist.users[u])
        if got["item"].to_list() != [r.item for r in want] or not np.allclose(
                got["score"].to_numpy(), [r.score for r in want], atol=1e-4):
            mismatched += 1
    out_file = WORK / "batch" / f"{name}.parquet"
    t0 = time.perf_counter()
    subprocess.run(seqrec_cmd("recommend", str(run), "--users", "all", "--out", str(out_file), "-k", str(args.k)),
                   check=True, cwd=ROOT, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    cli_s = time.perf_counter() - t0
    lengths = np.diff(data.offsets)
    batch_s = statistics.median(times)
    loop_s = statistics.mean(one) * users
    return {"dataset": RUNS[name][0], "model": rec.model.name, "users": users, "items": rec.n_items,
            "d": int(rec.catalogue.vectors.shape[1]), "k": args.k, "history_median": float(np.median(lengths)),
            "history_max": int(lengths.max()), "max_len": rec.max_len,
            "history_bias": getattr(rec.model, "history", None) is not None,
            "batch_s": batch_s, "batch_s_all": times, "users_per_s": users / batch_s,
            "one_at_a_time_ms_median": 1e3 * statistics.median(one),
            "one_at_a_time_ms_mean": 1e3 * statistics.mean(one),
            "one_at_a_time_all_users_s": loop_s, "speed_up": loop_s / batch_s, "sample": len(sample),
            "sample_mismatched": mismatched, "cli_s": cli_s, "rows": frame.height}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--sample", type=int, default=300, help="users recommended one at a time")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", type=int, default=300, help="training time budget (s) of a run not yet trained")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {}
    for name in args.runs:
        run, trained = ensure_run(name, args.budget)
        results[name] = {**measure(name, run, args), "run": str(run.relative_to(ROOT)), "trained": trained}
        r = results[name]
        print(f"{name}: {r['users']:,} users in {r['batch_s']:.2f} s ({r['users_per_s']:,.0f} users/s); one at a "
              f"time {r['one_at_a_time_ms_median']:.2f} ms median -> {r['speed_up']:.1f}x; "
              f"{r['sample_mismatched']} of {r['sample']} differ; CLI {r['cli_s']:.1f} s", flush=True)
    write_result(OUT, {"runs": results, "threads": args.threads, "machine": machine(), "note": args.note,
                       "command": "python benchmarks/batch_recommend.py " + shlex.join(sys.argv[1:])})


if __name__ == "__main__":
    main()
