"""The model zoo under one trainer: item2vec, GRU4Rec, SASRec, BERT4Rec and UniSRec (text only, from scratch).

Same protocol for every cell: leave-one-out, full ranking over all items, model
chosen on validation NDCG@10 (early stopping, patience 5 epochs; 20 for BERT4Rec,
whose validation curve is slow and noisy), test read once,
already-seen items not filtered, one CPU thread. Each (dataset, model) cell runs in
its own process so that its peak RSS is its own. Results are merged into
benchmarks/results/zoo.json under "dataset/model[tag]"; a cell stopped by its
training-time budget says so (`stopped_by_budget`).

Per dataset (DATASETS): the maximum length (200 on ml-100k, whose histories are
long; 50 elsewhere), the batch size of the sequence models (small catalogues and
few users: smaller batches, more steps), the loss of the sequence models (full
softmax CE on ml-100k and Scientific; sampled softmax with 1,024 uniform negatives
shared by the batch on Beauty, Sports and Yelp, about a tenth of the cost of CE
there) and the training-time budget of a cell. None of these was tuned per cell.
UniSRec (text only, no pre-training; its own cosine softmax over every item) runs where the
items have real text; Beauty and Sports carry generated ids instead, diginetica none.
The pre-trained and fine-tuned UniSRec runs are in benchmarks/unisrec_runs.sh.

    python benchmarks/zoo.py ml-100k amazon-scientific-unisrec --models item2vec gru4rec sasrec bert4rec
    python benchmarks/zoo.py amazon-beauty-p5 --models sasrec --budget 1800 --set train.batch_size=256
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import PLAIN_TRAIN, RESULTS, WORK, fresh_run, machine, prepared, write_result

from seqrec.config import resolve
from seqrec.train.loop import fit

SAMPLED = ['model.loss="sampled_softmax"', "model.n_negatives=1024", 'model.negatives="uniform"']
# dataset -> (max length, batch size of the sequence models, their loss settings, training seconds per cell)
DATASETS: dict[str, tuple[int, int, list[str], float]] = {
    "ml-100k": (200, 32, ['model.loss="ce"'], 120.0),
    "amazon-scientific-unisrec": (50, 64, ['model.loss="ce"'], 120.0),
    "amazon-beauty-p5": (50, 128, SAMPLED, 150.0),
    "amazon-sports-p5": (50, 128, SAMPLED, 180.0),
    "yelp-p5": (50, 128, SAMPLED, 180.0),
    "diginetica-sample": (50, 32, ['model.loss="ce"'], 300.0),
}
COMMON = [*PLAIN_TRAIN, "train.epochs=300", "train.patience=5", "train.threads=1", "train.progress=false",
          "eval.ks=[10, 50]"]
SEQUENCE_MODELS = ("gru4rec", "sasrec", "bert4rec", "unisrec")
NO_TEXT = {"amazon-beauty-p5", "amazon-sports-p5", "diginetica-sample"}  # no real item text for UniSRec
MODELS: dict[str, list[str]] = {
    "item2vec": ['model.name="item2vec"', "model.d=64", "model.window=5", "model.n_negatives=5",
                 "model.subsample=1e-3", "model.recency=0.8", 'model.scoring="cosine"', "train.lr=0.005",
                 "train.batch_size=128"],
    "gru4rec": ['model.name="gru4rec"', "model.d=64", "model.dropout=0.2", "train.lr=0.001"],
    "sasrec": ['model.name="sasrec"', "model.d=64", "model.n_layers=2", "model.n_heads=1", "model.norm_first=true",
               "model.d_ff=256",
               "model.dropout=0.2", "model.attn_dropout=0.2", "train.lr=0.001", "train.bf16=true"],
    "bert4rec": ['model.name="bert4rec"', "model.d=64", "model.n_layers=2", "model.n_heads=2", "model.d_ff=256",
                 "model.dropout=0.2", "model.attn_dropout=0.2", "model.mask_prob=0.2", "model.last_mask_share=0.1",
                 "train.lr=0.001", "train.bf16=true", "train.patience=20"],  # the cloze objective learns slowly
    "unisrec": ['model.name="unisrec"', "model.d=64", "model.n_layers=2", "model.n_heads=2", "model.d_ff=256",
                "model.dropout=0.5", "model.attn_dropout=0.5", "model.temperature=0.07", "model.n_experts=8",
                "model.adaptor_dropout=0.2", "train.lr=0.001"],
}


def settings(dataset: str, model: str) -> list[str]:
    """The overrides of one cell before the command line's own."""
    max_len, batch, loss, _ = DATASETS[dataset]
    per_dataset = [f"data.max_len={max_len}"]
    if model in SEQUENCE_MODELS:
        per_dataset += [f"train.batch_size={batch}", *(loss if model != "unisrec" else [])]
    return [*COMMON, *MODELS[model], *per_dataset]


