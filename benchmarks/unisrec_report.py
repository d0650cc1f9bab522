"""Collect the UniSRec runs of benchmarks/unisrec_runs.sh into benchmarks/results/unisrec.json.

Every number is read from a run folder (results.json, metrics.jsonl) or recomputed
from its checkpoint (cold / warm breakdown); nothing is typed by hand except the
published reference numbers (UniSRec, KDD 2022, Table 2, Scientific).

    python benchmarks/unisrec_report.py --make-cold-split   # the cold-item split (before its runs)
    python benchmarks/unisrec_report.py                     # collect and print
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from common import RESULTS, WORK, machine, prepared, write_result

from seqrec.cli.common import run_config
from seqrec.config import EvalConfig
from seqrec.data.dataset import PreparedDataset
from seqrec.eval.cold import cold_item_split, evaluate_cold_warm
from seqrec.train.checkpoint import load_checkpoint
from seqrec.train.transfer import Origin, mix, unmix

PUBLISHED = {  # R@10, N@10, R@50, N@50 on Scientific (../shared/data/README.md)
    "sasrec": {"recall@10": 0.1080, "ndcg@10": 0.0553, "recall@50": 0.2042, "ndcg@50": 0.0760},
    "unisrec-inductive": {"recall@10": 0.1188, "ndcg@10": 0.0641, "recall@50": 0.2394, "ndcg@50": 0.0903},
    "unisrec-transductive": {"recall@10": 0.1235, "ndcg@10": 0.0634, "recall@50": 0.2473, "ndcg@50": 0.0904},
}
RUNS = WORK / "runs"
SCI = "amazon-scientific-unisrec"
COLD = "amazon-scientific-unisrec-cold20"
STAGE = "bash benchmarks/unisrec_runs.sh"
QUALITY = {  # run folder -> (command, published row to compare with)
    "unisrec-scratch-text": (f"{STAGE} scratch", "unisrec-inductive"),
    "unisrec-scratch-text-id": (f"{STAGE} scratch-transductive", "unisrec-transductive"),
    "unisrec-scratch-text-id-wd": (f"{STAGE} scratch-transductive-wd", "unisrec-transductive"),
    "unisrec-scratch-text-norefit": (f"{STAGE} scratch-then-id (first stage)", "unisrec-inductive"),
    "unisrec-text-then-id": (f"{STAGE} scratch-then-id", "unisrec-transductive"),
    "unisrec-text-then-id-lr1e-4": (f"{STAGE} scratch-then-id, then {STAGE} then-id-lr", "unisrec-transductive"),
    "unisrec-text-then-id-lr1e-4-seed7": (f"{STAGE} two-stage-seed 7", "unisrec-transductive"),
    "unisrec-text-then-id-lr1e-4-seed11": (f"{STAGE} two-stage-seed 11", "unisrec-transductive"),
    "unisrec-ft-in-batch-inductive": (f"{STAGE} finetune in-batch inductive", "unisrec-inductive"),
    "unisrec-ft-in-batch-transductive": (f"{STAGE} finetune in-batch transductive", "unisrec-transductive"),
    "unisrec-ft-moco-inductive": (f"{STAGE} finetune moco inductive", "unisrec-inductive"),
    "unisrec-ft-moco-transductive": (f"{STAGE} finetune moco transductive", "unisrec-transductive"),
    # with the learned history bias (model.history_bias)
    "unisrec-scratch-text-hist": (f"{STAGE} scratch-hist", "unisrec-inductive"),
    **{f"unisrec-text-then-id-hist-seed{s}": (f"{STAGE} two-stage-hist {s}", "unisrec-transductive")
       for s in (42, 7, 11)},
    **{f"unisrec-ft-{n}-{s}-hist": (f"{STAGE} finetune-hist {n} {s}", f"unisrec-{s}")
       for n in ("in-batch", "moco") for s in ("inductive", "transductive")},
    "sasrec-amazon-scientific-unisrec-d05-refit": (
        "python benchmarks/sasrec_quality.py amazon-scientific-unisrec --set train.refit=true --tag=-d05-refit "
        "(benchmarks/configs/sasrec-amazon-scientific-unisrec.toml: dropout 0.5)", "sasrec"),
}
COLD_RUNS = {  # run folder -> command
    "sasrec-cold20": f"{STAGE} cold-sasrec",
    "unisrec-cold20-ft-in-batch-inductive": f"{STAGE} cold-unisrec",
    "unisrec-cold20-scratch-text": f"{STAGE} cold-unisrec-scratch",
    "unisrec-cold20-pretrained-zero-shot": f"{STAGE} cold-zero-shot",
    "unisrec-cold20-pretrained-hist-zero-shot": f"{STAGE} cold-zero-shot-hist",
    "unisrec-cold20-pretrained-inductive": f"{STAGE} cold-pretrained",
    **{f"unisrec-cold20-pretrained-hist-inductive-softmax-{w}": f"{STAGE} cold-pretrained-hist {w}"
       for w in ("trained", "all")},
    # the same from Games pre-trained for 30 epochs (games-centre-hist ran 1,645 steps, about 9)
    "unisrec-cold20-pretrained-hist-zero-shot-games-centre-hist-e30":
        f"HIST=games-centre-hist-e30 {STAGE} cold-zero-shot-hist",
    "unisrec-cold20-pretrained-hist-inductive-softmax-trained-games-centre-hist-e30":
        f"HIST=games-centre-hist-e30 {STAGE} cold-pretrained-hist trained",
    # and from the d 128 recipe (configs/pretrain.toml since games-centre-hist-d128)
    **{f"unisrec-cold20-pretrained-hist-{kind}-games-centre-hist-d128":
       f"HIST=games-centre-hist-d128 {STAGE} {stage}"
       for kind, stage in (("zero-shot", "cold-zero-shot-hist"),
                           ("inductive-softmax-trained", "cold-pretrained-hist trained"))},
    # the same again since fine-tuning tries weight mixes with the pre-trained model (train.interpolate)
    "unisrec-cold20-pretrained-hist-inductive-softmax-trained-games-centre-hist-d128-mix":
        f"HIST=games-centre-hist-d128 TAG=-mix {STAGE} cold-pretrained-hist trained",
}
PRETRAIN = ("unisrec-pretrain-in-batch", "unisrec-pretrain-moco")
MEMORY = ("unisrec-memory-moco-b256", "unisrec-memory-in-batch-b256", "unisrec-memory-in-batch-b8192")
KEYS = ("recall@10", "ndcg@10", "recall@50", "ndcg@50")


def make_cold_split() -> None:
    data = prepared(SCI)
    dest = WORK / "prepared" / COLD
    cold = cold_item_split(data, 0.2, seed=0, dest=dest)
    if (data.path / "text_cache").is_dir():  # same item table -> same cache keys
        shutil.copytree(data.path / "text_cache", dest / "text_cache", dirs_exist_ok=True)
    logging.info("cold split: %s", cold.stats())


def quality() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for run, (command, published) in QUALITY.items():
        path = RUNS / run / "results.json"
        if not path.is_file():
            continue
        r = json.loads(path.read_text())
        out[run] = {"command": command, "test": {k: r["test"][k] for k in KEYS},
                    "valid_ndcg@10": r["valid"]["ndcg@10"], "best_epoch": r["checkpoint"]["epoch"],
                    "epochs_run": r["epochs_run"], "train_seconds": r["train_seconds"],
                    "refit": r["protocol"].get("refit", False),
                    "published": {"row": published, **PUBLISHED[published]}, "protocol": r["protocol"],
                    "valid_curve": curve(RUNS / run)}
    return out


def curve(run: Path) -> list[list[float]]:
    """[epoch, validation NDCG@10, elapsed seconds] per epoch: runs compared at equal epochs or time."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    return [[r["epoch"], round(r["valid"]["ndcg@10"], 5), round(r["elapsed_s"], 1)] for r in rows if "valid" in r]


