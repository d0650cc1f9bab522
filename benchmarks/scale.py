"""Cost against size on generated logs (seqrec.data.synthetic): prepare, a SASRec epoch, full evaluation
and the ANN index build, at 1M, 5M and 10M interactions (users = n/10, items = n/20).

    python benchmarks/scale.py [--sizes 1e6 5e6 1e7] [--tiny]

    prepare      `seqrec data prepare` on the log written as Parquet, in its own process: wall time and
                 that process's peak RSS (goal at 10M: < 60 s, < 8 GB)
    epoch        SASRec (d 64, 2 blocks, max_len 50, sampled softmax with 1024 shared negatives: the loss
                 for catalogues this size) on 2 threads: targets/s over the first `--steps` batches, and
                 the epoch time that rate gives for every training target (extrapolated: marked so)
    evaluation   exact full ranking of `--eval-users` sampled validation users against every item
                 (random model vectors; the cost does not depend on the weights), extrapolated to all users
    index        FAISS IVF build over the item vectors (the service's default ANN index)

Each stage runs in a process of its own, whose peak RSS is recorded (the prepared dataset it loads and the
libraries included).

Writes results/scale.json and results/scale.png (time and memory against size). `--tiny` runs the
same code at 20k interactions, for the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, machine, write_result

from seqrec.config import resolve
from seqrec.data.dataset import PreparedDataset
from seqrec.data.synthetic import LogShape, generate_log
from seqrec.eval.ranking import rank_targets
from seqrec.serve.ann import build_retriever
from seqrec.train.device import peak_rss_mb
from seqrec.train.loop import setup
from seqrec.train.sparse import clip_grad_norm

PREPARE = """
import json, sys, time
from pathlib import Path
from seqrec.data.catalog import load_format
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.train.device import peak_rss_mb
t0 = time.perf_counter()
raw = load_format("parquet", Path(sys.argv[1]), user_col="user", item_col="item", time_col="timestamp")
t1 = time.perf_counter()
prepare(raw, PrepareOptions(), Path(sys.argv[2]))
t2 = time.perf_counter()
print(json.dumps({"read_s": t1 - t0, "prepare_s": t2 - t1, "total_s": t2 - t0,
                  "peak_rss_mb": peak_rss_mb()}))
"""


def shape_for(n: int) -> LogShape:
    return LogShape(n_interactions=n, n_users=max(10, n // 10), n_items=max(100, n // 20), seed=0)


def measure_prepare(log_path: Path, out: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", PREPARE, str(log_path), str(out)], capture_output=True, text=True,
                          check=True, cwd=ROOT, env={**os.environ, "POLARS_MAX_THREADS": "2"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_epoch(data: PreparedDataset, steps: int) -> dict[str, Any]:
    """`seqrec train`'s own set-up (its `auto` decisions: sparse item-table gradients from 100k items with
    a sampled loss) and training step, timed over the first `steps` batches."""
    cfg = resolve({"model": {"name": "sasrec", "d": 64, "n_layers": 2, "n_heads": 2, "d_ff": 256,
                             "norm_first": True, "loss": "sampled_softmax", "n_negatives": 1024},
                   "train": {"batch_size": 256, "optimizer": "adam", "progress": False}})
    device = torch.device("cpu")
    model, opt, batches, step = setup(cfg, data, device)
    model.train()
    seen, t0, n = 0, time.perf_counter(), 0
    for batch in batches:
        seen += int((batch.targets != 0).sum()) if batch.targets is not None else 0
        loss = step(batch.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.train.clip_grad > 0:
            clip_grad_norm(model.parameters(), cfg.train.clip_grad)
        opt.step()
        n += 1
        if n >= steps:
            break
    seconds = time.perf_counter() - t0
    rate = seen / seconds
    return {"steps": n, "targets": seen, "targets_per_s": rate, "epoch_targets": batches.n_targets,
            "epoch_s": batches.n_targets / rate, "extrapolated": n < len(batches),
            "sparse_items": cfg.train.sparse_items}


def measure_eval(data: PreparedDataset, users: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(data.n_items + 1, 64, generator=gen)
    valid_users, pos = data.eval_positions("valid")
    pick = np.random.default_rng(0).choice(len(valid_users), size=min(users, len(valid_users)), replace=False)
    target = torch.from_numpy(data.items[data.offsets[valid_users[pick]] + pos[pick]].astype(np.int64))
    h = torch.randn(len(pick), 64, generator=gen)
    t0 = time.perf_counter()
    rank_targets(h, target, W, threads=2)
    seconds = time.perf_counter() - t0
    return {"users": len(pick), "seconds": seconds, "all_users": len(valid_users),
            "all_users_s": seconds * len(valid_users) / len(pick), "extrapolated": len(pick) < len(valid_users),
            "gflop_per_s": 2 * 64 * len(pick) * data.n_items / seconds / 1e9}


def measure_index(data: PreparedDataset) -> dict[str, Any]:
    vectors = torch.randn(data.n_items + 1, 64, generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    build_retriever("ivf", vectors, torch.zeros(data.n_items + 1), threads=2)
    return {"kind": "ivf", "items": data.n_items, "build_s": time.perf_counter() - t0}


STAGES = ("epoch", "evaluation", "index")


def measure_stage(stage: str, data_path: Path, steps: int, eval_users: int) -> dict[str, Any]:
    """One stage in its own process (this script with --stage): its row and that process's peak RSS, the
    prepared dataset it loads and the libraries included."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", stage, "--data", str(data_path),
           "--steps", str(steps), "--eval-users", str(eval_users)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_stage(stage: str, data_path: Path, steps: int, eval_users: int) -> None:
    data = PreparedDataset.load(data_path)
    torch.set_num_threads(2)
    measure = {"epoch": lambda: measure_epoch(data, steps), "evaluation": lambda: measure_eval(data, eval_users),
               "index": lambda: measure_index(data)}[stage]
    row = measure()
    print(json.dumps({**row, "peak_rss_mb": peak_rss_mb()}))


