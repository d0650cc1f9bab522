"""Data-parallel scaling on this machine: the ml-100k SASRec recipe in one process against two
processes under torchrun (gloo, one thread each), a fixed number of epochs, side by side.

    one process, 1 thread      the baseline a core's worth of work per step
    one process, 2 threads     what the second core buys through torch's intra-op threads
    torchrun, 2 processes      what it buys through data parallelism (each process every 2nd batch)

Reported: median training seconds per epoch, the speed-up over the 1-thread baseline, and the
test metrics of the validation-picked epoch (the same epochs for every row, no early stop).
On a GPU machine `benchmarks/cuda_check.py` runs the same recipe under torchrun with NCCL.

    python benchmarks/ddp_scaling.py [--epochs 20]   # -> benchmarks/results/ddp_scaling.json
    python benchmarks/ddp_scaling.py --tiny          # 2 epochs, to a separate file
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from common import RESULTS, WORK, machine, train_run, write_result

CONFIG = "configs/ml-100k-sasrec.toml"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--dataset", default="ml-100k")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    epochs = 2 if args.tiny else args.epochs
    fixed = ["train.device=cpu", f"train.epochs={epochs}", f"train.patience={epochs}", "train.time_budget_s=0",
             "train.progress=false"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    runs = WORK / "runs" / ("ddp-scaling-tiny" if args.tiny else "ddp-scaling")
    rows: dict[str, Any] = {
        "1 process, 1 thread": train_run(runs, "p1-t1", args.dataset, CONFIG, [*fixed, "train.threads=1"]),
        "1 process, 2 threads": train_run(runs, "p1-t2", args.dataset, CONFIG, [*fixed, "train.threads=2"]),
        "torchrun 2 processes, 1 thread each": train_run(runs, "p2-t1", args.dataset, CONFIG,
                                                        [*fixed, "train.threads=1"], torchrun),
    }
    base = rows["1 process, 1 thread"].get("median_epoch_s")
    for name, r in rows.items():
        if "error" in r:
            raise SystemExit(f"{name}: {r['error']}")
        r["speedup_vs_1_thread"] = base / r["median_epoch_s"] if base and r["median_epoch_s"] else None
        print(f"{name}: {r['median_epoch_s']:.2f} s/epoch, test N@10 {r['test']['ndcg@10']:.4f}", flush=True)
    out = args.out or RESULTS / ("ddp_scaling_tiny.json" if args.tiny else "ddp_scaling.json")
    write_result(out, {"dataset": args.dataset, "config": CONFIG, "epochs": epochs, "rows": rows,
                       "machine": machine(), "command": " ".join(["python", *sys.argv])})
    print(f"-> {out}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
