"""Data-efficiency curves: how good is each model when it learns from a fraction of the target's users?

For each fraction f of the target's users (seeded sample; `data.train_fraction`), every method learns
from those users' training events only, while validation and test are every user's, unchanged:
leave-one-out, full ranking, seen items not filtered, the model chosen on validation NDCG@10 (no refit).

    popularity       training-event counts of the sampled users (no model)
    sasrec           SASRec from scratch (benchmarks/configs/sasrec-<target>.toml)
    unisrec-scratch  UniSRec, text only, from scratch (benchmarks/configs/unisrec-<target>.toml)
    pt-inductive     the pre-trained UniSRec fine-tuned text only, every weight trained
    pt-transductive  the same with a new learned ID embedding added to the text vector
    pt-adaptor       only the pre-trained text adaptor transferred (a fresh Transformer), text only, all trained
    zero-shot        the pre-trained UniSRec with no training on the target (one value for every f)

    python benchmarks/data_efficiency.py run --target amazon-scientific-unisrec --pretrained RUN [--jobs 2]
    python benchmarks/data_efficiency.py report --target amazon-scientific-unisrec --pretrained RUN [RUN ...]

`run` is resumable: a run folder with results.json is not run again. Runs from a pre-trained model
live under that model's name, so several pre-training recipes can be compared on one target. `report` writes
results/data_efficiency_<target>.json (every run, its command) and the plot beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, WORK, cpu_model, machine, prepared, write_result

from seqrec.data.counts import train_item_counts
from seqrec.data.dataset import PreparedDataset

FRACTIONS = (0.01, 0.05, 0.1, 0.25, 1.0)
SMALL = 0.1  # fractions up to this one run every seed
METHODS = ("sasrec", "unisrec-scratch", "pt-inductive", "pt-transductive", "pt-adaptor")
BUDGET_S = {0.01: 240, 0.05: 300, 0.1: 400, 0.25: 600, 1.0: 900}  # training-time cap per run
SEQREC = str(ROOT / ".venv" / "bin" / "seqrec")


def run_dir(target: str, method: str, fraction: float, seed: int, pretrained: Path | None = None,
            tag: str = "") -> Path:
    """Runs from scratch under the target; runs from a pre-trained model under that model's name."""
    root = WORK / "runs" / "data-efficiency" / target
    if method.startswith("pt-"):
        assert pretrained is not None
        root = root / pretrained.name
    return root / f"{method}{tag}-f{fraction:g}-s{seed}"


def command(method: str, target: Path, name: str, fraction: float, seed: int, pretrained: Path | None,
            out: Path, extra: Sequence[str] = ()) -> list[str]:
    """The seqrec command line of one run; `extra`: SECTION.KEY=VALUE overrides of a variant."""
    common = [*(a for kv in extra for a in ("--set", kv)),
              "--set", f"data.train_fraction={fraction}", "--set", f"data.train_fraction_seed={seed}",
              "--set", f"train.seed={seed}", "--set", "train.refit=false", "--set", "train.progress=false",
              "--set", "train.threads=1", "--set", f"train.time_budget_s={BUDGET_S[fraction]}", "--out", str(out)]
    configs = ROOT / "benchmarks" / "configs"
    if method == "sasrec":
        return [SEQREC, "train", "--dataset", str(target), "--config", str(configs / f"sasrec-{name}.toml"), *common]
    if method == "unisrec-scratch":
        return [SEQREC, "train", "--dataset", str(target), "--config", str(configs / f"unisrec-{name}.toml"), *common]
    if pretrained is None:
        raise SystemExit(f"{method} needs --pretrained RUN")
    setting = {"pt-adaptor": "inductive"}.get(method, method.removeprefix("pt-"))
    transfer = ["--transfer", "adaptor"] if method == "pt-adaptor" else []
    return [SEQREC, "finetune", str(target), "--from", str(pretrained), "--setting", setting, *transfer,
            "--config", str(configs / f"unisrec-{name}.toml"), "--set", "model.freeze_encoder=false", *common]


