"""The `seqrec` command. The only module that reads argv or owns console output."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqrec.cli_serve import add_commands as add_serve_commands
from seqrec.cli_unisrec import add_commands as add_unisrec_commands
from seqrec.errors import SeqrecError

if TYPE_CHECKING:
    from seqrec.data.types import RawDataset

log = logging.getLogger("seqrec")


def _home() -> Path:
    from seqrec.data.fetch import seqrec_home

    return seqrec_home()


def resolve_dataset(ref: str) -> Path:
    """A prepared-dataset folder, or a name under $SEQREC_HOME/prepared."""
    path = Path(ref)
    if (path / "meta.json").is_file():
        return path
    named = _home() / "prepared" / ref
    if (named / "meta.json").is_file():
        return named
    raise SeqrecError(f"no prepared dataset {ref!r} (looked in {path} and {named}); run `seqrec data prepare`")


def cmd_fetch(args: argparse.Namespace) -> int:
    from seqrec.data.fetch import fetch_ml100k

    if args.name != "ml-100k":
        raise SeqrecError(f"fetch knows only ml-100k; for {args.name!r} prepare it with --source DIR")
    result = fetch_ml100k(_home())
    print(f"ml-100k ready in {result.directory} (source: {result.source}, layout: {result.layout})")
    return 0


def _prepare_source(args: argparse.Namespace) -> tuple[RawDataset, dict[str, Any]]:
    from seqrec.data.catalog import KNOWN_DATASETS, load_format, load_known

    if args.format:
        if not args.path:
            raise SeqrecError("--format needs --path")
        options = {k: v for k, v in (("user_col", args.user_col), ("item_col", args.item_col),
                                     ("time_col", args.time_col), ("sep", args.sep),
                                     ("time_format", args.time_format)) if v is not None}
        raw = load_format(args.format, Path(args.path), **options)
        return raw, {}
    if args.name not in KNOWN_DATASETS:
        raise SeqrecError(f"unknown dataset {args.name!r}; known: {', '.join(sorted(KNOWN_DATASETS))} "
                          "(or give --format and --path)")
    source = Path(args.source) if args.source else _home() / "raw" / args.name
    if not source.exists():
        hint = "run `seqrec data fetch ml-100k`" if args.name == "ml-100k" else "give --source DIR"
        raise SeqrecError(f"source folder {source} does not exist; {hint}")
    return load_known(args.name, source), dict(KNOWN_DATASETS[args.name].prepare)


def cmd_prepare(args: argparse.Namespace) -> int:
    from seqrec.data.prepare import PrepareOptions, prepare

    t0 = time.perf_counter()
    raw, defaults = _prepare_source(args)
    keys = ("dedupe", "kcore", "min_user_len", "split", "test_frac", "valid_frac")
    for key in keys:
        if getattr(args, key) is not None:
            defaults[key] = getattr(args, key)
    options = PrepareOptions(**{k: v for k, v in defaults.items() if k in keys})
    name = args.name or Path(args.path).stem
    dest = Path(args.out) if args.out else _home() / "prepared" / name
    data = prepare(raw, options, dest)
    s = data.stats()
    print(f"prepared {name} -> {dest} in {time.perf_counter() - t0:.1f}s: "
          f"{s['users']} users, {s['items']} items, {s['interactions']} interactions")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from seqrec.data.dataset import PreparedDataset

    stats = PreparedDataset.load(resolve_dataset(args.dataset)).stats()
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"dataset       {stats['name']}  ({stats['split']}, fingerprint {stats['fingerprint']})")
    print(f"users         {stats['users']:,}  ({stats['valid_users']:,} with a validation target, "
          f"{stats['test_users']:,} with a test target)")
    print(f"items         {stats['items']:,}")
    print(f"interactions  {stats['interactions']:,}  (density {stats['density']:.5f})")
    lengths = "  ".join(f"{k} {v:g}" for k, v in stats["length_percentiles"].items())
    print(f"length        mean {stats['length_mean']:.2f}  {lengths}")
    return 0


def cmd_features(args: argparse.Namespace) -> int:
    from seqrec.data.dataset import PreparedDataset
    from seqrec.data.features import describe, infer_features

    data = PreparedDataset.load(resolve_dataset(args.dataset))
    print(f"# side features inferred from {data.meta['name']}; put the ones you want in the run config")
    print(describe(infer_features(data, args.encoding)))
    return 0


def print_metrics(results: dict[str, Any]) -> None:
    ks = results["protocol"]["ks"]
    names = ("recall", "ndcg", "mrr")
    print(f"{'split':<7}" + "".join(f"{m + '@' + str(k):>12}" for k in ks for m in names))
    for split in ("valid", "test"):
        if split in results:
            print(f"{split:<7}" + "".join(f"{results[split][f'{m}@{k}']:>12.4f}" for k in ks for m in names))


def cmd_train(args: argparse.Namespace) -> int:
    from seqrec.config import load_toml, resolve
    from seqrec.data.dataset import PreparedDataset
    from seqrec.train.loop import fit

    if args.resume:
        return resume_train(Path(args.resume), args)
    raw = load_toml(Path(args.config)) if args.config else {}
    overrides = list(args.set or [])
    if args.dataset:
        overrides.insert(0, f'data.dataset="{args.dataset}"')
    if args.model:
        overrides.insert(0, f'model.name="{args.model}"')
    cfg = resolve(raw, overrides)
    if not cfg.data.dataset:
        raise SeqrecError("no dataset: give --dataset or data.dataset in the config")
    data = PreparedDataset.load(resolve_dataset(cfg.data.dataset))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.out) if args.out else Path("runs") / f"{data.meta['name']}-{cfg.model.name}-{stamp}"
    init = Path(args.init_items_from) if args.init_items_from else None
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
    from seqrec.config import resolve
    from seqrec.data.dataset import PreparedDataset
    from seqrec.data.io import read_json
    from seqrec.train.loop import fit

    given = [flag for flag, value in (("--dataset", args.dataset), ("--model", args.model), ("--config", args.config),
                                      ("--set", args.set), ("--out", args.out),
                                      ("--init-items-from", args.init_items_from)) if value]
    if given:
        raise SeqrecError(f"--resume continues a run with its own config: drop {', '.join(given)}")
    if not (run_dir / "config.json").is_file():
        raise SeqrecError(f"{run_dir}: not a run folder (no config.json)")
    if (run_dir / "results.json").is_file() and not (run_dir / "state").is_dir():
        raise SeqrecError(f"{run_dir}: the run has finished (results.json is there); nothing to resume")
    cfg = resolve(read_json(run_dir / "config.json"), [])
    data = PreparedDataset.load(resolve_dataset(cfg.data.dataset))
    report_run(run_dir, fit(cfg, data, run_dir, resume=True))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from seqrec.config import resolve
    from seqrec.data.dataset import PreparedDataset
    from seqrec.data.io import read_json
    from seqrec.eval.evaluate import evaluate, protocol
    from seqrec.train.checkpoint import load_checkpoint
    from seqrec.train.loop import pick_device

    run = Path(args.run)
    if not (run / "config.json").is_file():
        raise SeqrecError(f"{run}: not a run folder (no config.json)")
    raw = read_json(run / "config.json")
    overrides = [f"eval.filter_seen={'true' if args.filter_seen else 'false'}"] if args.filter_seen is not None else []
    cfg = resolve(raw, overrides)
    data = PreparedDataset.load(resolve_dataset(args.dataset or cfg.data.dataset))
    device = pick_device(cfg.train.device)
    results: dict[str, Any] = {"protocol": protocol(data, cfg.eval, "test", cfg.data.max_len)}
    for split in ("valid", "test"):
        # a refitted run tests the refit, and validates the validation-chosen model it was refitted from
        name = "checkpoint-selected" if split == "valid" and cfg.train.refit else "checkpoint"
        model, meta = load_checkpoint(run / name, device)
        if meta.get("dataset_fingerprint") not in (None, data.fingerprint):
            raise SeqrecError(f"{run}: trained on dataset fingerprint {meta['dataset_fingerprint']}, "
                              f"but {data.path} has {data.fingerprint}")
        results[split] = evaluate(model, data, split, cfg.data.max_len, cfg.eval, device)
    print_metrics(results)
    return 0


def user_history(run: Path, user: str) -> tuple[list[str], list[float] | None, dict[str, list[float]]]:
    """A user's full raw item history, its timestamps and extra event columns (rating, ...),
    from the prepared dataset the run was trained on."""
    import polars as pl

    from seqrec.data.dataset import PreparedDataset
    from seqrec.data.io import read_json

    if not (run / "config.json").is_file():
        raise SeqrecError(f"{run}: --user needs a run folder with config.json")
    data = PreparedDataset.load(resolve_dataset(read_json(run / "config.json")["data"]["dataset"]))
    users = pl.read_parquet(data.path / "users.parquet")
    match = users.filter(pl.col("user") == user)
    if match.height == 0:
        raise SeqrecError(f"unknown user {user!r} in {data.path}")
    u = int(match["idx"][0])
    lo, hi = int(data.offsets[u]), int(data.offsets[u + 1])
    raw = data.item_table.sort("idx")["item"].to_list()
    times = None if data.times is None else data.times[lo:hi].tolist()
    events: dict[str, list[float]] = {}
    if (data.path / "events.parquet").exists():
        frame = pl.read_parquet(data.path / "events.parquet").slice(lo, hi - lo)
        events = {c: frame[c].cast(pl.Float64, strict=False).to_list() for c in frame.columns
                  if frame[c].dtype.is_numeric()}
    return [raw[i - 1] for i in data.items[lo:hi]], times, events


def cmd_recommend(args: argparse.Namespace) -> int:
    from seqrec.serve import Recommender

    index = args.index or ("hnsw" if args.ann else "exact")
    if args.n_probe is not None and index != "ivf":
        raise SeqrecError("--n-probe needs --index ivf")
    options = {} if args.n_probe is None else {"n_probe": args.n_probe}
    rec = Recommender.from_run(args.run, index=index, **options)
    if args.new_item:
        bad = [item for item in args.new_item if "=" not in item]
        if bad:
            raise SeqrecError(f"--new-item takes ID=TEXT, got {bad[0]!r}")
        rec.add_items(dict(item.split("=", 1) for item in args.new_item))
    if (args.history is None) == (args.user is None):
        raise SeqrecError("give exactly one of --history or --user")
    if args.user is not None:
        history, times, events = user_history(Path(args.run), args.user)
        titles = rec.titles or [None] * rec.n_items
        print(f"user {args.user}: {len(history)} items; the last {min(10, len(history))}:")
        for raw in history[-10:]:
            title = titles[rec.index[raw] - 1]
            print(f"       {raw:<12} {title or ''}")
        print(f"top {args.k}{' (seen items excluded)' if args.exclude_seen else ''}:")
    else:
        history = args.history.replace(",", " ").split()
        times = [float(t) for t in args.times.replace(",", " ").split()] if args.times else None
        events = {}
    candidates = args.candidates.replace(",", " ").split() if args.candidates else None
    recs = rec.recommend(history, args.k, exclude_seen=args.exclude_seen, candidates=candidates,
                         times=times, events=events)
    for rank, r in enumerate(recs, start=1):
        title = f"  {r.title}" if r.title else ""
        print(f"{rank:>5}  {r.item:<12} {r.score:>9.4f}{title}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seqrec", description="Sequential recommendation.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    data_parser = sub.add_parser("data", help="fetch, prepare and inspect datasets")
    data = data_parser.add_subparsers(dest="data_cmd", required=True)
    f = data.add_parser("fetch", help="download a public dataset into $SEQREC_HOME/raw")
    f.add_argument("name")
    f.set_defaults(fn=cmd_fetch)
    pr = data.add_parser("prepare", help="raw files -> a prepared-dataset folder")
    pr.add_argument("name", nargs="?", help="a known dataset name (see the catalog), or the output name")
    pr.add_argument("--source", help="folder holding the known dataset's files")
    pr.add_argument("--format", help="movielens, recbole, unisrec, s3rec, lcrec, csv, tsv, parquet")
    pr.add_argument("--path", help="input file or folder for --format")
    for col in ("user-col", "item-col", "time-col", "sep", "time-format"):
        pr.add_argument(f"--{col}")
    pr.add_argument("--out", help="output folder (default $SEQREC_HOME/prepared/NAME)")
    pr.add_argument("--dedupe", choices=["none", "consecutive", "first"])
    pr.add_argument("--kcore", type=int)
    pr.add_argument("--min-user-len", type=int)
    pr.add_argument("--split", choices=["leave-one-out", "time"],
                    help="leave-one-out (default) or a global time split at two time quantiles")
    pr.add_argument("--test-frac", type=float, help="time split: share of events at or after the test cutoff (0.1)")
    pr.add_argument("--valid-frac", type=float, help="time split: share of events before it for validation (0.1)")
    pr.set_defaults(fn=cmd_prepare)
    st = data.add_parser("stats", help="users, items, interactions, length distribution")
    st.add_argument("dataset")
    st.add_argument("--json", action="store_true")
    st.set_defaults(fn=cmd_stats)
    fe = data.add_parser("features", help="print the side-feature schema inferred from a dataset (TOML)")
    fe.add_argument("dataset")
    fe.add_argument("--encoding", choices=["soft_one_hot", "linear", "bucket"], default="soft_one_hot",
                    help="encoding of the continuous features")
    fe.set_defaults(fn=cmd_features)
    t = sub.add_parser("train", help="train a model; writes a run folder")
    t.add_argument("--dataset")
    t.add_argument("--model")
    t.add_argument("--config", help="TOML file with [data] [model] [train] [eval]")
    t.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a config value")
    t.add_argument("--out", help="run folder (default runs/DATASET-MODEL-TIME)")
    t.add_argument("--init-items-from", metavar="RUN",
                   help="initialise the item table from RUN's item vectors (e.g. an item2vec run)")
    t.add_argument("--resume", metavar="RUN",
                   help="go on with an interrupted run from its last finished epoch (exactly as if uninterrupted)")
    t.set_defaults(fn=cmd_train)
    e = sub.add_parser("evaluate", help="re-evaluate a saved run")
    e.add_argument("run")
    e.add_argument("--dataset", help="prepared dataset (default: the run's)")
    e.add_argument("--filter-seen", action=argparse.BooleanOptionalAction, default=None)
    e.set_defaults(fn=cmd_evaluate)
    r = sub.add_parser("recommend", help="top-k items for a history of raw item ids")
    r.add_argument("run")
    r.add_argument("--history", help='raw item ids, oldest first: "50 172 133"')
    r.add_argument("--user", help="a raw user id of the run's dataset: use that user's whole history")
    r.add_argument("-k", type=int, default=10)
    r.add_argument("--exclude-seen", action="store_true")
    r.add_argument("--new-item", action="append", metavar="ID=TEXT",
                   help="an item unseen in training, known by its text (text models such as unisrec)")
    r.add_argument("--candidates", help="rank only these raw item ids")
    r.add_argument("--index", choices=["exact", "hnsw", "ivf"],
                   help="how top-k is retrieved: exact (default), or a FAISS HNSW / IVF index of the item vectors")
    r.add_argument("--ann", action="store_true", help="the same as --index hnsw")
    r.add_argument("--n-probe", type=int, help="with --index ivf: lists opened per query")
    r.add_argument("--times", help="timestamps (seconds) of the --history items, for time features (gap, hour); "
                   "without them those features are missing")
    r.set_defaults(fn=cmd_recommend)
    add_unisrec_commands(sub)
    add_serve_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("faiss").setLevel(logging.WARNING)  # it logs its loader choice at INFO on import
    try:
        return int(args.fn(args))
    except SeqrecError as exc:
        print(f"seqrec: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `seqrec ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("seqrec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