def cell(dataset: str, model: str, overrides: list[str], budget: float, tag: str) -> dict[str, Any]:
    data = prepared(dataset)
    cfg = resolve({}, [f'data.dataset="{data.path}"', *settings(dataset, model), f"train.time_budget_s={budget}",
                       *overrides])
    results = fit(cfg, data, fresh_run(WORK / "runs" / f"zoo-{model}-{dataset}{tag}"))
    test = results["test"]
    return {
        "dataset": dataset, "model": model, "config": cfg.to_dict(), "overrides": overrides,
        "test": {k: test[k] for k in ("recall@10", "recall@50", "ndcg@10", "ndcg@50")},
        "valid": {k: results["valid"][k] for k in ("recall@10", "ndcg@10")},
        "best_epoch": results["checkpoint"]["epoch"], "epochs_run": results["epochs_run"],
        "train_seconds": results["train_seconds"], "peak_rss_mb": results["peak_rss_mb"],
        "stopped_by_budget": bool(budget) and results["train_seconds"] >= budget
        and results["epochs_run"] < cfg.train.epochs,
        "n_parameters": results["n_parameters"], "protocol": results["protocol"], "machine": machine(),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("datasets", nargs="+", choices=DATASETS)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--set", action="append", default=[], help="config override for every cell")
    p.add_argument("--budget", type=float, default=None,
                   help="training seconds per cell (0 = none; default: the dataset's, see DATASETS)")
    p.add_argument("--tag", default="")
    p.add_argument("--out", default=str(RESULTS / "zoo.json"))
    p.add_argument("--one", nargs=2, metavar=("DATASET", "MODEL"), help=argparse.SUPPRESS)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.one:  # a child process: one cell, its JSON on the last line of stdout
        print(json.dumps(cell(args.one[0], args.one[1], args.set, args.budget, args.tag)))
        return
    out = Path(args.out)
    for dataset in args.datasets:
        for model in args.models:
            key = f"{dataset}/{model}{args.tag}"
            if model == "unisrec" and dataset in NO_TEXT:
                logging.info("%s: skipped, the dataset has no real item text", key)
                continue
            budget = DATASETS[dataset][3] if args.budget is None else args.budget
            cmd = [sys.executable, __file__, *args.datasets[:1], "--one", dataset, model, "--budget",
                   str(budget), f"--tag={args.tag}", *[f"--set={s}" for s in args.set]]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            row["command"] = " ".join(["python", "benchmarks/zoo.py", *sys.argv[1:]])
            table = json.loads(out.read_text()) if out.exists() else {}
            table[key] = row
            write_result(out, table)
            t = row["test"]
            print(f"{key:<40} R@10 {t['recall@10']:.4f} R@50 {t['recall@50']:.4f} N@10 {t['ndcg@10']:.4f} "
                  f"N@50 {t['ndcg@50']:.4f} best epoch {row['best_epoch']}/{row['epochs_run']} "
                  f"{row['train_seconds']:.0f}s {row['peak_rss_mb']:.0f}MB", flush=True)


if __name__ == "__main__":
    main()
