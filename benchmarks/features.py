"""Side features and output layers, measured.

Two studies, same protocol as every benchmark here (leave-one-out, full ranking
over all items, max length 50, model chosen on validation NDCG@10, test read once,
seen items not filtered, one CPU thread), with a small model (d=64, one block) and a
training-time budget per run so that every variant of a study gets the same
training time on this shared 2-core machine:

  features  SASRec and GRU4Rec without side features and with them, the continuous
            ones encoded by soft one-hot, linear or bucketised embeddings; ml-100k
            (time gap, genres, release year) and diginetica-sample (time gap); several
            seeds, so the spread can be told from a difference.
  output    SASRec with tied item embeddings + output bias, tied without bias, and
            untied (+ bias), on Beauty and Scientific: accuracy and parameter count.

Each run is one row of benchmarks/results/features.json (or output_layer.json)
keyed "dataset/model/variant/seed", merged with earlier rows; the summary (mean and
sample standard deviation over seeds) is recomputed from the rows on every write.

    python benchmarks/features.py features --datasets diginetica-sample ml-100k --seeds 0 1 2
    python benchmarks/features.py output --datasets amazon-beauty-p5 amazon-scientific-unisrec
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

from common import PLAIN_TRAIN, RESULTS, WORK, fresh_run, machine, prepared, write_result

from seqrec.config import resolve
from seqrec.train.loop import fit

METRICS = ("recall@10", "recall@50", "ndcg@10", "ndcg@50")
COMMON = [*PLAIN_TRAIN, "data.max_len=50", "train.epochs=200", "train.patience=5", "train.threads=1",
          "train.progress=false", "train.lr=0.001", "train.batch_size=128", "eval.ks=[10, 50]", "model.d=64"]
MODELS = {
    "sasrec": ['model.name="sasrec"', "model.n_layers=1", "model.n_heads=1", "model.norm_first=true", "model.d_ff=256",
               "model.dropout=0.2",
               "model.attn_dropout=0.2", 'model.loss="ce"'],
    "gru4rec": ['model.name="gru4rec"', "model.dropout=0.2", 'model.loss="ce"'],
}
GAP = '{name="gap", level="event", kind="continuous", transform="log1p", encoding="%s"}'
FEATURES = {  # the continuous fields take the variant's encoding; categorical ones are embeddings
    "ml-100k": [GAP, '{name="year", level="item", kind="continuous", encoding="%s"}',
                '{name="categories", level="item", kind="multi_categorical"}'],
    "diginetica-sample": [GAP],
}
ENCODINGS = ("soft_one_hot", "linear", "bucket")
OUTPUTS = {
    "tied+bias": ["model.tied=true", "model.output_bias=true"],
    "tied": ["model.tied=true", "model.output_bias=false"],
    "untied+bias": ["model.tied=false", "model.output_bias=true"],
}


def feature_override(dataset: str, encoding: str) -> str:
    fields = [f % encoding if "%s" in f else f for f in FEATURES[dataset]]
    return f"features.fields=[{', '.join(fields)}]"


def run(dataset: str, model: str, variant: str, seed: int, overrides: list[str], budget: float) -> dict[str, Any]:
    data = prepared(dataset)
    cfg = resolve({}, [f'data.dataset="{data.path}"', *COMMON, *MODELS[model], f"train.seed={seed}",
                       f"train.time_budget_s={budget}", *overrides])
    results = fit(cfg, data, fresh_run(WORK / "runs" / f"features-{dataset}-{model}-{variant}-{seed}"))
    return {
        "dataset": dataset, "model": model, "variant": variant, "seed": seed, "config": cfg.to_dict(),
        "test": {k: results["test"][k] for k in METRICS},
        "valid": {k: results["valid"][k] for k in ("recall@10", "ndcg@10")},
        "best_epoch": results["checkpoint"]["epoch"], "epochs_run": results["epochs_run"],
        "train_seconds": results["train_seconds"],
        "stopped_by_budget": bool(budget) and results["train_seconds"] >= budget
        and results["epochs_run"] < cfg.train.epochs,
        "n_parameters": results["n_parameters"], "protocol": results["protocol"], "machine": machine(),
    }


def summarise(rows: dict[str, Any]) -> dict[str, Any]:
    """Mean and sample std over seeds of each (dataset, model, variant)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows.values():
        groups.setdefault(f"{row['dataset']}/{row['model']}/{row['variant']}", []).append(row)
    out = {}
    for key, group in sorted(groups.items()):
        cell: dict[str, Any] = {"seeds": sorted(r["seed"] for r in group),
                                "n_parameters": group[0]["n_parameters"],
                                "epochs_run_mean": statistics.mean(r["epochs_run"] for r in group),
                                "stopped_by_budget": sum(r["stopped_by_budget"] for r in group)}
        for m in METRICS:
            values = [r["test"][m] for r in group]
            cell[m] = {"mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}
        out[key] = cell
    return out


def record(out: Path, key: str, row: dict[str, Any]) -> None:
    table = json.loads(out.read_text()) if out.exists() else {"runs": {}}
    table["runs"][key] = row
    table["summary"] = summarise(table["runs"])
    write_result(out, table)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("study", choices=["features", "output"])
    p.add_argument("--datasets", nargs="+", required=True)
    p.add_argument("--models", nargs="+", default=["sasrec", "gru4rec"], choices=list(MODELS))
    p.add_argument("--variants", nargs="+", help="default: every variant of the study")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--budget", type=float, default=60.0, help="training seconds per run (0 = none)")
    p.add_argument("--out", help="results file (default by study)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    study_default = "features.json" if args.study == "features" else "output_layer.json"
    out = Path(args.out) if args.out else RESULTS / study_default
    command = " ".join(["python", "benchmarks/features.py", *sys.argv[1:]])
    for dataset in args.datasets:
        for model in args.models:
            if args.study == "features":
                variants = {"none": [], **{e: [feature_override(dataset, e)] for e in ENCODINGS}}
            else:
                variants = dict(OUTPUTS)
            for variant in args.variants or list(variants):
                for seed in args.seeds:
                    row = run(dataset, model, variant, seed, variants[variant], args.budget)
                    row["command"] = command
                    record(out, f"{dataset}/{model}/{variant}/{seed}", row)
                    t = row["test"]
                    print(f"{dataset}/{model}/{variant}/{seed}: R@10 {t['recall@10']:.4f} R@50 {t['recall@50']:.4f} "
                          f"N@10 {t['ndcg@10']:.4f} N@50 {t['ndcg@50']:.4f} epochs {row['best_epoch']}/"
                          f"{row['epochs_run']} {row['train_seconds']:.0f}s params {row['n_parameters']}", flush=True)


if __name__ == "__main__":
    main()
