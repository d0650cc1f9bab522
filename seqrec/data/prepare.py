"""Raw interactions -> a prepared dataset folder, once.

Steps, all vectorised with Polars:
1. order: each user's events are sorted by timestamp; ties (and sources with no
   timestamps) keep the source's row order. This tie-break is deterministic.
2. dedupe (optional): "consecutive" drops an event that repeats the user's
   previous item; "first" keeps only the first event of each (user, item).
3. k-core (optional): repeatedly drop users and items with fewer than k events
   until none is left.
4. users with fewer than `min_user_len` events are dropped (leave-one-out needs 3).
5. id map: items become 1..N (0 is padding), users 0..U-1, both in sorted order
   of their raw ids (numeric order when every id is an integer). When the item table
   is the catalogue (`seqrec.data.item_table`), its items left without interactions
   follow as N+1.., in the same order.
6. split: leave-one-out (last event test, second-to-last validation), or the
   source's own split when the input is pre-split (UniSRec files), kept exactly, or
   a global time split ("time"): two cutoffs at the time quantiles 1 - test_frac -
   valid_frac and 1 - test_frac of all events; a user's test target is their first
   event at or after the test cutoff, their validation target their first event in
   [validation cutoff, test cutoff), each only when an earlier event of theirs exists.
   Training takes what comes before the validation cutoff, so no model learns from the
   future of the period it is evaluated on; a user's events after their target are not
   used. Histories at evaluation are every earlier event.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl

from seqrec.data.dataset import PreparedDataset, write_prepared
from seqrec.data.types import RawDataset
from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)


@dataclass
class PrepareOptions:
    """How `prepare` filters and splits: dedupe, k-core, shortest user, and the split."""

    dedupe: Literal["none", "consecutive", "first"] = "none"
    kcore: int = 0  # 0 or 1: no filtering
    min_user_len: int = 3
    split: Literal["leave-one-out", "time"] = "leave-one-out"  # a pre-split source keeps its own
    test_frac: float = 0.1  # time split: the share of events at or after the test cutoff
    valid_frac: float = 0.1  # time split: the share of events in [validation cutoff, test cutoff)

    def __post_init__(self) -> None:
        if self.dedupe not in ("none", "consecutive", "first"):
            raise SeqrecError(f"dedupe must be none, consecutive or first, got {self.dedupe!r}")
        # each message names the field and its `seqrec data prepare` flag
        if self.kcore < 0:
            raise SeqrecError(f"kcore (--kcore) must be >= 0, got {self.kcore}")
        if self.min_user_len < 1:
            raise SeqrecError(f"min_user_len (--min-user-len) must be >= 1, got {self.min_user_len}")
        if self.split not in ("leave-one-out", "time"):
            raise SeqrecError(f"split must be leave-one-out or time, got {self.split!r}")
        if not (0 < self.test_frac < 1 and 0 < self.valid_frac < 1 and self.test_frac + self.valid_frac < 1):
            raise SeqrecError(f"test_frac (--test-frac) and valid_frac (--valid-frac) must be in (0, 1) with a sum "
                              f"below 1, got {self.test_frac:g} and {self.valid_frac:g}")


def order_events(frame: pl.DataFrame) -> pl.DataFrame:
    """Sort by user, then timestamp (nulls last), then source row order."""
    frame = frame.with_row_index("_row")
    return frame.sort(["user", "timestamp", "_row"], nulls_last=True)


def dedupe(frame: pl.DataFrame, how: str) -> pl.DataFrame:
    if how == "consecutive":
        repeat = (pl.col("item") == pl.col("item").shift(1)) & (
            pl.col("user") == pl.col("user").shift(1)
        )
        return frame.filter(~repeat.fill_null(False))
    if how == "first":
        return frame.unique(subset=["user", "item"], keep="first", maintain_order=True)
    return frame


def kcore(frame: pl.DataFrame, k: int) -> pl.DataFrame:
    """Iteratively keep users and items with at least k events."""
    if k <= 1:
        return frame
    while True:
        before = frame.height
        frame = frame.filter(
            (pl.len().over("user") >= k) & (pl.len().over("item") >= k)
        )
        if frame.height == before:
            return frame


def _index_map(ids: pl.Series, start: int) -> pl.DataFrame:
    """Sorted unique raw ids -> consecutive ints from `start`."""
    table = pl.DataFrame({"id": ids.unique()}).with_columns(num=pl.col("id").cast(pl.Int64, strict=False))
    uniq = table.sort("num" if table["num"].null_count() == 0 else "id")["id"].rename(str(ids.name))
    return pl.DataFrame({ids.name: uniq, "idx": np.arange(start, start + len(uniq), dtype=np.int64)})


def _split_positions(frame: pl.DataFrame, offsets: np.ndarray, source: str) -> np.ndarray:
    """(U, 2) positions of the validation and test targets in each user's sequence."""
    lengths = np.diff(offsets)
    if "split" not in frame.columns:
        return np.stack([lengths - 2, lengths - 1], axis=1)
    split = frame["split"].to_numpy()
    pos_in_user = np.arange(frame.height) - np.repeat(offsets[:-1], lengths)
    out = np.full((len(lengths), 2), -1, dtype=np.int64)
    users = frame["uidx"].to_numpy()
    for col, name in enumerate(("valid", "test")):
        rows = np.flatnonzero(split == name)
        counts = np.bincount(users[rows], minlength=len(lengths))
        if (counts > 1).any():
            raise SeqrecError(f"{source}: a user has more than one '{name}' event")
        out[users[rows], col] = pos_in_user[rows]
    has_test = out[:, 1] >= 0
    want_valid = np.where(has_test, lengths - 2, lengths - 1)
    if ((out[:, 1] >= 0) & (out[:, 1] != lengths - 1)).any() or (
        (out[:, 0] >= 0) & (out[:, 0] != want_valid)
    ).any():
        raise SeqrecError(f"{source}: pre-split events must end with validation then test")
    return out


