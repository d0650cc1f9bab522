"""Peak memory and time of one SASRec training step with a very large catalogue, per loss.

Each loss runs in its own process (peak RSS is a per-process high-water mark):
build SASRec (d=64, 2 layers) over N items, one warm-up step (Adam allocates its
state), then one measured step on a random (B, L) batch with every position a
target. Reported: RSS before the model, after the warm-up, and the high-water
mark of the measured step, so that the part that depends on the loss is visible
next to the fixed cost of the N x D table, its gradient and Adam's two moments.
Writes benchmarks/results/loss_memory.json.

    python benchmarks/loss_memory.py --items 1000000            # sampled losses
    python benchmarks/loss_memory.py --items 1000000 --with-ce  # + chunked full softmax (slow on CPU)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import RESULTS, machine, write_result

from seqrec.config import build
from seqrec.data.batching import Batch
from seqrec.models.sasrec import SASRec, SASRecConfig
from seqrec.train.device import peak_rss_mb

CASES = {
    "sampled_softmax_uniform": {"loss": "sampled_softmax", "n_negatives": 1024},
    "sampled_softmax_pop_logq": {"loss": "sampled_softmax", "n_negatives": 1024, "negatives": "popularity",
                                 "logq": True},
    "bce_1": {"loss": "bce", "n_negatives": 1},
    "gbce_256": {"loss": "gbce", "n_negatives": 256, "gbce_t": 0.75},
    "ce_chunked": {"loss": "ce"},
}


def one(case: str, n_items: int, batch: int, length: int) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    start = peak_rss_mb()
    cfg = build(SASRecConfig, {"name": "sasrec", **CASES[case]}, "model")
    model = SASRec(cfg, n_items, length)
    # a Zipf-like popularity so the popularity sampler has something to follow
    model.objective.set_counts((1e6 / torch.arange(1, n_items + 2).float()).numpy())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    built = peak_rss_mb()
    items = torch.randint(1, n_items + 1, (batch, length + 1))
    b = Batch(items=items[:, :-1], targets=items[:, 1:])
    times = []
    for step in range(2):
        if step == 1:
            warm = peak_rss_mb()
        t0 = time.perf_counter()
        loss = model.loss(b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return {"case": case, "config": CASES[case], "n_items": n_items, "batch": batch, "max_len": length,
            "targets_per_step": batch * length, "rss_start_mb": start, "rss_after_build_mb": built,
            "rss_after_warmup_mb": warm, "peak_rss_mb": peak_rss_mb(), "step_peak_over_warmup_mb": peak_rss_mb() - warm,
            # the first step also allocates the gradient and Adam's two moments: 3 x the parameters
            "steps_peak_over_build_mb": peak_rss_mb() - built,
            "table_mb": (n_items + 1) * cfg.d * 4 / 2**20, "step_seconds": times[1], "loss": float(loss)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--items", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--max-len", type=int, default=50)
    p.add_argument("--with-ce", action="store_true", help="also the chunked full softmax (minutes on CPU)")
    p.add_argument("--one", choices=sorted(CASES), help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(RESULTS / "loss_memory.json"))
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.items, args.batch, args.max_len)))
        return
    rows = []
    for case in CASES:
        if case == "ce_chunked" and not args.with_ce:
            continue
        cmd = [sys.executable, __file__, "--one", case, "--items", str(args.items), "--batch", str(args.batch),
               "--max-len", str(args.max_len)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{case:<28} peak {r['peak_rss_mb']:8.0f} MB  over build {r['steps_peak_over_build_mb']:7.0f} MB  "
              f"step over warm-up {r['step_peak_over_warmup_mb']:7.0f} MB"
              f"  (table {r['table_mb']:.0f} MB)  {r['step_seconds']:.2f} s/step", flush=True)
    write_result(Path(args.out), {"rows": rows, "machine": machine(),
                                  "command": " ".join(["python", "benchmarks/loss_memory.py", *sys.argv[1:]])})


if __name__ == "__main__":
    main()
