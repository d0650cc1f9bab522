"""Top-k for many users at once, written to a file (`seqrec recommend --users` / `--log`).

A nightly list for every user, or for the users of a day's export, is the batch form of what the
service answers one request at a time: the same `Recommender` (model, catalogue, index, history
bias), with the histories encoded `batch_size` at a time and searched in one call per batch.
Histories come from the run's prepared dataset (each user's whole history: training, validation and
test events, with their times and event values) or from a log, read by the same table reader as
`seqrec data prepare`. Items the catalogue does not hold are dropped from a history and counted; a
user left with none gets no row and is named in the summary.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import torch
from tqdm.auto import tqdm

from seqrec.data.dataset import PreparedDataset
from seqrec.data.features import DERIVED_EVENTS
from seqrec.data.readers_table import JSONL_SUFFIXES, PARQUET_SUFFIXES, SEPARATORS
from seqrec.data.types import RawDataset
from seqrec.errors import SeqrecError
from seqrec.serve.recommender import Recommender

# an output's type by its suffix: the suffixes `seqrec data prepare` reads
WRITERS = {**{s: "parquet" for s in PARQUET_SUFFIXES}, **{s: "jsonl" for s in JSONL_SUFFIXES},
           **{s: "tsv" if sep == "\t" else "csv" for s, sep in SEPARATORS.items()}}


@dataclass
class Histories:
    """Users and their histories as catalogue indices (1..N), oldest first, with times and event values
    where known; what was dropped on the way is kept for the summary."""

    users: list[str]
    items: list[np.ndarray]
    times: list[np.ndarray] | None = None
    events: dict[str, list[np.ndarray]] = field(default_factory=dict)
    unknown_events: int = 0  # events whose item the catalogue does not hold
    empty_users: list[str] = field(default_factory=list)  # users left with no known item
    unknown_users: list[str] = field(default_factory=list)  # asked for, not in the dataset


def output_kind(path: Path) -> str:
    """The table type the output's suffix names; anything else is refused before any work is done."""
    kind = WRITERS.get(Path(path).suffix.lower())
    if kind is None:
        raise SeqrecError(f"{path}: unknown output type {Path(path).suffix!r} (known: {', '.join(WRITERS)})")
    return kind


