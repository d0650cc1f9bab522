"""`seqrec tune` against the hand-made recipe: a time-boxed validation-only search on a dataset,
then the best settings trained and tested once, next to the recipe's own run.

    python benchmarks/tune_vs_recipe.py --dataset amazon-scientific-unisrec --budget 1800

The study starts from SASRec's defaults, as `seqrec tune --model sasrec` does for a user without a
recipe (`--base recipe`: from benchmarks/configs/sasrec-<dataset>.toml, its refit kept for the final
run), and searches the SASRec space of `seqrec.train.tune`; its first trial is the base itself. The
recipe rows are the hand-made runs of results/sasrec_quality*.json that validation picked, without
and with the history bias; `--seeds 43 44` trains the tuned settings and the recipe + history bias
again at more seeds (with --report-only, after the study). Writes
results/tune_<dataset>_from-defaults.json (from the recipe: results/tune_<dataset>.json).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, WORK, fresh_run, machine, prepared, write_result

from seqrec.train.tune import MIN_TRIALS
from seqrec.train.tune_space import SPACES


def recipe_row(dataset: str, history_bias: bool) -> dict:
    """The picked hand-made SASRec run on `dataset` (best validation NDCG@10), with or without the bias."""
    runs = {}
    for path in RESULTS.glob("sasrec_quality*.json"):
        runs.update(json.loads(path.read_text()))
    mine = {k: r for k, r in runs.items() if isinstance(r, dict) and r.get("dataset") == dataset
            and bool(r.get("config", {}).get("model", {}).get("history_bias")) == history_bias}
    key = max(mine, key=lambda k: mine[k]["valid"]["ndcg@10"])
    return {"run": key, "valid": mine[key]["valid"], "test": mine[key]["test"], "config": mine[key]["config"]}


def _seed_run(job: tuple[str, str, dict[str, Any], bool, int]) -> tuple[str, int, dict[str, Any]]:
    """One run of `seed_runs`, in its own process (a seed means the same draws whatever runs beside it)."""
    from seqrec.config import resolve
    from seqrec.train.loop import fit

    dataset, who, raw, saved, seed = job
    data = prepared(dataset)
    cfg = resolve(raw, [f'data.dataset="{data.path}"', f"train.seed={seed}", "train.threads=1",
                        "train.progress=false"], model_defaults=not saved)
    results = fit(cfg, data, fresh_run(WORK / "runs" / f"tune-seeds-{dataset}" / f"{who}-s{seed}"))
    return who, seed, {"valid_ndcg@10": results["valid"]["ndcg@10"], "test_ndcg@10": results["test"]["ndcg@10"]}


def seed_runs(dataset: str, tuned: dict[str, Any], recipe: dict[str, Any], seeds: list[int], jobs: int
              ) -> dict[str, Any]:
    """The tuned settings and the recipe (with the history bias; a saved, complete config) trained again
    at other seeds, with refit, one thread each: whether the gap between them outlasts the seed."""
    todo = [(dataset, who, raw, who == "recipe_history_bias", seed) for seed in seeds
            for who, raw in (("tuned", tuned), ("recipe_history_bias", recipe))]
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(_seed_run, todo))
    return {who: {str(seed): row for w, seed, row in done if w == who} for who in ("tuned", "recipe_history_bias")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="amazon-scientific-unisrec")
    p.add_argument("--budget", type=float, default=1800)
    p.add_argument("--base", choices=("defaults", "recipe"), default="defaults",
                   help="what the study starts from: SASRec's defaults, or the dataset's recipe config")
    p.add_argument("--threads", type=int, default=2, help="torch threads of each trial")
    p.add_argument("--jobs", type=int, default=1, help="trials at a time")
    p.add_argument("--min-trials", type=int, default=MIN_TRIALS,
                   help="no trial trains longer than budget x jobs / this (seqrec tune --min-trials)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="more base-config overrides (e.g. train.time_budget_s=900 for the final run)")
    p.add_argument("--report-only", action="store_true", help="write the results file from a finished study")
    p.add_argument("--seeds", type=int, nargs="*", default=[],
                   help="train the tuned settings and the recipe + history bias again at these seeds too "
                        "(with --report-only: add them to the results file)")
    p.add_argument("--study", default="", metavar="NAME",
                   help="a study of its own (another search space, say): folder tune-<dataset>..._NAME, results "
                        "file tune_<dataset>..._NAME.json")
    args = p.parse_args()
    data = prepared(args.dataset)
    suffix = ("" if args.base == "recipe" else "_from-defaults") + (f"_{args.study}" if args.study else "")
    out = WORK / "runs" / f"tune-{args.dataset}{suffix}"
    result = RESULTS / f"tune_{args.dataset}{suffix}.json"
    config = ROOT / "benchmarks" / "configs" / f"sasrec-{args.dataset}.toml"
    start = ["--config", str(config)] if args.base == "recipe" else ["--model", "sasrec"]
    argv = [str(ROOT / ".venv" / "bin" / "seqrec"), "tune", "--dataset", str(data.path), *start,
            "--budget", str(args.budget), "--jobs", str(args.jobs), "--min-trials", str(args.min_trials),
            "--set", f"train.threads={args.threads}", "--out", str(out)]
    for override in args.set:
        argv += ["--set", override]
    t0 = time.perf_counter()
    if not args.report_only:
        subprocess.run(argv, check=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    report = json.loads((out / "trials.json").read_text())
    recipe_bias = recipe_row(args.dataset, True)
    before = json.loads(result.read_text()) if result.is_file() else {}
    seeds = before.get("seeds", {}) if args.report_only else {}
    if args.seeds:
        more = seed_runs(args.dataset, report["best_run"]["config"], recipe_bias["config"], args.seeds, args.jobs)
        seeds = {who: {**seeds.get(who, {}), **rows} for who, rows in more.items()}
        named = f"--study {args.study} " if args.study else ""
        seeds["command"] = (f"python benchmarks/tune_vs_recipe.py --dataset {args.dataset} --base {args.base} "
                            f"{named}--report-only --jobs {args.jobs} --seeds {' '.join(map(str, args.seeds))}")
    study = {
        "dataset": args.dataset, "machine": machine(), "study": args.study,
        "space": sorted(SPACES["sasrec"]()), "budget_s": args.budget, "base": args.base,
        "wall_s": time.perf_counter() - t0, "threads_per_trial": args.threads, "jobs": args.jobs,
        "min_trials": args.min_trials,  # each trial capped at budget x jobs / min_trials
        "command": f"python benchmarks/tune_vs_recipe.py --dataset {args.dataset} --base {args.base} "
                   + (f"--study {args.study} " if args.study else "")
                   + f"--budget {args.budget:g} --threads {args.threads} --jobs {args.jobs} "
                   f"--min-trials {args.min_trials}" + "".join(f" --set {o}" for o in args.set)}
    if args.report_only:  # the study as it ran, not as these arguments describe it
        study.update({k: before[k] for k in study if k in before})
    write_result(result, {
        **study,
        "base_point": report.get("base_point"),  # trial 0 trained the base's own settings
        "base_trial": next((t for t in report["trials"] if t["number"] == 0), None),
        "tune": {k: report[k] for k in ("n_trials", "best_trial", "best_run")},
        "states": dict(sorted(Counter(t["state"] for t in report["trials"]).items())),
        "recipe": recipe_row(args.dataset, False), "recipe_history_bias": recipe_bias,
        **({"seeds": seeds} if seeds else {})})


if __name__ == "__main__":
    main()
