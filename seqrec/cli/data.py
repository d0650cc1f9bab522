"""`seqrec data`: fetch, prepare and inspect datasets."""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqrec.cli.common import _home, check_out_parent, resolve_dataset
from seqrec.errors import SeqrecError

if TYPE_CHECKING:
    from collections.abc import Callable

    from seqrec.data.types import RawDataset


def cmd_fetch(args: argparse.Namespace) -> int:
    from seqrec.data.catalog import KNOWN_DATASETS
    from seqrec.data.fetch import fetch_ml100k

    if args.name != "ml-100k":
        how = (f"`seqrec data prepare {args.name} --source DIR` reads it from its folder"
               if args.name in KNOWN_DATASETS else
               f"to prepare your own log: `seqrec data prepare {args.name} --format csv --path FILE "
               "--user-col COL --item-col COL`")
        raise SeqrecError(f"fetch downloads only ml-100k, not {args.name!r}; {how}")
    result = fetch_ml100k(_home())
    print(f"ml-100k ready in {result.directory} (source: {result.source}, layout: {result.layout})")
    return 0


# the reader options `--format` passes on, and their flags
FORMAT_FLAGS = {"user_col": "--user-col", "item_col": "--item-col", "time_col": "--time-col", "sep": "--sep",
                "time_format": "--time-format", "extra_cols": "--event-cols"}


def _format_options(args: argparse.Namespace) -> dict[str, Any]:
    """The reader options given as flags, checked against what the reader of `--format` takes (so that a
    mistake is named by its flag, not by the reader's parameter)."""
    from seqrec.data.catalog import format_options

    required, optional = format_options(args.format)
    given = {k: getattr(args, k) for k in FORMAT_FLAGS if getattr(args, k) is not None}
    if "extra_cols" in given:
        given["extra_cols"] = [c.strip() for c in given["extra_cols"].split(",") if c.strip()]
    refused = [k for k in given if k not in required + optional]
    if refused:
        takes = ", ".join(FORMAT_FLAGS[k] for k in FORMAT_FLAGS if k in required + optional)
        raise SeqrecError(f"--format {args.format} does not take {', '.join(FORMAT_FLAGS[k] for k in refused)}; "
                          + (f"it takes {takes}" if takes else "it takes none (its files have a fixed layout)"))
    missing = [FORMAT_FLAGS.get(k, k) for k in required if k not in given]
    if missing:
        raise SeqrecError(f"--format {args.format} needs {' and '.join(missing)}: the column names in {args.path}")
    return given


def _prepare_source(args: argparse.Namespace) -> tuple[Callable[[], RawDataset], dict[str, Any]]:
    """What `prepare` reads, as a reader to call once every flag is checked, and the dataset's own prepare
    defaults (a known dataset's)."""
    from seqrec.data.catalog import KNOWN_DATASETS, load_format, load_known

    if args.format:
        if not args.path:
            raise SeqrecError("--format needs --path")
        return functools.partial(load_format, args.format, Path(args.path), **_format_options(args)), {}
    if args.name is None:
        raise SeqrecError(f"give a dataset name (known: {', '.join(sorted(KNOWN_DATASETS))}), or --format and --path "
                          "for your own log")
    if args.name not in KNOWN_DATASETS:
        raise SeqrecError(f"unknown dataset {args.name!r}; known: {', '.join(sorted(KNOWN_DATASETS))} "
                          "(or give --format and --path)")
    source = Path(args.source) if args.source else _home() / "raw" / args.name
    if not source.exists():
        hint = "run `seqrec data fetch ml-100k`" if args.name == "ml-100k" else "give --source DIR"
        raise SeqrecError(f"source folder {source} does not exist; {hint}")
    return functools.partial(load_known, args.name, source), dict(KNOWN_DATASETS[args.name].prepare)


def _check_item_flags(args: argparse.Namespace) -> None:
    if not args.items:
        for flag, value in (("--item-key", args.item_key), ("--text-template", args.text_template),
                            ("--items-sep", args.items_sep)):
            if value is not None:
                raise SeqrecError(f"{flag} needs --items TABLE")


def _with_item_table(raw: RawDataset, args: argparse.Namespace) -> RawDataset:
    """`--items TABLE`: the table, joined on `--item-key`, becomes the dataset's catalogue."""
    from seqrec.data.item_table import join_item_table, read_item_table

    if not args.items:
        return raw
    key = args.item_key or args.item_col or "item_id"
    table = read_item_table(Path(args.items), key, args.items_sep)
    return join_item_table(raw, table, args.text_template or "")


