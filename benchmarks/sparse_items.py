"""What sparse item-table gradients cost in quality: SASRec with a sampled softmax (1024 popularity
negatives, logQ) on a real dataset, `train.sparse_items` false and true, otherwise the defaults (each
run's `auto` decisions kept), one thread and a training-time cap. Lazy updates differ from Adam's most
where every row is sampled often, i.e. on small catalogues like this one; the speed side is
benchmarks/step_profile.py.

    python benchmarks/sparse_items.py [--dataset amazon-scientific-unisrec] [--budget 300]

A run folder that already holds results is reused. Writes results/sparse_items.json.
"""

from __future__ import annotations

import argparse
import json

from common import RESULTS, WORK, machine, prepared, train_run, write_result

SETS = ['model.loss="sampled_softmax"', "model.n_negatives=1024", 'model.negatives="popularity"', "model.logq=true",
        "train.threads=1", "train.progress=false"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="amazon-scientific-unisrec")
    p.add_argument("--budget", type=float, default=300)
    args = p.parse_args()
    prepared(args.dataset)
    out = WORK / "runs" / "sparse-quality"
    runs = {}
    for sparse in (False, True):
        short = "sci" if args.dataset == "amazon-scientific-unisrec" else args.dataset
        name = f"{short}-sparse-{str(sparse).lower()}"
        sets = [*SETS, f"train.sparse_items={str(sparse).lower()}", f"train.time_budget_s={args.budget:g}"]
        folder = out / name
        if (folder / "results.json").is_file():
            res = json.loads((folder / "results.json").read_text())
            runs[name] = {"sparse_items": sparse, "valid": res["valid"], "test": res["test"],
                          "epochs_run": res["epochs_run"], "best_epoch": res["checkpoint"]["epoch"],
                          "train_seconds": res["train_seconds"], "run": str(folder), "reused": True}
        else:
            runs[name] = {"sparse_items": sparse, **train_run(out, name, args.dataset, None, sets, model="sasrec")}
        print(name, runs[name].get("test", runs[name].get("error")), flush=True)
    write_result(RESULTS / "sparse_items.json", {
        "dataset": args.dataset, "sets": SETS, "budget_s": args.budget, "runs": runs, "machine": machine(),
        "command": f"python benchmarks/sparse_items.py --dataset {args.dataset} --budget {args.budget:g}"})


if __name__ == "__main__":
    main()
