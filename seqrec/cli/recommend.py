"""`seqrec recommend`: top-k items for a history of raw item ids, for a user of the run's dataset, or for many
users at once (`--users`, `--log`), written to a file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from seqrec.cli.common import resolve_dataset, run_config, zero_shot_run
from seqrec.errors import SeqrecError

if TYPE_CHECKING:
    from seqrec.data.dataset import PreparedDataset
    from seqrec.serve import Recommender
    from seqrec.serve.batch import Histories

LOG_ONLY = {"user_col": "--user-col", "item_col": "--item-col", "time_col": "--time-col", "sep": "--sep",
            "time_format": "--time-format"}
BATCH_ONLY = {"out": "--out", "batch_size": "--batch-size", **LOG_ONLY}

def run_dataset(run: Path, flag: str) -> PreparedDataset:
    """The prepared dataset a run was trained on, as prepared now (a note says when that is not the
    preparation the run was trained on)."""
    from seqrec.data.dataset import PreparedDataset
    from seqrec.train.checkpoint import read_meta

    if not (run / "config.json").is_file():
        raise SeqrecError(f"{run}: {flag} needs a run folder with config.json")
    data = PreparedDataset.load(resolve_dataset(run_config(run).data.dataset))
    trained_on = read_meta(run / "checkpoint").get("dataset_fingerprint")
    if trained_on not in (None, data.fingerprint):
        print(f"(note: {data.path} was prepared again since this run was trained, from other data or options: "
              f"fingerprint {trained_on} -> {data.fingerprint}; the users' histories are the ones prepared now)")
    return data


def user_history(run: Path, user: str) -> tuple[list[str], list[float] | None, dict[str, list[float]]]:
    """A user's full raw item history, its timestamps and extra event columns (rating, ...), from the
    prepared dataset the run was trained on."""
    import polars as pl

    data = run_dataset(run, "--user")
    users = pl.read_parquet(data.path / "users.parquet")
    match = users.filter(pl.col("user") == user)
    if match.height == 0:
        options = data.meta.get("options", {})
        raise SeqrecError(f"unknown user {user!r} in {data.path} (prepare drops users left with fewer than "
                          f"{options.get('min_user_len', 3)} events after dedupe={options.get('dedupe', 'none')} "
                          f"and kcore={options.get('kcore', 0)}: ask with --history instead)")
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


def number(text: str, flag: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise SeqrecError(f"{flag}: {text!r} is not a number") from None


def id_list(text: str, flag: str) -> list[str]:
    """Raw item ids as a flag gives them: split on spaces and commas, or a JSON array (of strings, or integers
    taken as their decimal strings) for ids that hold a space or a comma."""
    if not text.lstrip().startswith("["):
        return text.replace(",", " ").split()
    try:
        ids = json.loads(text)
    except ValueError as exc:
        raise SeqrecError(f"{flag}: not a JSON array of item ids ({exc})") from None
    if not isinstance(ids, list):
        raise SeqrecError(f"{flag}: not a JSON array of item ids")
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, (str, int)) or i == ""]
    if bad:
        raise SeqrecError(f"{flag}: a JSON array of item ids holds strings (or integers), not {bad[0]!r}")
    return [str(i) for i in ids]


def cmd_recommend(args: argparse.Namespace) -> int:
    many = check_sources(args)  # a mistake in the flags is named before the model loads
    rec = load_recommender(args)
    return recommend_batch(args, rec) if many else recommend_one(args, rec)


def check_sources(args: argparse.Namespace) -> bool:
    """Exactly one of --history, --user, --users, --log, with the flags that go with it; True for the
    batch forms (--users, --log), whose user-id file is read here (`args.user_ids`)."""
    sources = [f for f, v in (("--history", args.history), ("--user", args.user), ("--users", args.users),
                              ("--log", args.log)) if v is not None]
    if len(sources) != 1:
        raise SeqrecError("give exactly one of --history, --user, --users or --log"
                          + (f", not {' and '.join(sources)}" if sources else ""))
    if sources[0] in ("--history", "--user"):
        given = [flag for key, flag in BATCH_ONLY.items() if getattr(args, key) is not None]
        if given:
            raise SeqrecError(f"{given[0]} goes with --users or --log (top-k for many users, to a file)")
        if args.user is not None and (args.times or args.event or args.skip_unknown):
            raise SeqrecError("--times, --event and --skip-unknown go with --history (--user takes the user's own)")
        return False
    from seqrec.data.readers_io import read_lines
    from seqrec.serve.batch import output_kind

    if args.out is None:
        raise SeqrecError(f"{sources[0]} writes its top-k to a file: give --out PATH (.parquet, .csv, .tsv or "
                          ".jsonl)")
    output_kind(Path(args.out))
    refused = [f for f, v in (("--candidates", args.candidates), ("--times", args.times), ("--event", args.event),
                              ("--skip-unknown", args.skip_unknown)) if v]
    refused += [flag for key, flag in LOG_ONLY.items() if args.users is not None and getattr(args, key) is not None]
    if refused:
        where = "--log" if refused[0] in LOG_ONLY.values() else "--history"
        raise SeqrecError(f"{refused[0]} goes with {where}" + ("" if where == "--log" else
                          " (--users and --log take each user's own history)"))
    if args.log is not None:
        missing = [flag for flag, v in (("--user-col", args.user_col), ("--item-col", args.item_col)) if v is None]
        if missing:
            raise SeqrecError(f"--log needs {' and '.join(missing)}: the column names in {args.log}")
    args.user_ids = None
    if args.users not in (None, "all"):
        if not Path(args.users).is_file():
            raise SeqrecError(f"--users {args.users}: neither 'all' nor a file of user ids (one per line)")
        args.user_ids = [u.strip().lstrip("\ufeff") for u in read_lines(Path(args.users))["line"]]
        if not any(args.user_ids):
            raise SeqrecError(f"{args.users}: no user id in it (one per line)")
    return True


def load_recommender(args: argparse.Namespace) -> Recommender:
    """The run (a pre-training run: zero-shot on --dataset) on --device, with --index and the --new-item items."""
    from seqrec.serve import Recommender
    from seqrec.train.device import pick_device

    index = args.index or ("ivf" if args.ann else "exact")
    if args.n_probe is not None and index != "ivf":
        raise SeqrecError("--n-probe needs --index ivf")
    if args.n_probe is not None and args.n_probe < 1:
        raise SeqrecError(f"--n-probe must be >= 1, got {args.n_probe}")
    options = {} if args.n_probe is None else {"n_probe": args.n_probe}
    device = str(pick_device(args.device, "--device"))  # one that is not there: a one-line error
    args.run = str(zero_shot_run(Path(args.run), args.dataset, device))
    rec = Recommender.from_run(args.run, device=device, index=index, **options)
    if args.new_item:
        bad = [item for item in args.new_item  # ID=TEXT, neither of them blank
               if not all(part.strip() for part in item.partition("=")[::2])]
        if bad:
            raise SeqrecError(f"--new-item takes ID=TEXT, got {bad[0]!r}")
        new = dict(item.split("=", 1) for item in args.new_item)
        known = [raw for raw in new if raw in rec.index]
        if known or len(new) < len(args.new_item):
            raise SeqrecError(f"--new-item {(known or ['an id'])[0]}: " + (
                "already in the run's catalogue; --new-item adds items the catalogue does not hold (give it another id)"
                if known else "given more than once"))
        rec.add_items(new)
    return rec


def recommend_one(args: argparse.Namespace, rec: Recommender) -> int:
    """--history or --user: the top-k as a table on stdout."""
    said: list[str] = []  # the user's history, printed once the request is known to be answered
    if args.user is not None:
        history, times, events = user_history(Path(args.run), args.user)
        events = {name: v for name, v in events.items() if name in rec.model.event_feature_names()}  # the model's
        titles = rec.titles or [None] * rec.n_items
        said.append(f"user {args.user}: {len(history)} items; the last {min(10, len(history))}:")
        said += [f"       {raw:<12} {titles[rec.index[raw] - 1] or ''}" for raw in history[-10:]]
    else:
        history = id_list(args.history, "--history")
        times = [number(t, "--times") for t in args.times.replace(",", " ").split()] if args.times else None
        events = {}
        for spec in args.event or []:
            name, sep, values = spec.partition("=")
            if not sep or not name.strip():
                raise SeqrecError(f"--event takes NAME=V1,V2,..., got {spec!r}")
            if name.strip() in events:
                raise SeqrecError(f"--event {name.strip()} is given twice")
            events[name.strip()] = [number(v, f"--event {name.strip()}") for v in values.replace(",", " ").split()]
        rec.check_event_names(list(events))
        if times is not None and not set(rec.model.event_feature_names()) & {"gap", "hour"}:
            raise SeqrecError("--times: this model reads no time features (gap, hour); leave --times out")
    candidates = id_list(args.candidates, "--candidates") if args.candidates is not None else None
    if args.skip_unknown:  # as /recommend's unknown: skip; what is left out is said apart from the table
        history, times, given, dropped = rec.drop_unknown(history, times, events or None)
        events = given or {}
        if candidates is not None:
            candidates, unknown = rec.catalogue.split_known(candidates)
            dropped += unknown
            if not candidates:
                raise SeqrecError("no id of --candidates is in the run's catalogue")
        if dropped:
            print(f"(left out, not in the run's catalogue: {', '.join(dropped)})", file=sys.stderr)
    recs = rec.recommend(history, args.k, exclude_seen=args.exclude_seen, candidates=candidates,
                         times=times, events=events)
    if said:
        print("\n".join(said))
    if args.user is not None:
        fewer = f" (of k={args.k}: no more items are left)" if len(recs) < args.k else ""
        print(f"top {len(recs)}{' (seen items excluded)' if args.exclude_seen else ''}{fewer}:")
    elif len(recs) < args.k:  # said apart from the table, which scripts read
        left = "among the candidates" if candidates is not None else "once the seen items are excluded"
        print(f"({len(recs)} of k={args.k}: no more items are left {left})", file=sys.stderr)
    for rank, r in enumerate(recs, start=1):
        title = f"  {r.title}" if r.title else ""
        print(f"{rank:>5}  {r.item:<12} {r.score:>9.4f}{title}")
    return 0


def batch_histories(args: argparse.Namespace, rec: Recommender) -> tuple[Histories, str]:
    """The histories of --users (from the run's dataset) or --log, and how to name where they came from."""
    from seqrec.data.features import DERIVED_EVENTS
    from seqrec.data.readers_table import TableFile, read_table
    from seqrec.serve import batch

    if args.users is not None:
        data = run_dataset(Path(args.run), "--users")
        hist = batch.from_dataset(rec, data, args.user_ids)
        if not hist.users and not hist.empty_users:
            raise SeqrecError(f"none of the {len(hist.unknown_users)} user id(s) of {args.users} is in "
                              f"{data.path.name}: {shorten(hist.unknown_users)}")
        return hist, f"{data.path.name}'s users"
    columns = TableFile.of(Path(args.log), args.sep, what="log").columns()
    takes = [n for n in rec.model.event_feature_names() if n not in DERIVED_EVENTS]
    frame = read_table(Path(args.log), args.user_col, args.item_col, args.time_col, args.sep, args.time_format,
                       extra_cols=[n for n in takes if n in columns]).interactions.frame
    if frame.height == 0:
        raise SeqrecError(f"{args.log}: no events in it")
    lacking = [n for n in takes if n not in columns] + [n for n in DERIVED_EVENTS if args.time_col is None
                                                       and n in rec.model.event_feature_names()]
    if lacking:
        print(f"(note: the model's event feature(s) {', '.join(lacking)} are not in {args.log}"
              f"{'' if args.time_col else ' (gap and hour need --time-col)'}: taken as missing)")
    return batch.from_log(rec, frame), f"the users of {args.log}"


def recommend_batch(args: argparse.Namespace, rec: Recommender) -> int:
    """--users / --log: top-k for many users, written to --out, with a summary of what was left out."""
    import time

    from seqrec.serve import batch

    started = time.perf_counter()
    hist, source = batch_histories(args, rec)
    if not hist.users:
        raise SeqrecError(f"no user has an item the run knows ({len(hist.empty_users)} user(s) of {source}), so "
                          "there is nothing to recommend from")
    frame = batch.recommend_histories(rec, hist, args.k, args.exclude_seen,
                                      1024 if args.batch_size is None else args.batch_size)
    batch.write_table(frame, Path(args.out))
    seconds = time.perf_counter() - started
    print(f"top {args.k} for {len(hist.users):,} of {source} -> {args.out} ({frame.height:,} rows, {seconds:.1f} s)")
    answered = set(frame["user"].unique().to_list())
    nothing_left = [u for u in hist.users if u not in answered] if len(answered) < len(hist.users) else []
    for what, names in (("user id(s) not in the dataset", hist.unknown_users),
                        ("user(s) with no item the run knows: no rows", hist.empty_users),
                        ("user(s) with no item left once their own are excluded: no rows", nothing_left)):
        if names:
            print(f"  {len(names):,} {what}: {shorten(names)}")
    if hist.unknown_events:
        print(f"  {hist.unknown_events:,} event(s) of items the run does not know were left out of the histories")
    return 0


def shorten(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (" ..." if len(names) > n else "")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register `recommend` on the top-level subparsers."""
    r = sub.add_parser("recommend", help="top-k items for a history of raw item ids")
    r.add_argument("run")
    r.add_argument("--dataset", help="with a pre-training run: the catalogue to recommend from, zero-shot (through "
                   "its items' text alone)")
    r.add_argument("--history", help='raw item ids, oldest first: "50 172 133" (split on spaces and commas), or a '
                   'JSON array for ids that hold either: \'["Zed, Inc.", "a b"]\'')
    r.add_argument("--user", help="a raw user id of the run's dataset: use that user's whole history")
    r.add_argument("-k", type=int, default=10)
    r.add_argument("--exclude-seen", action="store_true")
    r.add_argument("--new-item", action="append", metavar="ID=TEXT",
                   help="an item unseen in training, known by its text (text models such as unisrec)")
    r.add_argument("--candidates", help="rank only these raw item ids (as --history takes them)")
    r.add_argument("--skip-unknown", action="store_true", help="leave out of --history and --candidates the ids "
                   "the run's catalogue does not hold (named on stderr) instead of refusing the request")
    r.add_argument("--index", choices=["exact", "hnsw", "ivf"],
                   help="how top-k is retrieved: exact (default), or a FAISS HNSW / IVF index of the item vectors")
    r.add_argument("--ann", action="store_true", help="the same as --index ivf (the faster ANN index here)")
    r.add_argument("--n-probe", type=int, help="with --index ivf: lists opened per query")
    r.add_argument("--times", help="timestamps (seconds) of the --history items, for time features (gap, hour); "
                   "without them those features are missing")
    r.add_argument("--event", action="append", metavar="NAME=V1,V2,...",
                   help="an event feature's values for the --history items (e.g. rating=5,4,3), one per item")
    r.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, or auto (CUDA where there is one): "
                   "where the sequence encoder runs (the top-k search itself runs on the CPU)")
    r.add_argument("--users", metavar="all|FILE", help="top-k for many users of the run's dataset, each with its "
                   "whole history: all of them, or those of FILE (one user id per line); needs --out")
    r.add_argument("--log", metavar="FILE", help="top-k for every user of an event log (CSV / TSV / Parquet / JSON "
                   "lines; items the run does not know are left out); needs --out, --user-col and --item-col")
    r.add_argument("--out", metavar="PATH", help="with --users or --log: the file of (user, rank, item, score, "
                   "title) rows: .parquet, .csv, .tsv or .jsonl, written whole or not at all")
    r.add_argument("--batch-size", type=int, help="with --users or --log: histories encoded at a time (default 1024)")
    r.add_argument("--user-col", help="with --log: its user id column")
    r.add_argument("--item-col", help="with --log: its item id column")
    r.add_argument("--time-col", help="with --log: its time column, which orders each user's events (else the "
                   "file's order)")
    r.add_argument("--sep", help="with --log: its field separator when its suffix does not say")
    r.add_argument("--time-format", help="with --log: the strftime layout of its times, as in data prepare")
    r.set_defaults(fn=cmd_recommend)
