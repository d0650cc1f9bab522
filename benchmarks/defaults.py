"""Defaults that work: `seqrec train --dataset D --model M` with no config, next to the best
validation-picked row of the results on the same data and model.

Each run is the command a new user types (only the progress bar off, a thread count and a time
cap, which the result records); its `auto` decisions are recorded with their reasons. The best
row is the one with the highest validation NDCG@10 among every run of that model on that dataset
in benchmarks/results/*.json (seen items never filtered; partial-data runs included, as they
are runs of the model on the data, and UniSRec's pre-trained and fine-tuned ones). The goal: the
default reaches 95% of that row's test NDCG@10.
results/defaults_previous.json keeps the same runs made before each model had training defaults of
its own (seqrec.config.with_model_train_defaults): the evidence for them, shown beside each row.

    python benchmarks/defaults.py [--datasets ml-100k ...] [--models sasrec ...] [--budget 900]
    python benchmarks/defaults.py --report-only     # re-read the runs, rewrite the file
    python benchmarks/defaults.py --out B.json ...  # a second process beside the first
    python benchmarks/defaults.py --report-only --include B.json   # then join its runs in
    python benchmarks/defaults.py --candidate NAME --models sasrec --datasets ... --set model.n_heads=2

A candidate is a change to the defaults tried before it is made: the same runs (the same time cap
and threads as each default run) with `--set` overrides, written to results/defaults_candidate_NAME.json
beside the default each one would replace, compared on validation NDCG@10 (how a default is chosen)
and on test.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from common import RESULTS, WORK, command_sets, machine, train_run, write_result

DATASETS = ("ml-100k", "amazon-scientific-unisrec", "amazon-beauty-p5")
MODELS = ("sasrec", "gru4rec", "bert4rec", "unisrec")
OUT = RESULTS / "defaults.json"
# the same runs with the defaults before each model had training defaults of its own (no refit, plain
# Adam): the evidence that chose the new ones, kept as it was measured
PREVIOUS = RESULTS / "defaults_previous.json"
GOAL = 0.95


# files whose runs do not name their dataset or model
FILE_HINTS = {"speed_vs_recbole.json": ("ml-100k", "sasrec")}


def _dataset_of(r: dict[str, Any], hint: str | None = None) -> str | None:
    for where in (r, r.get("protocol") or {}):
        if isinstance(where.get("dataset"), str):
            return Path(where["dataset"]).name
    config = r.get("config")
    data = config.get("data") if isinstance(config, dict) else None
    return Path(data["dataset"]).name if isinstance(data, dict) and isinstance(data.get("dataset"), str) else hint


def _model_of(r: dict[str, Any], hint: str | None) -> str | None:
    if isinstance(r.get("model"), str):
        return str(r["model"])
    config = r.get("config")
    model = config.get("model") if isinstance(config, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    return name if isinstance(name, str) else hint


def _valid_ndcg(r: dict[str, Any]) -> float | None:
    v = r.get("valid")
    value = v.get("ndcg@10") if isinstance(v, dict) else r.get("valid_ndcg@10", r.get("best_valid_ndcg@10"))
    return float(value) if isinstance(value, (int, float)) else None


def rows(obj: Any, path: str, hint: str | None) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every run-like entry (test and validation NDCG@10) anywhere in a results file."""
    if isinstance(obj, dict):
        if isinstance(obj.get("test"), dict) and "ndcg@10" in obj["test"] and _valid_ndcg(obj) is not None:
            yield path, obj
            return
        for k, v in obj.items():
            yield from rows(v, f"{path}/{k}", hint)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from rows(v, f"{path}/{i}", hint)