def time_split(times: np.ndarray, offsets: np.ndarray, options: PrepareOptions) -> tuple[np.ndarray, dict]:
    """(U, 2) validation / test target positions of a global time split, and the cutoffs used."""
    valid_from, test_from = np.quantile(times, [1 - options.test_frac - options.valid_frac, 1 - options.test_frac],
                                        method="lower")
    lengths = np.diff(offsets)
    users = np.repeat(np.arange(len(lengths)), lengths)
    pos = np.arange(len(times)) - offsets[users]
    out = np.full((len(lengths), 2), -1, dtype=np.int64)
    for col, inside in enumerate(((times >= valid_from) & (times < test_from), times >= test_from)):
        rows = np.flatnonzero(inside & (pos >= 1))  # a target needs an earlier event
        first = np.full(len(lengths), np.iinfo(np.int64).max)
        np.minimum.at(first, users[rows], pos[rows])
        out[:, col] = np.where(first < np.iinfo(np.int64).max, first, -1)
    return out, {"valid_from": valid_from.item(), "test_from": test_from.item()}


def prepare(raw: RawDataset, options: PrepareOptions, dest: Path) -> PreparedDataset:
    """A reader's output -> the prepared-dataset folder `dest` (written atomically) and its view:
    order, dedupe, k-core, id maps and split, as the module docstring describes. The dataset is named after
    its folder, the name `--dataset` finds it by (two preparations of one source are told apart)."""
    dest = Path(dest)
    raw = replace(raw, name=dest.resolve().name or raw.name)
    frame = raw.interactions.frame
    source = raw.interactions.source
    presplit = "split" in frame.columns
    if presplit and (options.kcore > 1 or options.dedupe != "none" or options.split != "leave-one-out"):
        raise SeqrecError(
            f"{source}: the input is pre-split; filtering or another split would change its split "
            "(leave --kcore, --dedupe and --split at their defaults: kcore=0, dedupe=none, leave-one-out)"
        )
    if not presplit and options.split == "leave-one-out" and options.min_user_len < 3:
        raise SeqrecError(f"{source}: leave-one-out holds out each user's last two events (validation, test) and "
                          f"trains on the ones before, so a user needs at least 3: --min-user-len must be >= 3, got "
                          f"{options.min_user_len} (its users would be tested on an empty history)")
    if options.split == "time" and frame["timestamp"].null_count():
        raise SeqrecError(f"{source}: a time split needs timestamps (--time-col), and "
                          f"{frame['timestamp'].null_count()} of {frame.height} events have none")
    n_raw = frame.height
    frame = dedupe(order_events(frame), options.dedupe)
    n_deduped = frame.height
    frame = kcore(frame, options.kcore)
    n_cored = frame.height
    long_enough = pl.len().over("user") >= options.min_user_len
    n_short = frame.filter(~long_enough)["user"].n_unique()
    frame = frame.filter(long_enough)
    dropped = [said for n, said in (
        (n_raw - n_deduped, f"dedupe={options.dedupe}: {n_raw - n_deduped} events"),
        (n_deduped - n_cored, f"kcore={options.kcore}: {n_deduped - n_cored} events"),
        (n_short, f"min_user_len={options.min_user_len}: {n_short} users with fewer events "
                  f"({n_cored - frame.height} events)")) if n]
    if frame.height == 0:
        raise SeqrecError(
            f"{source}: no interactions left after filtering "
            f"(dedupe={options.dedupe}, kcore={options.kcore}, min_user_len={options.min_user_len})"
        )
    items = _index_map(frame["item"], start=1)
    if raw.catalogue is not None and raw.items is not None:  # the item table is the catalogue: keep the rest
        unused = raw.items.frame.filter(~pl.col("item").is_in(items["item"].implode()))["item"]
        kept = _index_map(unused, start=items.height + 1)
        items = pl.concat([items, kept])
        if kept.height:
            log.info("%d catalogue item(s) without interactions kept as items %d..%d", kept.height,
                     items.height - kept.height + 1, items.height)
    if items.height < 2:
        raise SeqrecError(f"{source}: only one distinct item ({items['item'][0]!r}) is left after filtering: "
                          "there is nothing to rank or recommend")
    users = _index_map(frame["user"], start=0)
    frame = (
        frame.join(items.rename({"idx": "iidx"}), on="item", how="left")
        .join(users.rename({"idx": "uidx"}), on="user", how="left")
        .sort(["uidx", "timestamp", "_row"], nulls_last=True)
    )
    counts = np.bincount(frame["uidx"].to_numpy(), minlength=users.height)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    split_info: dict = {"split": "presplit" if presplit else "leave-one-out"}
    if options.split == "time":
        split, cutoffs = time_split(frame["timestamp"].to_numpy(), offsets, options)
        split_info = {"split": "time", **cutoffs}
    else:
        split = _split_positions(frame, offsets, source)
    item_table = items
    if raw.items is not None:
        item_table = item_table.join(raw.items.frame, on="item", how="left")
    times = frame["timestamp"].to_numpy() if raw.interactions.has_time else None
    extra = [c for c in frame.columns if c not in ("user", "item", "timestamp", "split", "_row", "iidx", "uidx")]
    log.info("prepared %s: %d -> %d interactions%s", raw.name, n_raw, frame.height,
             f" (dropped: {'; '.join(dropped)})" if dropped else "")
    return write_prepared(
        dest,
        name=raw.name,
        source=source,
        items=frame["iidx"].to_numpy().astype(np.int32),
        offsets=offsets,
        split=split,
        times=times,
        item_table=item_table.sort("idx"),
        users=users.sort("idx"),
        events={c: frame[c] for c in extra},
        options={**asdict(options), **split_info, "raw_interactions": n_raw},
        catalogue=raw.catalogue,
    )
