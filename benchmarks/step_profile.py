"""Where a training step's time goes as the catalogue grows: SASRec as benchmarks/scale.py trains it
(d 64, 2 blocks, max_len 50, batch 256, sampled softmax with 1024 shared negatives, Adam), on the same
generated logs, timed phase by phase (forward and loss, backward, gradient clipping, optimiser step)
over a few steps after a warm-up; the median of each phase. Each size runs twice in the same process:
with dense item-table gradients and with sparse ones (`train.sparse_items`, seqrec.train.sparse).

    python benchmarks/step_profile.py [--sizes 1e6 1e7] [--steps 8] [--threads 1]

Writes results/step_profile.json.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, write_result
from scale import shape_for

from seqrec.config import resolve
from seqrec.data.batching import TrainBatches
from seqrec.data.dataset import PreparedDataset
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.data.synthetic import generated_dataset
from seqrec.registry import build_model
from seqrec.train.loop import make_optimizer
from seqrec.train.sparse import clip_grad_norm, use_sparse_rows

PHASES = ("forward", "backward", "clip", "optimizer")


def profile(data: PreparedDataset, steps: int, sparse: bool, warmup: int = 3) -> dict[str, Any]:
    cfg = resolve({"model": {"name": "sasrec", "d": 64, "n_layers": 2, "n_heads": 2, "d_ff": 256,
                             "norm_first": True, "loss": "sampled_softmax", "n_negatives": 1024},
                   "train": {"batch_size": 256, "optimizer": "adam", "sparse_items": sparse}})
    torch.manual_seed(0)
    model = build_model(cfg.model, data.n_items, 50)
    model.fit_data(data)
    if sparse:
        use_sparse_rows(model)
    opt = make_optimizer(model, cfg)
    times: list[list[float]] = []
    for i, batch in enumerate(TrainBatches(data, 50, 256, 0)):
        if i == warmup + steps:
            break
        t = [time.perf_counter()]
        loss = model.loss(batch)
        t.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t.append(time.perf_counter())
        clip_grad_norm(model.parameters(), cfg.train.clip_grad)
        t.append(time.perf_counter())
        opt.step()
        t.append(time.perf_counter())
        if i >= warmup:
            times.append([b - a for a, b in itertools.pairwise(t)])
    medians = {p: statistics.median(col) for p, col in zip(PHASES, zip(*times, strict=True), strict=True)}
    return {"steps": len(times), "median_s": medians, "step_s": sum(medians.values()),
            "item_table_mb": (data.n_items + 1) * 64 * 4 / 2**20}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS / "step_profile.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in map(int, args.sizes):
            shape = shape_for(n)
            data = prepare(generated_dataset(shape, f"generated-{n}"), PrepareOptions(), Path(tmp) / str(n))
            for sparse in (False, True):
                rows.append({"interactions": n, "items": data.n_items, "sparse_items": sparse,
                             **profile(data, args.steps, sparse)})
                print(rows[-1], flush=True)
    write_result(args.out, {"rows": rows, "threads": args.threads, "machine": machine(),
                            "command": " ".join(["python", "benchmarks/step_profile.py", *sys.argv[1:]])})
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