def cmd_prepare(args: argparse.Namespace) -> int:
    from seqrec.data.prepare import PrepareOptions, prepare

    t0 = time.perf_counter()
    read, defaults = _prepare_source(args)
    keys = ("dedupe", "kcore", "min_user_len", "split", "test_frac", "valid_frac")
    for key in keys:
        if getattr(args, key) is not None:
            defaults[key] = getattr(args, key)
    options = PrepareOptions(**{k: v for k, v in defaults.items() if k in keys})  # checked before any reading
    _check_item_flags(args)
    name = args.name or Path(args.path).stem
    dest = Path(args.out) if args.out else _home() / "prepared" / name
    check_out_parent(dest)
    raw = _with_item_table(read(), args)
    before = _fingerprint(dest)
    data = prepare(raw, options, dest)  # named after its folder: `--out .../ml-100k-time` gives ml-100k-time
    name = data.meta["name"]
    s = data.stats()
    print(f"prepared {name} -> {dest} in {time.perf_counter() - t0:.1f}s: "
          f"{s['users']} users, {s['items']} items, {s['interactions']} interactions")
    if before not in (None, data.fingerprint):
        print(f"(it replaced a preparation with other data or options: fingerprint {before} -> {data.fingerprint}; "
              "runs trained on the old one no longer evaluate on it)")
    return 0


