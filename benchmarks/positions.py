"""Positions counted from the end (the newest item is always the last position) or from the start
(earlier positions never move, so a session can keep its KV cache): same quality?

The ml-100k demo recipe (configs/ml-100k-sasrec.toml) trained with `model.positions_from` end and
start at several seeds, one thread each, no time budget; leave-one-out, full ranking, chosen on
validation NDCG@10. Runs are kept under benchmarks/work/positions and reused when finished.

    python benchmarks/positions.py --seeds 42 43 44      # -> benchmarks/results/positions.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, ROOT, WORK, machine, write_result

CONFIG = "configs/ml-100k-sasrec.toml"


def train(align: str, seed: int, dataset: str) -> dict:
    out = WORK / "positions" / f"{align}-{seed}"
    cmd = [sys.executable, "-m", "seqrec.cli", "train", "--dataset", dataset, "--config", CONFIG, "--out", str(out),
           "--set", f'model.positions_from="{align}"', "--set", "train.time_budget_s=0", "--set", "train.epochs=200",
           "--set", "train.threads=1", "--set", f"train.seed={seed}", "--set", "train.progress=false"]
    if not (out / "results.json").is_file():
        subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    r = json.loads((out / "results.json").read_text())
    return {"align": align, "seed": seed, "valid_ndcg@10": r["valid"]["ndcg@10"],
            **{f"test_{m}": r["test"][m] for m in ("recall@10", "ndcg@10", "recall@50", "ndcg@50")},
            "best_epoch": r["checkpoint"]["epoch"], "train_seconds": r["train_seconds"],
            "command": " ".join(cmd[1:])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    p.add_argument("--dataset", default="ml-100k")
    args = p.parse_args()
    rows = [train(align, seed, args.dataset) for seed in args.seeds for align in ("end", "start")]
    summary = {}
    for align in ("end", "start"):
        mine = [r for r in rows if r["align"] == align]
        summary[align] = {k: statistics.median(r[k] for r in mine)
                          for k in ("valid_ndcg@10", "test_recall@10", "test_ndcg@10", "test_ndcg@50")}
    write_result(RESULTS / "positions.json", {"machine": machine(), "config": CONFIG, "runs": rows,
                                              "median": summary})
    print("| positions from | valid N@10 | test R@10 | test N@10 | test N@50 |\n|---|---|---|---|---|")
    for align, s in summary.items():
        print(f"| {align} | {s['valid_ndcg@10']:.4f} | {s['test_recall@10']:.4f} | {s['test_ndcg@10']:.4f} | "
              f"{s['test_ndcg@50']:.4f} |")


if __name__ == "__main__":
    main()