def write_table(frame: pl.DataFrame, path: Path) -> None:
    """`frame` to `path` (type by suffix), whole or not at all: written beside it, then renamed."""
    path = Path(path)
    kind = output_kind(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        if kind == "parquet":
            frame.write_parquet(tmp)
        elif kind == "jsonl":
            frame.write_ndjson(tmp)
        else:
            frame.write_csv(tmp, separator="\t" if kind == "tsv" else ",")
        os.replace(tmp, path)
    except (OSError, pl.exceptions.PolarsError) as exc:
        reason = getattr(exc, "strerror", None) or (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SeqrecError(f"{path}: cannot write ({reason})") from None
    finally:
        tmp.unlink(missing_ok=True)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions start..start+length-1 of every range, concatenated (no Python loop over ranges)."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)


def _histories(users: list[str], lengths: np.ndarray, items: np.ndarray, times: np.ndarray | None,
               events: dict[str, np.ndarray]) -> Histories:
    """Flat per-event arrays (users' events one after another; `items` as catalogue indices, 0 where the
    catalogue lacks the item) -> per-user histories without the unknown items."""
    if not users:
        return Histories([], [], None if times is None else [], {name: [] for name in events})
    keep = items > 0
    owner = np.repeat(np.arange(len(users)), lengths)
    kept = np.bincount(owner[keep], minlength=len(users))
    cuts = np.cumsum(kept)[:-1]
    has = kept > 0

    def split(values: np.ndarray) -> list[np.ndarray]:
        parts = np.split(values[keep], cuts)
        return [p for p, h in zip(parts, has, strict=True) if h]

    return Histories(
        users=[u for u, h in zip(users, has, strict=True) if h],
        items=split(items),
        times=None if times is None else split(times),
        events={name: split(v) for name, v in events.items()},
        unknown_events=int((~keep).sum()),
        empty_users=[u for u, h in zip(users, has, strict=True) if not h],
    )


def _catalogue_indices(rec: Recommender, raw: pl.Series) -> np.ndarray:
    """Raw item ids -> the catalogue's indices, 0 for ids it has never held. A removed item is still known
    (history context, as in a request); it is only never recommended."""
    index = pl.DataFrame({"item": list(rec.index), "idx": list(rec.index.values())},
                         schema={"item": pl.Utf8, "idx": pl.Int64})
    found = pl.DataFrame({"item": raw.cast(pl.Utf8)}).join(index, on="item", how="left", maintain_order="left")
    return found["idx"].fill_null(0).to_numpy().astype(np.int64)


def _event_columns(rec: Recommender) -> list[str]:
    """The event features a model reads from a log's columns (gap and hour come from times)."""
    return [n for n in rec.model.event_feature_names() if n not in DERIVED_EVENTS]


def from_dataset(rec: Recommender, data: PreparedDataset, users: Sequence[str] | None = None) -> Histories:
    """Every user of a prepared dataset (or those named, in the order given), each with the whole history."""
    table = pl.read_parquet(data.path / "users.parquet").sort("idx")
    if users is None:
        names, codes, unknown = table["user"].to_list(), table["idx"].to_numpy(), []
    else:
        if isinstance(users, str) or any(not isinstance(u, str) for u in users):
            raise SeqrecError("users are a list of user ids, strings as the log wrote them (e.g. ['1', '2'])")
        code_of = dict(zip(table["user"].to_list(), table["idx"].to_list(), strict=True))
        asked = list(dict.fromkeys(users))
        unknown = [u for u in asked if u not in code_of]
        names = [u for u in asked if u in code_of]
        codes = np.array([code_of[u] for u in names], dtype=np.int64)
    starts, lengths = data.offsets[codes], data.offsets[codes + 1] - data.offsets[codes]
    at = _ranges(starts, lengths)
    raw = data.item_table.sort("idx")["item"]
    items = np.concatenate([[0], _catalogue_indices(rec, raw)])[data.items[at]]  # dataset index -> catalogue's
    events: dict[str, np.ndarray] = {}
    wanted = _event_columns(rec)
    if wanted and (data.path / "events.parquet").exists():
        have = pl.read_parquet_schema(data.path / "events.parquet")
        frame = pl.read_parquet(data.path / "events.parquet", columns=[c for c in wanted if c in have])
        events = {c: frame[c].cast(pl.Float64, strict=False).to_numpy()[at] for c in frame.columns}
    out = _histories(names, lengths, items, None if data.times is None else data.times[at], events)
    out.unknown_users = unknown
    return out


def from_log(rec: Recommender, frame: pl.DataFrame | RawDataset) -> Histories:
    """A log as `seqrec.data.readers_table.read_table` gives it (or its `.interactions.frame`: columns user,
    item, timestamp and event columns): users in the order they first appear, each one's events by time
    (file order for equal or no times). A column of one of the model's event features must be numeric."""
    if isinstance(frame, RawDataset):
        frame = frame.interactions.frame
    missing = [c for c in ("user", "item") if c not in frame.columns]
    if missing:
        raise SeqrecError(f"the log has no column(s) {', '.join(missing)} (it has {', '.join(frame.columns)}): "
                          "read it with seqrec.data.readers_table.read_table, which names its columns")
    if "timestamp" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("timestamp"))
    frame = frame.with_columns(pl.col("user").cast(pl.Utf8), pl.col("item").cast(pl.Utf8)).with_row_index("_row")
    first = frame.select("user").unique(maintain_order=True).with_row_index("_user")
    timed = bool(frame["timestamp"].is_not_null().any())
    frame = frame.join(first, on="user").sort(["_user", "timestamp", "_row"] if timed else ["_user", "_row"],
                                              nulls_last=True)
    lengths = frame.group_by("_user", maintain_order=True).len()["len"].to_numpy().astype(np.int64)
    events = {}
    for c in (c for c in _event_columns(rec) if c in frame.columns):
        try:
            events[c] = frame[c].cast(pl.Float64, strict=True).to_numpy()
        except pl.exceptions.PolarsError:
            bad = frame[c].filter(frame[c].cast(pl.Float64, strict=False).is_null() & frame[c].is_not_null())[0]
            raise SeqrecError(f"column {c!r} (an event feature of the model) holds {bad!r}, not a number") from None
    return _histories(first["user"].to_list(), lengths, _catalogue_indices(rec, frame["item"]),
                      frame["timestamp"].to_numpy() if timed else None, events)


def recommend_histories(rec: Recommender, hist: Histories, k: int = 10, exclude_seen: bool = False,
                        batch_size: int = 1024) -> pl.DataFrame:
    """Top-k of every history: one row per (user, rank), users in their order, with the item, its score and
    (when the catalogue has titles) its title. A user whose history leaves fewer than k items (with
    `exclude_seen`) gets fewer, none when nothing is left. Histories are encoded shortest first, so that a
    batch is padded to about its own length (and an ANN search excludes about as many items per query)."""
    rec.check_k(k)
    if batch_size < 1:
        raise SeqrecError(f"batch size must be >= 1, got {batch_size}")
    with_events = bool(rec.model.event_feature_names())
    input_table = getattr(rec.model, "input_table", None)  # a text model's adaptor, run once for the whole job
    with torch.no_grad():
        table = input_table() if input_table is not None and rec.engine == "torch" else None
    order = np.argsort([len(h) for h in hist.items], kind="stable")
    parts = []
    for lo in tqdm(range(0, len(order), batch_size), desc="top-k", unit="batch", disable=None, leave=False):
        rows = order[lo: lo + batch_size]
        items = [hist.items[r].tolist() for r in rows]
        events = None
        if with_events:
            events = [rec.history_events(len(h), None if hist.times is None else hist.times[r],
                                         {name: v[r] for name, v in hist.events.items()})
                      for r, h in zip(rows, items, strict=True)]
        states, batch = rec.encode(items, events, table)
        values, ids = rec.top_k_padded(states, batch.items, k, [h if exclude_seen else None for h in items])
        found = ((ids > 0) & (values > -torch.inf)).numpy()  # a row with fewer items left ends in padding
        parts.append(pl.DataFrame({
            "_row": np.repeat(rows, k)[found.ravel()],
            "rank": np.tile(np.arange(1, k + 1), len(rows))[found.ravel()],
            "_idx": ids.numpy()[found].astype(np.int64),
            "score": values.numpy()[found],
        }, schema={"_row": pl.Int64, "rank": pl.Int32, "_idx": pl.Int64, "score": pl.Float32}))
    found_rows = pl.concat(parts) if parts else pl.DataFrame(schema={"_row": pl.Int64, "rank": pl.Int32,
                                                                     "_idx": pl.Int64, "score": pl.Float32})
    found_rows = found_rows.sort("_row", "rank")
    catalogue = pl.DataFrame({"item": rec.catalogue.raw_ids, "title": rec.titles},
                             schema={"item": pl.Utf8, "title": pl.Utf8})
    at = found_rows["_idx"] - 1
    frame = pl.DataFrame([pl.Series("user", hist.users, dtype=pl.Utf8).gather(found_rows["_row"]),
                          found_rows["rank"], catalogue["item"].gather(at), found_rows["score"],
                          catalogue["title"].gather(at)])
    return frame if catalogue["title"].is_not_null().any() else frame.drop("title")
