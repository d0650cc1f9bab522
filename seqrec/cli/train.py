"""`seqrec train` (and `train --resume`), `seqrec evaluate`, `seqrec tune` and `seqrec compare`."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from seqrec.cli.common import (
    check_model_flag,
    dataset_ref,
    print_metrics,
    resolve_dataset,
    run_config,
    run_folder,
    run_progress,
)
from seqrec.errors import SeqrecError, not_a_run


def cmd_train(args: argparse.Namespace) -> int:
    from seqrec.config import load_toml, resolve
    from seqrec.data.dataset import PreparedDataset
    from seqrec.train.loop import fit

    if args.resume:
        return resume_train(Path(args.resume), args)
    raw = load_toml(Path(args.config)) if args.config else {}
    check_model_flag(raw, args.model, args.config)
    overrides = list(args.set or [])
    if args.dataset:
        overrides.insert(0, f'data.dataset="{args.dataset}"')
    if args.model:
        overrides.insert(0, f'model.name="{args.model}"')
    cfg = resolve(raw, overrides)
    if not cfg.data.dataset:
        raise SeqrecError("no dataset: give --dataset or data.dataset in the config")
    found = resolve_dataset(cfg.data.dataset)
    cfg.data.dataset = dataset_ref(cfg.data.dataset, found)
    data = PreparedDataset.load(found)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.out) if args.out else Path("runs") / f"{data.meta['name']}-{cfg.model.name}-{stamp}"
    init = Path(args.init_items_from) if args.init_items_from else None
    with run_folder(run_dir, args.overwrite):
        report_run(run_dir, fit(cfg, data, run_dir, init_items_from=init))
    return 0


def report_run(run_dir: Path, results: dict[str, Any]) -> None:
    import torch.distributed as dist

    if dist.is_initialized():  # under torchrun: every rank is done; rank 0 alone has results
        dist.destroy_process_group()
    if "checkpoint" not in results:
        return
    print(f"run: {run_dir}  (best epoch {results['checkpoint']['epoch']}, {results['train_seconds']:.0f}s)")
    print_metrics(results)


def resume_train(run_dir: Path, args: argparse.Namespace) -> int:
    """`train --resume RUN`: go on from the run's last finished epoch, with the run's own config."""
    from seqrec.data.dataset import PreparedDataset
    from seqrec.train.loop import fit

    given = [flag for flag, value in (("--dataset", args.dataset), ("--model", args.model), ("--config", args.config),
                                      ("--set", args.set), ("--out", args.out), ("--overwrite", args.overwrite),
                                      ("--init-items-from", args.init_items_from)) if value]
    if given:
        raise SeqrecError(f"--resume continues a run with its own config: drop {', '.join(given)}")
    if not (run_dir / "config.json").is_file():
        raise not_a_run(run_dir, "config.json")
    progress = run_progress(run_dir)
    if progress == "finished":
        raise SeqrecError(f"{run_dir}: the run has finished (results.json is there); nothing to resume")
    if not progress.startswith("not finished"):
        raise SeqrecError(f"{run_dir}: {progress}")
    cfg = run_config(run_dir)
    data = PreparedDataset.load(resolve_dataset(cfg.data.dataset))
    report_run(run_dir, fit(cfg, data, run_dir, resume=True))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from seqrec.data.dataset import PreparedDataset
    from seqrec.eval.evaluate import protocol
    from seqrec.train.checkpoint import load_checkpoint
    from seqrec.train.device import pick_device

    run = Path(args.run)
    if not (run / "config.json").is_file():
        raise not_a_run(run, "config.json")
    from seqrec.train.transfer import is_pretrain_run

    if is_pretrain_run(run):
        return evaluate_zero_shot(run, args)
    overrides = [f"eval.filter_seen={'true' if args.filter_seen else 'false'}"] if args.filter_seen is not None else []
    cfg = run_config(run, overrides)
    data = PreparedDataset.load(resolve_dataset(args.dataset or cfg.data.dataset))
    device = pick_device(cfg.train.device)
    results: dict[str, Any] = {"protocol": protocol(data, cfg.eval, "test", cfg.data.max_len)}
    progress = run_progress(run)
    names = {split: "checkpoint-selected" if split == "valid" and cfg.train.refit else "checkpoint"
             for split in ("valid", "test")}  # a refitted run tests the refit, validates the model it refitted
    if progress != "finished":  # the validation-chosen model so far (a refit not begun, or cut short)
        name = next((n for n in ("checkpoint-selected", "checkpoint") if (run / n / "model.json").is_file()), None)
        if name is None:
            raise SeqrecError(f"{run}: {progress}")
        names = {"valid": name, "test": name}
        print(f"(unfinished run: {progress.removeprefix('not finished: ')}; the metrics of the model validation "
              "chose so far)")
    loaded = {name: load_checkpoint(run / name, device) for name in dict.fromkeys(names.values())}
    for _, meta in loaded.values():  # every checkpoint checked before any work
        if meta.get("dataset_fingerprint") not in (None, data.fingerprint):
            raise SeqrecError(f"{run}: trained on {Path(cfg.data.dataset).name} (dataset fingerprint "
                              f"{meta['dataset_fingerprint']}), but {data.meta['name']} ({data.path}) has "
                              f"{data.fingerprint}: a trained run is evaluated on the data it learnt (prepared "
                              "again the same way); on another catalogue, evaluate a pre-training run zero-shot "
                              "(seqrec evaluate PRETRAIN_RUN --dataset NAME)")
    for split, name in names.items():
        model = loaded[name][0]
        results |= evaluate_split(model, data, split, cfg, device, args.cold)
        results["protocol"]["history_bias"] = model.history is not None
    results["protocol"]["refit"] = names["test"] != names["valid"]
    print_metrics(results)
    return 0


def evaluate_split(model: Any, data: Any, split: str, cfg: Any, device: Any, cold: bool) -> dict[str, Any]:
    """The rows of one split: its metrics, and with `cold` those of its cold targets (items in no training
    event) and warm ones, ranked once."""
    from seqrec.eval.cold import evaluate_cold_warm
    from seqrec.eval.evaluate import evaluate

    if not cold:
        return {split: evaluate(model, data, split, cfg.data.max_len, cfg.eval, device)}
    out = evaluate_cold_warm(model, data, split, cfg.data.max_len, cfg.eval, device)
    return {split: out["all"], f"{split} cold": out["cold"], f"{split} warm": out["warm"]}


def evaluate_zero_shot(run: Path, args: argparse.Namespace) -> int:
    """A pre-trained text model on a dataset it never trained on, through that dataset's item text alone."""
    from seqrec.data.dataset import PreparedDataset
    from seqrec.eval.evaluate import protocol
    from seqrec.train.device import pick_device
    from seqrec.train.transfer import check_unseen, finetune_model, zero_shot_config

    if not args.dataset:
        raise SeqrecError(f"{run} is a pre-training run: name the dataset to evaluate it on with --dataset")
    cfg = zero_shot_config(run)
    if args.filter_seen is not None:
        cfg.eval.filter_seen = args.filter_seen
    data = PreparedDataset.load(resolve_dataset(args.dataset))
    check_unseen(run, data)
    device = pick_device(cfg.train.device)
    model = finetune_model(run, data, cfg.model, cfg.data.max_len, trained=False).to(device).eval()
    results: dict[str, Any] = {"protocol": {**protocol(data, cfg.eval, "test", cfg.data.max_len, model),
                                            "model_selection": "none: zero-shot from " + str(run)}}
    for split in ("valid", "test"):
        results |= evaluate_split(model, data, split, cfg, device, args.cold)
    print(f"zero-shot: {run} on {data.meta['name']} ({data.path}), no training on it")
    print_metrics(results)
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from seqrec.config import load_toml
    from seqrec.data.dataset import PreparedDataset
    from seqrec.train.tune import base_config, tune

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise SeqrecError("seqrec tune runs in one process (its trials run side by side with --jobs), not under "
                          "torchrun; train the chosen settings under torchrun afterwards")
    data = PreparedDataset.load(resolve_dataset(args.dataset))
    check_model_flag(load_toml(Path(args.config)) if args.config else {}, args.model, args.config)
    base = base_config(Path(args.config) if args.config else None, args.model, str(data.path), list(args.set or []))
    jobs = None if args.jobs == "auto" else int(args.jobs) if args.jobs.isdigit() else 0
    if not args.budget > 0 or (args.trials is not None and args.trials < 1) or jobs == 0 or args.seed < 0:
        raise SeqrecError("--budget must be > 0 seconds, --trials >= 1, --jobs auto or >= 1, --seed >= 0; got --budget "
                          f"{args.budget:g}, --trials {args.trials}, --jobs {args.jobs}, --seed {args.seed}")
    if args.budget == float("inf") and args.trials is None:
        raise SeqrecError("--budget inf needs --trials (else the search never ends)")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    model = base.get("model", {}).get("name", "sasrec")
    run_dir = Path(args.out) if args.out else Path("runs") / f"tune-{data.meta['name']}-{model}-{stamp}"
    if run_dir.is_file() or (run_dir.is_dir() and any(run_dir.iterdir()) and not (run_dir / "study.db").is_file()):
        raise SeqrecError(f"--out {run_dir}: {'a file' if run_dir.is_file() else 'a folder that is not a study'} "
                          "is there (a study's folder holds study.db, and `seqrec tune` goes on with it); choose "
                          "another --out")
    shares = {} if args.min_trials is None else {"min_trials": args.min_trials}
    report = tune(base, data, run_dir, args.budget, args.trials, jobs=jobs, seed=args.seed, **shares)
    states: dict[str, int] = {}
    for t in report["trials"]:
        states[t["state"]] = states.get(t["state"], 0) + 1
    print(f"study: {report['study']}  ({report['n_trials']} trials: "
          + ", ".join(f"{n} {s}" for s, n in sorted(states.items())) + ")")
    best = report["best_trial"]
    print(f"best trial {best['number']}: validation ndcg@10 {best['valid_ndcg@10']:.4f}  {best['params']}")
    print(f"run: {report['best_run']['path']}  (the best settings trained again and tested once)")
    print_metrics(json.loads((Path(report["best_run"]["path"]) / "results.json").read_text()))
    return 0


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def cmd_compare(args: argparse.Namespace) -> int:
    import csv
    import sys

    from seqrec.eval.compare import LABEL_PARTS, compare_runs, differences, label

    groups, differ = compare_runs(args.runs)
    available = [m for m in groups[0].metrics if all(m in g.metrics for g in groups)]
    wanted = [m.strip() for m in args.metrics.split(",")] if args.metrics else \
        [m for m in ("valid ndcg@10", "test recall@10", "test ndcg@10") if m in available] or available[:3]
    unknown = [m for m in wanted if m not in available]
    if unknown:
        raise SeqrecError(f"--metrics: {', '.join(unknown)} not in every run; they hold {', '.join(available)}")
    rows: list[dict[str, Any]] = [
        {"group": label(g, differ), "runs": len(g.runs), "seeds": " ".join(map(str, g.seeds)),
         **{m: (round(g.mean(m), 6), _rounded(g.std(m))) for m in wanted}} for g in groups]
    if args.format == "json":
        print(json.dumps([{**r, "paths": g.runs, "differences": differences(g, differ)}
                          for r, g in zip(rows, groups, strict=True)], indent=2))
        return 0
    if args.format == "csv":
        out = csv.writer(sys.stdout)
        out.writerow(["group", "runs", "seeds", *(f"{m} {w}" for m in wanted for w in ("mean", "std"))])
        out.writerows([[r["group"], r["runs"], r["seeds"], *("" if v is None else v for m in wanted for v in r[m])]
                       for r in rows])
        return 0
    width = max(len(r["group"]) for r in rows)
    print(f"{'group':<{width}}  {'runs':>4}  " + "  ".join(f"{m:>20}" for m in wanted) + "  seeds")
    for r in rows:
        cells = "  ".join(f"{f'{r[m][0]:.4f} ± ' + ('–     ' if r[m][1] is None else f'{r[m][1]:.4f}'):>20}"
                          for m in wanted)
        print(f"{r['group']:<{width}}  {r['runs']:>4}  {cells}  {r['seeds']}")
    print("(mean ± sample standard deviation over each group's runs, – for a group of one run: the runs of a group "
          "differ only in train.seed" + ("; `--format json` lists every setting that sets a group apart)"
                                         if any(len(differences(g, differ)) > LABEL_PARTS for g in groups) else ")"))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register `train` and `evaluate` on the top-level subparsers."""
    t = sub.add_parser("train", help="train a model; writes a run folder")
    t.add_argument("--dataset", help="a prepared dataset: its name (under $SEQREC_HOME/prepared) or folder")
    t.add_argument("--model", help="item2vec, gru4rec, sasrec, bert4rec or unisrec (default: the config's, else "
                   "sasrec)")
    t.add_argument("--config", help="TOML file with [data] [model] [train] [eval]")
    t.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a config value")
    t.add_argument("--out", help="run folder (default runs/DATASET-MODEL-TIME); one that holds a run is refused")
    t.add_argument("--overwrite", action="store_true", help="replace the run --out holds (its folder removed first)")
    t.add_argument("--init-items-from", metavar="RUN",
                   help="initialise the item table from RUN's item vectors (e.g. an item2vec run)")
    t.add_argument("--resume", metavar="RUN",
                   help="go on with an interrupted run from its last finished epoch (exactly as if uninterrupted)")
    t.set_defaults(fn=cmd_train)
    e = sub.add_parser("evaluate", help="re-evaluate a saved run")
    e.add_argument("run")
    e.add_argument("--dataset", help="prepared dataset (default: the run's)")
    e.add_argument("--filter-seen", action=argparse.BooleanOptionalAction, default=None,
                   help="leave the user's earlier items out of the ranking (default: the run's eval.filter_seen)")
    e.add_argument("--cold", action="store_true", help="also the metrics of cold targets (items in no training "
                   "event: new items, as a `data cold-split` makes them) and of warm ones, apart")
    e.set_defaults(fn=cmd_evaluate)
    c = sub.add_parser("compare", help="runs side by side: mean and spread over seeds of each configuration",
                       description="Groups the runs whose configs differ only in train.seed (and whose protocols "
                                   "match) and prints each group's mean and sample standard deviation.")
    c.add_argument("runs", nargs="+", help="run folders (finished runs: config.json and results.json)")
    c.add_argument("--metrics", help='comma-separated, e.g. "valid ndcg@10,test ndcg@50" (default: valid ndcg@10, '
                                     "test recall@10, test ndcg@10)")
    c.add_argument("--format", choices=["table", "csv", "json"], default="table")
    c.set_defaults(fn=cmd_compare)
    tu = sub.add_parser("tune", help="search a model's settings on validation (Optuna), then train and test the best")
    tu.add_argument("--dataset", required=True)
    tu.add_argument("--model", help="sasrec, bert4rec, gru4rec or unisrec (default: the config's, else sasrec)")
    tu.add_argument("--config", help="base TOML config the search starts from")
    tu.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="base config overrides")
    tu.add_argument("--budget", type=float, default=1800.0, help="seconds of search (default 1800)")
    tu.add_argument("--trials", type=int, help="stop after this many trials (default: only the budget)")
    tu.add_argument("--jobs", default="auto",
                    help="trials at a time (give each train.threads its share); auto (the default): as many as the "
                         "cores hold at train.threads each, one when train.threads is torch's default")
    tu.add_argument("--min-trials", type=int,
                    help="no trial trains longer than budget x jobs / this, so that at least this many run (default 6)")
    tu.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    tu.add_argument("--out", help="study folder (default runs/tune-...); an existing one is resumed, given the "
                    "same model, dataset and base config")
    tu.set_defaults(fn=cmd_tune)