def cold_results() -> dict[str, Any]:
    out: dict[str, Any] = {}
    cold_path = WORK / "prepared" / COLD
    if not (cold_path / "meta.json").is_file():
        return out
    data = PreparedDataset.load(cold_path)
    out["split"] = {**data.stats(), "options": data.meta["options"]}
    for run in COLD_RUNS:
        if not (RUNS / run / "results.json").is_file():
            continue
        cfg = json.loads((RUNS / run / "config.json").read_text())
        model, _ = load_checkpoint(RUNS / run / "checkpoint")
        ev = EvalConfig(ks=[10, 50])
        out[run] = {"command": COLD_RUNS[run],
                    **evaluate_cold_warm(model, data, "test", cfg["data"]["max_len"], ev, torch.device("cpu"))}
        if (curve := mix_curve(RUNS / run, model, data, ev)) is not None:
            out[run]["mix_curve"] = curve
    return out


def mix_curve(run: Path, model: Any, data: PreparedDataset, ev: EvalConfig) -> dict[str, Any] | None:
    """A fine-tuned run that tried weight mixes (`train.interpolate`): cold and warm test metrics of alpha x
    fine-tuned + (1 - alpha) x pre-trained for alpha 0 (the pre-trained weights) to 1 (the fine-tuned ones),
    the trade a catalogue whose new items must be found may choose; the run itself kept the mix its
    validation picked (`kept`), which never saw these numbers."""
    results = json.loads((run / "results.json").read_text())
    if not isinstance(results.get("interpolation"), dict):
        return None
    if "origin" in results:
        o = Origin(**results["origin"])
    else:  # finished before results.json named its pre-trained run: the one its command names (HIST=...)
        hist = re.search(r"HIST=(\S+)", COLD_RUNS[run.name])
        o = Origin.of(RUNS / "xfer" / (hist.group(1) if hist else "games-centre-hist"))
    cfg = run_config(run)
    start = o.weights(o.model(data, cfg.model, cfg.data.max_len, cfg.train.seed))  # type: ignore[arg-type]
    kept = float(results["interpolation"]["alpha"])
    tuned = unmix(model, start, kept)  # the checkpoint holds the kept mix
    test = {}
    for alpha in (0.0, 0.25, 0.5, 0.75, 1.0):
        mix(model, start, alpha, tuned)
        test[f"{alpha:g}"] = evaluate_cold_warm(model, data, "test", cfg.data.max_len, ev, torch.device("cpu"))
    mix(model, start, kept, tuned)
    interp = results["interpolation"]
    epochs = {row[0]: row[1] for row in curve(run)}  # validation NDCG@10 per epoch (0: the pre-trained weights)
    valid = {**({"0": epochs[0]} if 0 in epochs else {}), **interp.get("valid", {}),
             **({"1": interp["fine_tuned"]} if "fine_tuned" in interp else {})}
    return {"kept": kept, "valid": valid, "test": test}