def efficiency_rows(d: dict[str, Any], name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The runs of a data-efficiency file (flat records, one per method, fraction and seed) as run-like
    entries of their model on the file's target: SASRec, and UniSRec from scratch or pre-trained."""
    for i, r in enumerate(d.get("runs") or []):
        method = str(r.get("method", ""))
        model = "sasrec" if method.startswith("sasrec") else (
            "unisrec" if method.startswith(("unisrec", "pt-")) else None)
        if model is None or not isinstance(r.get("valid_ndcg@10"), (int, float)) or "test_ndcg@10" not in r:
            continue
        test = {k.removeprefix("test_"): v for k, v in r.items() if k.startswith("test_")}
        where = f"{name}/runs/{i} ({method}, {r['fraction']:.0%} of users, seed {r['seed']})"
        yield where, {"dataset": d["target"], "model": model, "valid_ndcg@10": r["valid_ndcg@10"], "test": test}


def best_rows(folder: Path = RESULTS) -> dict[tuple[str, str], dict[str, Any]]:
    """(dataset, model) -> the best-validated run in the results files (not this script's, not a GPU's)."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for f in sorted(folder.glob("*.json")):
        if f.name.startswith(("defaults", "cuda_check")) or f.name.endswith("_tiny.json"):  # defaults*: its own
            continue
        hint = "unisrec" if f.name.startswith(("unisrec", "data_efficiency", "transfer_probe")) else (
            "sasrec" if f.name.startswith("sasrec_quality") else None)
        data_hint, hint = FILE_HINTS.get(f.name, (None, hint))
        d = json.loads(f.read_text())
        found = efficiency_rows(d, f.name) if f.name.startswith("data_efficiency") else rows(d, f.name, hint)
        for path, r in found:
            dataset, model = _dataset_of(r, data_hint), _model_of(r, hint)
            peer = path.split("/")[-1].startswith("recbole")  # a peer library's run, not seqrec's
            if dataset is None or model is None or peer or (r.get("protocol") or {}).get("filter_seen"):
                continue
            valid = _valid_ndcg(r)
            key = (dataset, model)
            if valid is not None and (key not in best or valid > best[key]["valid_ndcg@10"]):
                best[key] = {"valid_ndcg@10": valid, "test": r["test"], "from": path}
    return best


def run_default(dataset: str, model: str, budget: float, threads: int, extra: Sequence[str] = (),
                folder: str = "defaults") -> dict[str, Any]:
    sets = ["train.progress=false", f"train.threads={threads}", f"train.time_budget_s={budget}", *extra]
    res = train_run(WORK / "runs" / folder, f"{dataset}-{model}", dataset, None, sets, model=model)
    return with_run_folder(res)


def candidate(args: argparse.Namespace) -> None:
    """Run a candidate change of the defaults next to the default runs it would replace (each with that
    run's time cap where it ran on this kind of device, else `--budget`) and write the comparison to
    `--out` (a second process beside the first writes its own; `--report-only --include` joins them)."""
    name, sets = args.candidate, args.sets
    defaults = json.loads(OUT.read_text())["runs"] if OUT.is_file() else {}
    out = args.out if args.out != OUT else RESULTS / f"defaults_candidate_{name}.json"
    before = json.loads(out.read_text()) if out.is_file() else {}
    runs: dict[str, Any] = before.get("runs", {})
    for other in args.include:
        runs.update(json.loads(other.read_text())["runs"])
    for key, r in runs.items():  # the default each run replaces, kept once the candidate became the default
        if "replaces" not in r and key in defaults and defaults[key].get("command") != r.get("command"):
            r["replaces"] = defaults[key]
    for dataset in args.datasets if not args.report_only else ():
        for model in args.models:
            base = defaults.get(f"{dataset}/{model}", {})
            cap = command_sets(str(base.get("command", ""))).get("train.time_budget_s")
            same_device = base.get("device") == "cpu"  # a GPU's default ran under a GPU's cap
            r = run_default(dataset, model, float(cap) if cap and same_device else args.budget, args.threads, sets,
                            folder=f"defaults-{name}")
            runs[f"{dataset}/{model}"] = {**r, "replaces": base}
            print(f"{dataset} {model} {name}: " + (f"valid N@10 {r['valid']['ndcg@10']:.4f} test "
                  f"{r['test']['ndcg@10']:.4f}" if "test" in r else r.get("error", "")[-300:]), flush=True)
            write_result(out, candidate_report(name, sets, runs))
    write_result(out, candidate_report(name, sets, runs))
    print(f"-> {out}")


def candidate_report(name: str, sets: list[str], runs: dict[str, Any]) -> dict[str, Any]:
    table = []
    for key, r in runs.items():
        base = r.get("replaces") or {}
        row: dict[str, Any] = {"dataset": key.split("/")[0], "model": key.split("/")[1]}
        for label, run in (("default", base), ("candidate", r)):
            if "test" in run:
                row[label] = {"valid_ndcg@10": run["valid"]["ndcg@10"], "test_ndcg@10": run["test"]["ndcg@10"],
                              "device": run.get("device"), "stopped_by_cap": run.get("stopped_by_cap")}
        if "default" in row and "candidate" in row:
            row["valid_ratio"] = row["candidate"]["valid_ndcg@10"] / row["default"]["valid_ndcg@10"]
            row["test_ratio"] = row["candidate"]["test_ndcg@10"] / row["default"]["test_ndcg@10"]
        table.append(row)
    return {"candidate": name, "sets": sets, "rows": table, "runs": runs, "machine": machine(),
            "command": " ".join(["python", *sys.argv])}


def with_run_folder(res: dict[str, Any]) -> dict[str, Any]:
    """What the run folder adds to a run's record (its auto decisions, whether the cap stopped it, the
    training defaults it had), kept in the results file since run folders are not."""
    run = Path(res.get("run", ""))
    if (run / "results.json").is_file():
        res["auto"] = json.loads((run / "results.json").read_text()).get("auto", [])
    cap = stopped_by_cap(res)
    if cap is not None or "stopped_by_cap" not in res:
        res["stopped_by_cap"] = cap
    if (run / "config.json").is_file():  # seqrec.config.with_model_train_defaults
        train = json.loads((run / "config.json").read_text())["train"]
        res["train_defaults"] = {k: train[k] for k in ("optimizer", "weight_decay", "ema", "refit")}
    return res


def _folder_holds(r: dict[str, Any]) -> bool:
    """Whether the run folder still holds this record's run (not a later run into the same folder)."""
    results = Path(r.get("run", "")) / "results.json"
    return "test" in r and results.is_file() and json.loads(results.read_text())["test"] == r["test"]


def stopped_by_cap(r: dict[str, Any]) -> bool | None:
    """Whether a run's training epochs passed the cap its saved config holds (None: unknown). The loop
    stops after the epoch whose elapsed time passes the cap; a refit afterwards is not counted."""
    run = Path(r.get("run", ""))
    if not (run / "config.json").is_file() or not (run / "metrics.jsonl").is_file():
        return None
    cap = float(json.loads((run / "config.json").read_text())["train"].get("time_budget_s", 0))
    epochs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return cap > 0 and max((e.get("elapsed_s", 0.0) for e in epochs), default=0.0) > cap


def report(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    best = best_rows()
    before = json.loads(PREVIOUS.read_text())["runs"] if PREVIOUS.is_file() else {}
    table = []
    for key, r in runs.items():
        dataset, model = key.split("/")
        b = best.get((dataset, model))
        row: dict[str, Any] = {"dataset": dataset, "model": model, "default": r,
                               "stopped_by_cap": r.get("stopped_by_cap", stopped_by_cap(r))}
        if "train_defaults" in r and "test" in before.get(key, {}):
            row["previous_default"] = {"valid_ndcg@10": before[key]["valid"]["ndcg@10"],
                                       "test_ndcg@10": before[key]["test"]["ndcg@10"]}
        if b is not None and "test" in r:
            row["best"] = b
            row["ratio"] = r["test"]["ndcg@10"] / b["test"]["ndcg@10"]
            row["meets_goal"] = row["ratio"] >= GOAL
        table.append(row)
    return {"goal": f"default test NDCG@10 >= {GOAL:.0%} of the best-validated row's", "rows": table,
            "machine": machine(), "command": " ".join(["python", *sys.argv])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", default=list(DATASETS))
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--budget", type=float, default=900.0, help="training time cap per run, seconds")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--out", type=Path, default=OUT, help="results file (runs side by side write one each)")
    p.add_argument("--include", type=Path, nargs="*", default=[], help="add the runs of these results files")
    p.add_argument("--candidate", help="try a change of the defaults under this name (with --set)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a candidate's override (repeatable)")
    args = p.parse_args()
    if args.candidate:
        if not args.sets:
            p.error("--candidate needs at least one --set")
        candidate(args)
        return
    out = args.out
    before = json.loads(out.read_text()) if out.is_file() else {}
    runs = before.get("runs", {})
    for row in before.get("rows", []):  # files written before runs kept it themselves
        runs.get(f"{row['dataset']}/{row['model']}", {}).setdefault("stopped_by_cap", row.get("stopped_by_cap"))
    for other in args.include:  # each run keeps the machine it ran on (another machine's file: a GPU, say)
        joined = json.loads(other.read_text())
        runs.update({k: {"machine": joined.get("machine"), **{a: b for a, b in r.items() if a != "replaces"}}
                     for k, r in joined["runs"].items()})  # a candidate's runs, less the defaults they replace
    runs = {k: r if "train_defaults" in r or not _folder_holds(r) else with_run_folder(r) for k, r in runs.items()}
    if not args.report_only:
        for dataset in args.datasets:
            for model in args.models:
                runs[f"{dataset}/{model}"] = r = run_default(dataset, model, args.budget, args.threads)
                print(f"{dataset} {model}: " + (f"test N@10 {r['test']['ndcg@10']:.4f}" if "test" in r
                                                else r.get("error", "")[-300:]), flush=True)
                write_result(out, {**report(runs), "runs": runs})
    write_result(out, {**report(runs), "runs": runs})
    print(f"-> {out}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