def plan(args: argparse.Namespace) -> list[tuple[str, float, int]]:
    out = []
    for fraction in args.fractions:
        seeds = args.seeds if fraction <= SMALL else args.seeds[:1]
        out += [(m, fraction, s) for m in args.methods for s in seeds]
    return out


def cmd_run(args: argparse.Namespace) -> None:
    data = prepared(args.target)
    if args.pretrained and len(args.pretrained) > 1:
        raise SystemExit("run takes one --pretrained run")
    pretrained = Path(args.pretrained[0]) if args.pretrained else None
    if pretrained is not None:  # the zero-shot run: no training, one for every fraction
        out = WORK / "runs" / "data-efficiency" / args.target / pretrained.name / "zero-shot"
        if not (out / "results.json").is_file():
            execute([SEQREC, "finetune", str(data.path), "--from", str(pretrained), "--setting", "zero-shot",
                     "--out", str(out)], out)
    todo = [(m, f, s) for m, f, s in plan(args)
            if not (run_dir(args.target, m, f, s, pretrained, args.tag) / "results.json").is_file()]
    print(f"{len(todo)} runs to do", flush=True)

    def one(item: tuple[str, float, int]) -> None:
        method, fraction, seed = item
        out = run_dir(args.target, method, fraction, seed, pretrained, args.tag)
        execute(command(method, data.path, args.target, fraction, seed, pretrained, out, args.set), out)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, todo))