def run_size(n: int, work: Path, steps: int, eval_users: int) -> dict[str, Any]:
    shape = shape_for(n)
    t0 = time.perf_counter()
    log = generate_log(shape)
    generate_s = time.perf_counter() - t0
    log_path = work / f"log-{n}.parquet"
    log.write_parquet(log_path)
    del log
    row: dict[str, Any] = {"interactions": n, "users": shape.n_users, "items": shape.n_items,
                           "generate_s": generate_s, "prepare": measure_prepare(log_path, work / f"prepared-{n}")}
    for stage in STAGES:
        row[stage] = measure_stage(stage, work / f"prepared-{n}", steps, eval_users)
    print(json.dumps(row), flush=True)
    return row


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["interactions"] / 1e6 for r in rows]
    fig, (ax, mem) = plt.subplots(1, 2, figsize=(10, 4))
    for label, values in (("prepare", [r["prepare"]["total_s"] for r in rows]),
                          ("SASRec epoch (est.)", [r["epoch"]["epoch_s"] for r in rows]),
                          ("full evaluation (est.)", [r["evaluation"]["all_users_s"] for r in rows]),
                          ("IVF build", [r["index"]["build_s"] for r in rows])):
        ax.plot(n, values, marker="o", label=label)
    ax.set_xlabel("interactions (millions)")
    ax.set_ylabel("seconds")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    for label, key in (("prepare", "prepare"), ("SASRec epoch", "epoch"),
                       ("full evaluation", "evaluation"), ("IVF build", "index")):
        values = [r[key].get("peak_rss_mb") for r in rows]
        if all(v is not None for v in values):
            mem.plot(n, [v / 1024 for v in values], marker="o", label=label)
    mem.set_xlabel("interactions (millions)")
    mem.set_ylabel("peak RSS (GB)")
    mem.legend(fontsize=8)
    mem.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=float, nargs="+", default=[1e6, 5e6, 1e7])
    p.add_argument("--steps", type=int, default=50, help="training batches timed per size")
    p.add_argument("--eval-users", type=int, default=20_000)
    p.add_argument("--tiny", action="store_true", help="20k interactions, into a temporary folder, no results file")
    p.add_argument("--out", type=Path, default=RESULTS / "scale.json")
    p.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)  # one stage of one size, in its own process
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.stage:
        run_stage(args.stage, args.data, args.steps, args.eval_users)
        return
    sizes = [20_000] if args.tiny else [int(s) for s in args.sizes]
    with tempfile.TemporaryDirectory(prefix="seqrec-scale-") as tmp:
        rows = [run_size(n, Path(tmp), 3 if args.tiny else args.steps, 500 if args.tiny else args.eval_users)
                for n in sizes]
    if args.tiny:
        return
    write_result(args.out, {"machine": machine(), "command": "python benchmarks/scale.py " + " ".join(sys.argv[1:]),
                            "peak_rss_note": "of each stage's own process (the prepared dataset it loads, "
                                             "torch and the other libraries included)",
                            "rows": rows,
                            "this_process_peak_rss_mb": peak_rss_mb()})
    plot(rows, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
