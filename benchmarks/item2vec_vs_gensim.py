"""seqrec's item2vec against gensim's Word2Vec (skip-gram, negative sampling) on the same sentences.

Sentences: every user's training events (validation and test targets excluded), in
time order, item indices as tokens. Both sides use the same hyperparameters (d, window,
k negatives, unigram^0.75, subsampling t) and the same user state and scoring: the
recency-weighted mean of the history's input vectors, cosine against every item's input
vector, leave-one-out, full ranking. gensim trains with its own SGD (linear learning-rate
decay, `workers=1`); its epoch count is chosen on validation NDCG@10 among `--gensim-epochs`.
seqrec trains through `fit` (Adam, early stopping on validation NDCG@10) with its default
negatives, shared by the pairs of a batch (see seqrec.models.item2vec), and again with
word2vec's k negatives per pair (`seqrec_per_pair`).
Speed: gensim's seconds for its chosen epoch count against seqrec's training seconds (evaluation
excluded) until its validation NDCG@10 first reaches gensim's best, and each side's median
seconds per epoch. Writes benchmarks/results/item2vec_vs_gensim.json.

    python benchmarks/item2vec_vs_gensim.py ml-100k amazon-scientific-unisrec
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import RESULTS, WORK, fresh_run, machine, prepared, write_result

from seqrec.config import EvalConfig, resolve
from seqrec.data.dataset import PreparedDataset
from seqrec.eval.evaluate import evaluate, protocol
from seqrec.models.item2vec import Item2Vec, Item2VecConfig
from seqrec.train.loop import fit

HP = {"d": 64, "window": 5, "n_negatives": 5, "subsample": 1e-3, "recency": 0.8}
KEYS = ("recall@10", "recall@50", "ndcg@10", "ndcg@50")


def sentences(data: PreparedDataset) -> list[list[str]]:
    ends = data.offsets[:-1] + data.train_end()
    return [[str(i) for i in data.items[s:e]] for s, e in zip(data.offsets[:-1], ends, strict=True) if e > s]


def gensim_model(data: PreparedDataset, epochs: int, seed: int) -> tuple[Item2Vec, float]:
    from gensim.models import Word2Vec

    t0 = time.perf_counter()
    w2v = Word2Vec(sentences(data), vector_size=HP["d"], window=HP["window"], negative=HP["n_negatives"],
                   ns_exponent=0.75, sample=HP["subsample"], sg=1, min_count=1, workers=1, epochs=epochs, seed=seed)
    seconds = time.perf_counter() - t0
    model = Item2Vec(Item2VecConfig(d=HP["d"], recency=HP["recency"], scoring="cosine"), data.n_items, max_len=50)
    table = torch.zeros(data.n_items + 1, HP["d"])
    for token, row in w2v.wv.key_to_index.items():
        table[int(token)] = torch.from_numpy(np.array(w2v.wv.vectors[row]))
    with torch.no_grad():
        model.item_emb.weight.copy_(table)  # items never in a training sentence keep a zero vector
    return model.eval(), seconds


def compare(name: str, gensim_epochs: list[int], budget: float) -> dict[str, Any]:
    data = prepared(name)
    ev, cpu = EvalConfig(ks=[10, 50]), torch.device("cpu")
    runs = []
    for epochs in gensim_epochs:
        model, seconds = gensim_model(data, epochs, seed=42)
        runs.append({"epochs": epochs, "train_seconds": seconds,
                     "valid": evaluate(model, data, "valid", 50, ev, cpu), "model": model})
        logging.info("gensim %s epochs %d: valid ndcg@10 %.4f (%.0fs)", name, epochs, runs[-1]["valid"]["ndcg@10"],
                     seconds)
    best = max(runs, key=lambda r: r["valid"]["ndcg@10"])
    gensim_test = evaluate(best["model"], data, "test", 50, ev, cpu)
    overrides = [f'data.dataset="{data.path}"', 'model.name="item2vec"', *[f"model.{k}={v}" for k, v in HP.items()],
                 'model.scoring="cosine"', "train.lr=0.005", "train.patience=5", "train.threads=1",
                 "train.progress=false", "eval.ks=[10, 50]", f"train.time_budget_s={budget}"]
    return {
        "dataset": name, "hyperparameters": HP, "protocol": protocol(data, ev, "test", 50),
        "gensim": {"epochs_tried": [{"epochs": r["epochs"], "valid_ndcg@10": r["valid"]["ndcg@10"],
                                     "train_seconds": r["train_seconds"]} for r in runs],
                   "chosen_epochs": best["epochs"], "train_seconds": best["train_seconds"],
                   "seconds_per_epoch": best["train_seconds"] / best["epochs"],
                   "test": {k: gensim_test[k] for k in KEYS}},
        "seqrec": ours(data, overrides, name, Item2VecConfig().shared_negatives, best["valid"]["ndcg@10"]),
        "seqrec_per_pair": ours(data, overrides, name, 0, best["valid"]["ndcg@10"]),
        "machine": machine(),
    }


def ours(data: PreparedDataset, overrides: list[str], name: str, shared: int, gensim_valid: float) -> dict[str, Any]:
    """seqrec's run; `shared` negatives per batch (0: word2vec's k per pair)."""
    run_dir = WORK / "runs" / f"item2vec-vs-gensim-{name}{'' if shared else '-per-pair'}"
    r = fit(resolve({}, [*overrides, f"model.shared_negatives={shared}"]), data, fresh_run(run_dir))
    curve = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    elapsed = np.cumsum([c["train_s"] for c in curve])
    reached = [t for c, t in zip(curve, elapsed, strict=True) if c["valid"]["ndcg@10"] >= gensim_valid]
    return {"best_epoch": r["checkpoint"]["epoch"], "epochs_run": r["epochs_run"],
            "train_seconds": r["train_seconds"], "test": {k: r["test"][k] for k in KEYS},
            "valid_ndcg@10": r["valid"]["ndcg@10"], "shared_negatives": shared,
            "seconds_per_epoch": float(np.median([c["train_s"] for c in curve])),
            "valid_curve": [[c["epoch"], round(c["valid"]["ndcg@10"], 5), round(float(t), 2)]
                            for c, t in zip(curve, elapsed, strict=True)],
            "train_seconds_to_gensim_valid": float(reached[0]) if reached else None}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("datasets", nargs="+")
    p.add_argument("--gensim-epochs", type=int, nargs="+", default=[1, 3, 5, 10, 20])
    p.add_argument("--budget", type=float, default=300.0, help="seqrec training seconds (0 = none)")
    p.add_argument("--out", default=str(RESULTS / "item2vec_vs_gensim.json"))
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    out = Path(args.out)
    for name in args.datasets:
        row = compare(name, args.gensim_epochs, args.budget)
        row["command"] = " ".join(["python", "benchmarks/item2vec_vs_gensim.py", *sys.argv[1:]])
        table = json.loads(out.read_text()) if out.exists() else {}
        table[name] = row
        write_result(out, table)
        g, s = row["gensim"]["test"], row["seqrec"]["test"]
        print(f"{name:<28} gensim N@10 {g['ndcg@10']:.4f} R@10 {g['recall@10']:.4f} | "
              f"seqrec N@10 {s['ndcg@10']:.4f} R@10 {s['recall@10']:.4f}", flush=True)


if __name__ == "__main__":
    main()