def execute(argv: list[str], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log = out.parent / f"{out.name}.log"
    with log.open("w") as fh:
        done = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, check=False,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    (out.parent / f"{out.name}.cmd").write_text(shlex.join(argv) + "\n")
    status = "ok" if done.returncode == 0 else f"FAILED ({done.returncode}), see {log}"
    print(f"{out.name}: {status} in {time.perf_counter() - t0:.0f}s", flush=True)


def popularity(data: PreparedDataset, fraction: float, seed: int, k: int = 10) -> dict[str, float]:
    """Items ranked by their training-event count among the sampled users; ties count against the target."""
    view = data.with_training_users(fraction, seed)
    counts = train_item_counts(view).astype(np.float64)
    counts[0] = -np.inf
    out = {}
    for split in ("valid", "test"):
        users, pos = view.eval_positions(split)
        targets = view.items[view.offsets[users] + pos]
        higher = np.searchsorted(np.sort(counts[1:]), counts[targets], side="left")  # items strictly below
        rank = view.n_items - higher - 1  # items scoring >= the target, other than itself
        hit = rank < k
        out[f"{split}_recall@{k}"] = float(hit.mean())
        out[f"{split}_ndcg@{k}"] = float(np.where(hit, 1 / np.log2(rank + 2), 0).mean())
    return out


def cmd_report(args: argparse.Namespace) -> None:
    data = prepared(args.target)
    root = WORK / "runs" / "data-efficiency" / args.target
    rows: list[dict[str, Any]] = []
    for results_file in sorted([*root.glob("*/results.json"), *root.glob("*/*/results.json")]):
        name, folder = results_file.parent.name, results_file.parent.parent
        res = json.loads(results_file.read_text())
        cmd = (folder / f"{name}.cmd").read_text().strip() if (folder / f"{name}.cmd").is_file() else ""
        if name == "zero-shot":
            method, fraction, seed = "zero-shot", 0.0, 0
        else:
            method, f, s = name.rsplit("-", 2)
            fraction, seed = float(f[1:]), int(s[1:])
        if folder != root:  # from a pre-trained model: labelled with its name
            method = f"{method} ({folder.name})"
        rows.append({"method": method, "fraction": fraction, "seed": seed,
                     "valid_ndcg@10": res["valid"]["ndcg@10"], **{f"test_{m}": res["test"][m] for m in
                                                                  ("recall@10", "ndcg@10", "recall@50", "ndcg@50")},
                     "best_epoch": res["checkpoint"]["epoch"], "epochs_run": res["epochs_run"],
                     "train_seconds": res["train_seconds"], "command": cmd,
                     # the fine-tuned weight of the pre-trained / fine-tuned mix kept (1: none), where one was tried
                     **({"interpolation": res["interpolation"]} if "interpolation" in res else {}),
                     "cpu_model": cpu_model()})  # run folders do not outlive a session: this machine ran it
    for fraction in FRACTIONS:
        for seed in (args.seeds if fraction <= SMALL else args.seeds[:1]):
            pop = popularity(data, fraction, seed)
            rows.append({"method": "popularity", "fraction": fraction, "seed": seed,
                         "valid_ndcg@10": pop["valid_ndcg@10"], "test_recall@10": pop["test_recall@10"],
                         "test_ndcg@10": pop["test_ndcg@10"], "command": "popularity() in this script"})
    untrained = untrained_unisrec(data, args.target)
    rows.append({"method": "untrained UniSRec", "fraction": 0.0, "seed": 0, **untrained,
                 "command": "untrained_unisrec() in this script"})
    out = RESULTS / f"data_efficiency_{args.target}.json"
    # runs of earlier sessions whose folders are gone (run folders are not kept) stay as they were measured
    before = json.loads(out.read_text()) if out.is_file() else {}
    found = {(r["method"], r["fraction"], r["seed"]) for r in rows}
    rows += [r for r in before.get("runs", []) if (r["method"], r["fraction"], r["seed"]) not in found]
    pretrained = {**before.get("pretraining", {}), **{p.name: pretraining(p) for p in map(Path, args.pretrained or [])}}
    summary = summarise(rows)
    write_result(out, {"target": args.target, "pretrained": sorted(pretrained), "machine": machine(),
                       "pretraining": pretrained,
                       "protocol": "leave-one-out, full ranking, seen items not filtered, chosen on validation "
                                   "NDCG@10, no refit; training events of a seeded fraction of users",
                       "budget_s": BUDGET_S, "summary": summary, "runs": rows})
    plot(summary, args.target, out.with_suffix(".png"))
    print(f"wrote {out}")


def untrained_unisrec(data: PreparedDataset, name: str) -> dict[str, float]:
    """A fresh UniSRec (the target's config, seed 0), never trained: it ranks by text similarity."""
    import torch

    from seqrec.config import load_toml, resolve
    from seqrec.eval.evaluate import evaluate
    from seqrec.models.unisrec import UniSRec

    cfg = resolve(load_toml(ROOT / "benchmarks" / "configs" / f"unisrec-{name}.toml"))
    torch.manual_seed(0)
    model = UniSRec.from_dataset(cfg.model, data, cfg.data.max_len).eval()  # type: ignore[arg-type]
    out = {}
    for split in ("valid", "test"):
        metrics = evaluate(model, data, split, cfg.data.max_len, cfg.eval, torch.device("cpu"))
        for m in ("recall@10", "ndcg@10", "recall@50", "ndcg@50"):
            out[f"{split}_{m}"] = metrics[m]
    return out


def pretraining(run: Path) -> dict[str, Any]:
    """The pre-trained model's data card (domains, counts, encoder, recipe) and its throughput and memory."""
    results = json.loads((run / "results.json").read_text())
    card = json.loads((run / "data_card.json").read_text())
    keep = ("steps", "epochs_run", "train_seconds", "sequences_per_s", "targets_per_s", "final_loss",
            "peak_rss_mb", "n_parameters")
    model = json.loads((run / "config.json").read_text())["model"]
    return {"run": str(run), "data_card": card, **{k: results.get(k) for k in keep},
            "text_centre": bool(model.get("text_centre")), "history_bias": model.get("history_bias") is True,
            "whitening_init": bool(model.get("whitening_init")), "d": model.get("d")}


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median and range of test NDCG@10 over seeds, per (method, fraction)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["fraction"]), []).append(r)
    out = []
    for (method, fraction), rs in sorted(groups.items()):
        vals = [r["test_ndcg@10"] for r in rs]
        out.append({"method": method, "fraction": fraction, "seeds": len(rs),
                    "test_ndcg@10_median": statistics.median(vals), "test_ndcg@10_min": min(vals),
                    "test_ndcg@10_max": max(vals),
                    "test_recall@10_median": statistics.median(r["test_recall@10"] for r in rs),
                    "valid_ndcg@10_median": statistics.median(r["valid_ndcg@10"] for r in rs)})
    return out


