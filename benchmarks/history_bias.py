"""The evidence for the `model.history_bias = "auto"` rule: each model that takes the learned history
bias (seqrec.nn.history), trained by `seqrec train --model M` with the bias on and off, on the datasets
where users come back to items they already have (their repeat rate is in the file). Validation picks;
test is shown beside it.

    python benchmarks/history_bias.py [--datasets diginetica-sample] [--models sasrec gru4rec] [--seeds 0 1 2]
                                      [--budget 600]     # rows of other seeds in the file are kept

The datasets with no returns (every Amazon build, MovieLens, Yelp, Last.fm) run with the bias on in every
recipe and default: the `-hist` rows of results/sasrec_quality*.json and the data-efficiency files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, WORK, machine, prepared, train_run, write_result

OUT = RESULTS / "history_bias.json"


def compare(dataset: str, model: str, seed: int, budget: float, threads: int) -> dict[str, Any]:
    """The model's defaults with the bias on and off (one seed): each run's record, and which validation
    prefers."""
    runs = {}
    for on in (True, False):
        sets = [f"model.history_bias={str(on).lower()}", "train.progress=false", f"train.threads={threads}",
                f"train.time_budget_s={budget}", f"train.seed={seed}"]
        name = f"{dataset}-{model}-{on}" + (f"-s{seed}" if seed else "")
        runs["on" if on else "off"] = r = train_run(WORK / "runs" / "history-bias", name, dataset, None, sets,
                                                    model=model)
        print(dataset, model, seed, "on" if on else "off",
              f"valid N@10 {r['valid']['ndcg@10']:.4f}" if "valid" in r else r.get("error", "")[-300:], flush=True)
    valid = {k: r["valid"]["ndcg@10"] for k, r in runs.items() if "valid" in r}
    return {"dataset": dataset, "model": model, "seed": seed, "runs": runs,
            "validation_prefers": max(valid, key=valid.__getitem__) if len(valid) == 2 else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", default=["diginetica-sample"])
    p.add_argument("--models", nargs="+", default=["sasrec", "gru4rec"])
    p.add_argument("--budget", type=float, default=600.0, help="training time cap per run, seconds")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="train.seed of each pair of runs")
    args = p.parse_args()
    before = json.loads(OUT.read_text()) if OUT.is_file() else {}
    kept = {(r["dataset"], r["model"], r.get("seed", 0)): r for r in before.get("rows", [])}  # other seeds stay
    commands = [c for c in before.get("commands", [before.get("command")]) if c]
    for dataset in args.datasets:
        rate = prepared(dataset).repeat_rates()["repeat_rate"]
        for model in args.models:
            for seed in args.seeds:
                kept[(dataset, model, seed)] = {**compare(dataset, model, seed, args.budget, args.threads),
                                                "repeat_rate": rate}
    rows = [kept[k] for k in sorted(kept)]
    write_result(OUT, {"rows": rows, "machine": machine(), "commands": [*commands, " ".join(["python", *sys.argv])]})
    print(f"-> {OUT}")


if __name__ == "__main__":
    main()
