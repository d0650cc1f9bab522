"""SASRec with each loss of seqrec.nn.objective on one dataset (default Amazon Beauty), same protocol.

Leave-one-out, full ranking, max length 50, chosen on validation NDCG@10 (patience
10), one CPU thread, one small SASRec (BASE: d 64, 1 block, 1 head, d_ff 64, dropout
0.2, lr 1e-3, batch 128, bf16 autocast) and only the loss changed. Each loss runs in
its own process under the same training-time budget (a run it stops says so);
rows merge into benchmarks/results/loss_compare.json under "dataset/loss[tag]".

    python benchmarks/loss_compare.py amazon-beauty-p5 --budget 480
    python benchmarks/loss_compare.py amazon-beauty-p5 --losses ce gbce --budget 0   # to convergence
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

BASE = [*PLAIN_TRAIN, 'model.name="sasrec"', "data.max_len=50", "model.d=64", "model.n_layers=1", "model.n_heads=1",
        "model.norm_first=true", "model.d_ff=64", "model.dropout=0.2", "model.attn_dropout=0.2", "train.lr=0.001",
        "train.batch_size=128", "train.epochs=200", "train.patience=10", "train.bf16=true", "eval.ks=[10, 50]"]
LOSSES = {
    "ce": ['model.loss="ce"'],
    "sampled_softmax": ['model.loss="sampled_softmax"', "model.n_negatives=256", 'model.negatives="uniform"'],
    "sampled_softmax_pop": ['model.loss="sampled_softmax"', "model.n_negatives=256", 'model.negatives="popularity"',
                            "model.logq=false"],
    "sampled_softmax_pop_logq": ['model.loss="sampled_softmax"', "model.n_negatives=256",
                                 'model.negatives="popularity"', "model.logq=true"],
    "bce": ['model.loss="bce"', "model.n_negatives=1"],
    "gbce": ['model.loss="gbce"', "model.n_negatives=256", "model.gbce_t=0.75"],
}


def run(dataset: str, loss: str, overrides: list[str], budget: float, tag: str) -> dict[str, Any]:
    data = prepared(dataset)
    cfg = resolve({}, [f'data.dataset="{data.path}"', *BASE, "train.progress=false", "train.threads=1",
                       f"train.time_budget_s={budget}", *LOSSES[loss], *overrides])
    results = fit(cfg, data, fresh_run(WORK / "runs" / f"losses-{dataset}-{loss}{tag}"))
    return {
        "dataset": dataset, "loss": loss, "config": cfg.to_dict(), "overrides": overrides,
        "test": {k: results["test"][k] for k in ("recall@10", "recall@50", "ndcg@10", "ndcg@50")},
        "valid_ndcg@10": results["valid"]["ndcg@10"], "best_epoch": results["checkpoint"]["epoch"],
        "epochs_run": results["epochs_run"], "train_seconds": results["train_seconds"],
        "stopped_by_budget": bool(budget) and results["train_seconds"] >= budget
        and results["epochs_run"] < cfg.train.epochs,
        "peak_rss_mb": results["peak_rss_mb"], "protocol": results["protocol"], "machine": machine(),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dataset", nargs="?", default="amazon-beauty-p5")
    p.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--budget", type=float, default=480.0, help="training seconds per loss (0 = none)")
    p.add_argument("--tag", default="")
    p.add_argument("--out", default=str(RESULTS / "loss_compare.json"))
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.one:
        print(json.dumps(run(args.dataset, args.one, args.set, args.budget, args.tag)))
        return
    out = Path(args.out)
    for loss in args.losses:
        cmd = [sys.executable, __file__, args.dataset, f"--one={loss}", f"--budget={args.budget}",
               f"--tag={args.tag}", *[f"--set={s}" for s in args.set]]
        row = json.loads(subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout.splitlines()[-1])
        row["command"] = " ".join(["python", "benchmarks/loss_compare.py", *sys.argv[1:]])
        table = json.loads(out.read_text()) if out.exists() else {}
        table[f"{args.dataset}/{loss}{args.tag}"] = row
        write_result(out, table)
        t = row["test"]
        print(f"{loss:<26} R@10 {t['recall@10']:.4f} N@10 {t['ndcg@10']:.4f} R@50 {t['recall@50']:.4f} "
              f"N@50 {t['ndcg@50']:.4f} best {row['best_epoch']}/{row['epochs_run']} {row['train_seconds']:.0f}s",
              flush=True)


if __name__ == "__main__":
    main()