def pretraining() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for run in (*PRETRAIN, *MEMORY):
        path = RUNS / run / "results.json"
        if path.is_file():
            r = json.loads(path.read_text())
            cfg = json.loads((RUNS / run / "config.json").read_text())["pretrain"]
            out[run] = {k: r[k] for k in ("negatives", "steps", "epochs_run", "train_seconds", "sequences_per_s",
                                          "targets_per_s", "final_loss", "peak_rss_mb", "domains")}
            out[run].update(batch_size=cfg["batch_size"], queue_size=cfg["queue_size"], positions=cfg["positions"],
                            command=f"{STAGE} memory" if run in MEMORY else f"{STAGE} pretrain {r['negatives']}")
    return out


def text_encoding() -> dict[str, Any]:
    out = {}
    for name in (SCI, "yelp-p5", "ml-100k"):
        for meta_path in sorted((WORK / "prepared" / name / "text_cache").glob("*.json")):
            m = json.loads(meta_path.read_text())
            out[f"{name}/{meta_path.stem}"] = {
                "encoder": "/".join(Path(m["encoder"]).parts[-2:]), "revision": m["revision"],
                "pooling": m["pooling"], "max_length": m["max_length"],
                "items": m["n_items"], "views": 2 if m["word_drop"] else 1, "seconds": m["seconds"],
                "texts_per_s": m["texts_per_s"], "note": "texts_per_s counts both views (original + word drop)"}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--make-cold-split", action="store_true")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(1)
    if args.make_cold_split:
        make_cold_split()
        return
    # entries whose run folders are not on this machine (benchmarks/work/ is not committed) are kept
    # from the file; those found are collected afresh
    path = RESULTS / "unisrec.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    for section, found in (("quality", quality()), ("cold", cold_results()), ("pretraining", pretraining()),
                           ("text_encoding", text_encoding())):
        result[section] = {**result.get(section, {}), **found}
    result.update(machine=machine(),
                  note="shared 2-core CPU, one torch thread per run; d=64 (paper: 300); time budgets per run")
    write_result(path, result)
    for run, r in result["quality"].items():
        t, pub = r["test"], r["published"]
        print(f"{run:<36} " + "  ".join(f"{k} {t[k]:.4f} ({pub[k]:.4f})" for k in KEYS))
    for run, r in result["cold"].items():
        if run != "split":
            print(f"{run:<36} cold n={r['n_cold']} R@10 {r['cold'].get('recall@10', float('nan')):.4f}  "
                  f"warm n={r['n_warm']} R@10 {r['warm']['recall@10']:.4f}")


if __name__ == "__main__":
    main()