def family(method: str) -> str:
    """popularity, sasrec, unisrec-scratch or pre-trained: what a variant (-hist, -p50, (model)) is of."""
    return "pre-trained" if method.startswith("pt-") else method.split("-hist")[0].split("-p")[0].split("-b")[0]


def envelope(summary: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per family, at each fraction, the variant validation picks (highest median validation NDCG@10
    among those run with the most seeds there): one line per family keeps the plot readable, and each
    point is a model chosen the way the protocol chooses (the table has every variant)."""
    out: dict[str, list[dict[str, Any]]] = {}
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for s in summary:
        if s["fraction"] > 0:
            groups.setdefault((family(s["method"]), s["fraction"]), []).append(s)
    for (fam, _fraction), rows in sorted(groups.items(), key=lambda kv: kv[0][1]):
        most = max(r["seeds"] for r in rows)
        out.setdefault(fam, []).append(max((r for r in rows if r["seeds"] == most),
                                           key=lambda r: r.get("valid_ndcg@10_median", 0.0)))
    return out


def plot(summary: list[dict[str, Any]], target: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels = {"popularity": "popularity", "sasrec": "SASRec from scratch", "unisrec-scratch": "UniSRec from scratch",
              "pre-trained": "UniSRec pre-trained, fine-tuned"}
    for fam, pts in envelope(summary).items():
        x = [p["fraction"] for p in pts]
        y = [p["test_ndcg@10_median"] for p in pts]
        err = [[p["test_ndcg@10_median"] - p["test_ndcg@10_min"] for p in pts],
               [p["test_ndcg@10_max"] - p["test_ndcg@10_median"] for p in pts]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=labels.get(fam, fam))
    zeros = [s for s in summary if s["fraction"] == 0]
    shot = [s for s in zeros if s["method"].startswith("zero-shot")]
    picked = [s for s in zeros if not s["method"].startswith("zero-shot")]
    picked += [max(shot, key=lambda s: s.get("valid_ndcg@10_median", 0))] if shot else []
    for z, style in zip(picked, ("--", ":", "-."), strict=False):
        ax.axhline(z["test_ndcg@10_median"], color="k", linestyle=style, label=f"{z['method']}: no target data")
    ax.set_xscale("log")
    ax.set_xlabel("fraction of the target's training users")
    ax.set_ylabel("test NDCG@10 (median over seeds)")
    ax.set_title(f"data efficiency on {target}: each point the validation-picked variant")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["run", "report"])
    p.add_argument("--target", default="amazon-scientific-unisrec")
    p.add_argument("--pretrained", nargs="*", help="`seqrec pretrain` runs that never saw the target (run: one; "
                   "report: every one whose runs it lists)")
    p.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS,
                   help="none (a bare --methods) with --pretrained: the zero-shot run alone")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (each on one thread)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a variant's overrides (give it a --tag)")
    p.add_argument("--tag", default="", help="suffix of a variant's method name, e.g. -lr1e-4")
    args = p.parse_args()
    if args.set and not args.tag:
        raise SystemExit("a variant (--set) needs a --tag, so that its runs are not mistaken for the recipe's")
    if args.action == "run":
        cmd_run(args)
    else:
        cmd_report(args)


if __name__ == "__main__":
    main()