def _fingerprint(dest: Path) -> str | None:
    """The fingerprint of the dataset prepared in `dest`, if one is there."""
    try:
        return str(json.loads((dest / "meta.json").read_text())["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cmd_cold_split(args: argparse.Namespace) -> int:
    from seqrec.data.dataset import PreparedDataset
    from seqrec.eval.cold import cold_item_split, cold_mask

    data = PreparedDataset.load(resolve_dataset(args.dataset))
    if not 0 < args.fraction < 1:
        raise SeqrecError(f"--fraction must be between 0 and 1 (exclusive), got {args.fraction}")
    if args.seed < 0:
        raise SeqrecError(f"--seed must be >= 0, got {args.seed}")
    default = f"{data.meta['name']}-cold{round(args.fraction * 100)}"
    dest = Path(args.out) if args.out else _home() / "prepared" / default
    if dest.resolve() == data.path.resolve():
        raise SeqrecError(f"--out {dest} is the dataset itself: write the cold-item split to another folder")
    before = _fingerprint(dest)
    cold = cold_item_split(data, args.fraction, args.seed, dest, name=dest.resolve().name)
    users, pos = cold.eval_positions("test")
    n_cold = int(cold_mask(cold)[cold.items[cold.offsets[users] + pos]].sum())
    print(f"cold-item split of {data.meta['name']} -> {dest}: {cold.meta['options']['cold_items']:,} test-target "
          f"items made cold (their earlier events removed), {cold.n_users:,} of {data.n_users:,} users kept, "
          f"{n_cold:,} of {len(users):,} test targets cold; evaluate a run on it with `seqrec evaluate --cold`")
    if before not in (None, cold.fingerprint):
        print(f"(it replaced a dataset with other data: fingerprint {before} -> {cold.fingerprint})")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from seqrec.data.dataset import PreparedDataset

    data = PreparedDataset.load(resolve_dataset(args.dataset))
    stats = data.stats()
    decisions = auto_preview(data)
    if args.json:
        print(json.dumps({**stats, "auto": decisions}, indent=2, default=str))
        return 0
    print(f"dataset       {stats['name']}  ({stats['split']}, fingerprint {stats['fingerprint']})")
    print(f"users         {stats['users']:,}  ({stats['valid_users']:,} with a validation target, "
          f"{stats['test_users']:,} with a test target)")
    unused = stats["items_without_interactions"]
    print(f"items         {stats['items']:,}" + (f"  ({unused:,} without interactions: the item table's "
                                                   "items never in the log or whose events were filtered out)"
                                                   if unused else ""))
    catalogue = stats.get("catalogue")
    if catalogue:
        print(f"item table    {catalogue['item_table']}: {catalogue['table_items']:,} items, "
              f"{catalogue['table_items_without_interactions']:,} never in the log; "
              f"{catalogue['log_items_without_row']:,} log items without a row"
              + (f"; {catalogue['table_items_without_text']:,} with empty text"
                 if catalogue.get("table_items_without_text") else "")
              + (f"; text {catalogue['text_template']!r}" if catalogue["text_template"] else ""))
    print(f"interactions  {stats['interactions']:,}  (density {stats['density']:.5f})")
    lengths = "  ".join(f"{k} {v:g}" for k, v in stats["length_percentiles"].items())
    print(f"length        mean {stats['length_mean']:.2f}  {lengths}")
    print(f"repeats       {stats['repeat_rate']:.1%} of training events return to an item the user had "
          f"({stats['consecutive_repeat_rate']:.1%} repeat the item just before)")
    for d in decisions:
        print(f"auto          {d['key']} = {d['value']}: {d['reason']}")
    return 0


def auto_preview(data: Any) -> list[dict[str, Any]]:
    """What the "auto" settings of `seqrec train --model sasrec` decide on `data` on this machine
    (seqrec.train.auto), so `data stats` shows the properties they read."""
    from seqrec.config import resolve
    from seqrec.train.auto import resolve_auto, resolve_auto_data, resolve_auto_train
    from seqrec.train.device import pick_device

    cfg = resolve({"model": {"name": "sasrec"}})
    return (resolve_auto_train(cfg.model, cfg.train, cfg.data.max_len, data, pick_device("auto"))
            + resolve_auto(cfg.model, data) + resolve_auto_data(cfg.data, data))


def cmd_features(args: argparse.Namespace) -> int:
    from seqrec.data.dataset import PreparedDataset
    from seqrec.data.features import describe, infer_features

    data = PreparedDataset.load(resolve_dataset(args.dataset))
    print(f"# side features inferred from {data.meta['name']}; put the ones you want in the run config")
    print(describe(infer_features(data, args.encoding)))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register `data fetch|prepare|cold-split|stats|features` on the top-level subparsers."""
    data_parser = sub.add_parser("data", help="fetch, prepare and inspect datasets")
    data = data_parser.add_subparsers(dest="data_cmd", required=True)
    f = data.add_parser("fetch", help="download a public dataset into $SEQREC_HOME/raw")
    f.add_argument("name")
    f.set_defaults(fn=cmd_fetch)
    pr = data.add_parser("prepare", help="raw files -> a prepared-dataset folder")
    pr.add_argument("name", nargs="?", help="a known dataset name (see the catalog), or the output name")
    pr.add_argument("--source", help="folder holding the known dataset's files")
    pr.add_argument("--format", help="csv, tsv, parquet, jsonl, table (one of those four, by the file's suffix), "
                    "movielens, recbole, recbole-seq, unisrec, s3rec, lcrec, diginetica")
    pr.add_argument("--path", help="input file or folder for --format")
    pr.add_argument("--user-col", help="the log's user id column")
    pr.add_argument("--item-col", help="the log's item id column")
    pr.add_argument("--time-col", help="the log's time column: numbers, or ISO 8601 dates / times unless "
                    "--time-format gives another layout")
    pr.add_argument("--sep", help="the log's field separator when its suffix does not say: one character, "
                    r"or \t or tab for a tab")
    pr.add_argument("--time-format", help="the strftime layout of times that are not ISO 8601 or numbers (those "
                    "are refused without it: day / month order is never guessed)")
    pr.add_argument("--event-cols", dest="extra_cols", metavar="COL,COL",
                    help="more log columns kept as event values (a rating, a price, ...): event features a model "
                         "can read, and what /recommend's `events` fills at serving time")
    pr.add_argument("--items", metavar="TABLE",
                    help="item table (CSV/TSV/Parquet/JSONL) joined on the item id; it becomes the catalogue")
    pr.add_argument("--item-key", help="the item table's id column (default: --item-col, else item_id)")
    pr.add_argument("--items-sep", help=r"the item table's separator when its suffix does not say (\t or tab for "
                    "a tab)")
    pr.add_argument("--text-template", help='item text from the table\'s fields, e.g. "{title}. {brand}"')
    pr.add_argument("--out", help="output folder (default $SEQREC_HOME/prepared/NAME); the dataset is named "
                    "after it")
    pr.add_argument("--dedupe", choices=["none", "consecutive", "first"],
                    help="repeated events: none (keep all, the default), consecutive (drop an event of the item "
                    "just before it, exact duplicates included), first (keep each user's first event of each item "
                    "only: no repeats left)")
    pr.add_argument("--kcore", type=int, help="keep only users and items with at least K events, repeatedly "
                    "(0 or 1: no filtering, the default)")
    pr.add_argument("--min-user-len", type=int, help="drop users with fewer events (default 3, the least "
                    "leave-one-out takes)")
    pr.add_argument("--split", choices=["leave-one-out", "time"],
                    help="leave-one-out (default) or a global time split at two time quantiles")
    pr.add_argument("--test-frac", type=float, help="time split: share of events at or after the test cutoff (0.1)")
    pr.add_argument("--valid-frac", type=float, help="time split: share of events before it for validation (0.1)")
    pr.set_defaults(fn=cmd_prepare)
    cs = data.add_parser("cold-split", help="a copy of a dataset whose chosen test-target items are new at test "
                         "time (cold items), to measure how a model finds items it never trained on")
    cs.add_argument("dataset")
    cs.add_argument("--fraction", type=float, default=0.2,
                    help="share of the test-target items made cold: their events before the test are removed "
                         "(default 0.2)")
    cs.add_argument("--seed", type=int, default=0, help="which items are chosen (default 0)")
    cs.add_argument("--out", help="output folder (default $SEQREC_HOME/prepared/NAME-coldPCT); the dataset is named "
                    "after it")
    cs.set_defaults(fn=cmd_cold_split)
    st = data.add_parser("stats", help="users, items, interactions, length distribution")
    st.add_argument("dataset")
    st.add_argument("--json", action="store_true",
                    help="the counts and what the auto settings decide, as one JSON object")
    st.set_defaults(fn=cmd_stats)
    fe = data.add_parser("features", help="print the side-feature schema inferred from a dataset (TOML)")
    fe.add_argument("dataset")
    fe.add_argument("--encoding", choices=["soft_one_hot", "linear", "bucket"], default="soft_one_hot",
                    help="encoding of the continuous features")
    fe.set_defaults(fn=cmd_features)
