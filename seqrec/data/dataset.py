"""The prepared-dataset folder and its in-memory view.

Folder layout (everything a later command needs, nothing pickled):
    meta.json          name, source, counts, options, split, fingerprint, catalogue (the item-table join)
    items.parquet      idx (1..N), item (raw id), item fields (title, ...)
    users.parquet      idx (0..U-1), user (raw id)
    seq_offsets.npy    (U+1,) int64   CSR offsets into seq_items
    seq_items.npy      (E,)   int32   item index of every event, users in order, time order inside
    seq_time.npy       (E,)   float64 timestamps (only when the source has them)
    split.npy          (U, 2) int64   position of the validation / test target in each sequence (-1: none)
    events.parquet     extra event-level columns (rating, ...), one row per event (optional)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from seqrec import __version__
from seqrec.data.io import atomic_dir, read_json
from seqrec.errors import SeqrecError

FORMAT_VERSION = 1


def fingerprint(items: np.ndarray, offsets: np.ndarray, split: np.ndarray, raw_ids: list[str]) -> str:
    h = hashlib.sha256()
    for arr in (items.astype(np.int64), offsets.astype(np.int64), split.astype(np.int64)):
        h.update(np.ascontiguousarray(arr).tobytes())
    h.update("\n".join(raw_ids).encode())
    return h.hexdigest()[:16]


def write_prepared(
    dest: Path,
    *,
    name: str,
    source: str,
    items: np.ndarray,
    offsets: np.ndarray,
    split: np.ndarray,
    times: np.ndarray | None,
    item_table: pl.DataFrame,
    users: pl.DataFrame,
    events: dict[str, pl.Series],
    options: dict[str, Any],
    catalogue: dict[str, Any] | None = None,
) -> PreparedDataset:
    raw_ids = item_table["item"].to_list()
    meta = {
        "format_version": FORMAT_VERSION,
        "seqrec_version": __version__,
        "name": name,
        "source": source,
        "n_users": int(len(offsets) - 1),
        "n_items": int(item_table.height),
        "n_interactions": len(items),
        "has_time": times is not None,
        "item_fields": [c for c in item_table.columns if c not in ("idx", "item")],
        "options": options,
        "fingerprint": fingerprint(items, offsets, split, raw_ids),
    }
    if catalogue is not None:
        meta["catalogue"] = catalogue
    with atomic_dir(Path(dest)) as tmp:
        np.save(tmp / "seq_items.npy", items)
        np.save(tmp / "seq_offsets.npy", offsets)
        np.save(tmp / "split.npy", split)
        if times is not None:
            np.save(tmp / "seq_time.npy", times.astype(np.float64))
        item_table.write_parquet(tmp / "items.parquet")
        users.write_parquet(tmp / "users.parquet")
        if events:
            pl.DataFrame(events).write_parquet(tmp / "events.parquet")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return PreparedDataset.load(Path(dest))


@dataclass
class PreparedDataset:
    """A prepared dataset in memory: every user's events as one CSR array (`items`, `offsets`), the
    split (validation and test target positions), optional times, and the item table on demand."""

    path: Path
    meta: dict[str, Any]
    items: np.ndarray  # (E,) int32
    offsets: np.ndarray  # (U+1,) int64
    split: np.ndarray  # (U, 2) int64
    times: np.ndarray | None
    _item_table: pl.DataFrame | None = field(default=None, repr=False)
    # (U,) bool: the users whose events are training data (None: every user); see `with_training_users`
    training_users: np.ndarray | None = field(default=None, repr=False)
    # the validation events are training data too (`with_valid_as_training`, the refit before the test)
    valid_in_training: bool = field(default=False, repr=False)

    @classmethod
    def load(cls, path: Path) -> PreparedDataset:
        """The prepared-dataset folder at `path`; a missing or damaged file is a one-line error."""
        path = Path(path)
        if not (path / "meta.json").is_file():
            raise SeqrecError(f"{path}: not a prepared dataset (no meta.json); run `seqrec data prepare`")
        meta = read_json(path / "meta.json")
        if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
            raise SeqrecError(f"{path}: prepared with an incompatible format; prepare it again")
        for name in ("items.parquet", "users.parquet", "seq_items.npy", "seq_offsets.npy", "split.npy"):
            if not (path / name).is_file():
                raise SeqrecError(f"{path / name}: missing from the prepared dataset; prepare it again")

        def load(name: str) -> np.ndarray:
            try:
                return np.load(path / name, allow_pickle=False)
            except (OSError, ValueError) as exc:  # truncated, or not an array
                raise SeqrecError(f"{path / name}: damaged ({exc}); prepare the dataset again") from None

        times = load("seq_time.npy") if (path / "seq_time.npy").exists() else None
        return cls(path, meta, load("seq_items.npy"), load("seq_offsets.npy"), load("split.npy"), times)

    @property
    def n_items(self) -> int:
        """Items in the catalogue (1..N; 0 is padding)."""
        return int(self.meta["n_items"])

    @property
    def n_users(self) -> int:
        """Users (0..U-1)."""
        return int(self.meta["n_users"])

    @property
    def fingerprint(self) -> str:
        """A hash of the sequences, split and item ids: runs record it to refuse other data."""
        return str(self.meta["fingerprint"])

    @property
    def lengths(self) -> np.ndarray:
        """(U,) events per user."""
        return np.diff(self.offsets)

    @property
    def item_table(self) -> pl.DataFrame:
        """idx, item (raw id) and the item fields, read once."""
        if self._item_table is None:
            try:
                self._item_table = pl.read_parquet(self.path / "items.parquet")
            except (OSError, pl.exceptions.PolarsError) as exc:
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise SeqrecError(f"{self.path / 'items.parquet'}: damaged ({reason}); prepare the dataset again"
                                  ) from None
        return self._item_table

    def with_valid_as_training(self) -> PreparedDataset:
        """The same data with each user's validation event moved into training (for a refit before test)."""
        split = self.split.copy()
        split[:, 0] = -1
        return replace(self, split=split, valid_in_training=True)

    def with_training_users(self, fraction: float, seed: int) -> PreparedDataset:
        """The same data with the training events of only a seeded random `fraction` of the users (at least
        one); every user keeps their validation and test targets and, at evaluation, their whole history.
        For data-efficiency studies: how good is a model that learnt from fewer users?"""
        if not 0 < fraction <= 1:
            raise SeqrecError(f"the fraction of training users must be in (0, 1], got {fraction}")
        if fraction == 1:
            return replace(self, training_users=None)
        n = max(1, round(fraction * self.n_users))
        keep = np.zeros(self.n_users, dtype=bool)
        keep[np.random.default_rng(seed).choice(self.n_users, size=n, replace=False)] = True
        return replace(self, training_users=keep)

    def train_end(self) -> np.ndarray:
        """(U,) number of leading events of each user that are training data."""
        valid, test = self.split[:, 0], self.split[:, 1]
        lengths = self.lengths
        end = np.where(valid >= 0, valid, np.where(test >= 0, test, lengths))
        options = self.meta.get("options", {})
        if options.get("split") == "time" and self.times is not None:  # nothing from the evaluated periods,
            # not even a user's first event there (an input with no target, but it counts for popularity)
            cutoff = options["test_from" if self.valid_in_training else "valid_from"]
            users = np.repeat(np.arange(len(lengths)), lengths)
            before = np.bincount(users, weights=self.times < cutoff, minlength=len(lengths)).astype(np.int64)
            end = np.minimum(end, before)
        return end if self.training_users is None else np.where(self.training_users, end, 0)

    def eval_positions(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        """Users that have a `which` ("valid" or "test") target, and its position."""
        col = {"valid": 0, "test": 1}[which]
        pos = self.split[:, col]
        users = np.flatnonzero(pos >= 0)
        return users, pos[users]

    def repeat_rates(self) -> dict[str, float]:
        """Over the training events that have an earlier event of the same user: the share whose item the
        user already had (`repeat_rate`) and the share that repeat the item just before (`consecutive`).
        Whether users return to items decides, e.g., whether a history bias should push seen items down."""
        lengths = self.lengths
        users = np.repeat(np.arange(self.n_users), lengths)
        pos = np.arange(len(self.items)) - np.repeat(self.offsets[:-1], lengths)
        training = pos < np.repeat(self.train_end(), lengths)
        key = users.astype(np.int64) * (self.n_items + 1) + self.items
        first = np.zeros(len(key), dtype=bool)
        first[np.unique(key, return_index=True)[1]] = True  # np.unique keeps the first occurrence's index
        later = training & (pos > 0)
        consecutive = np.zeros(len(key), dtype=bool)
        consecutive[1:] = (key[1:] == key[:-1]) & (pos[1:] > 0)
        n = max(1, int(later.sum()))
        return {"repeat_rate": float((later & ~first).sum() / n),
                "consecutive_repeat_rate": float((later & consecutive).sum() / n)}

    def stats(self) -> dict[str, Any]:
        """Counts, length percentiles, repeat rates and the catalogue join: what `seqrec data stats` prints."""
        lengths = self.lengths
        q = np.percentile(lengths, [0, 25, 50, 75, 90, 99, 100]).tolist()
        n_users, n_items = self.n_users, self.n_items
        counts = np.bincount(self.items, minlength=n_items + 1)[1:]
        return {
            "name": self.meta["name"],
            "users": n_users,
            "items": n_items,
            "interactions": len(self.items),
            "density": len(self.items) / max(1, n_users * n_items),
            "length_mean": float(lengths.mean()),
            "length_percentiles": dict(zip(["min", "p25", "p50", "p75", "p90", "p99", "max"], q, strict=True)),
            "split": self.meta["options"].get("split"),
            "valid_users": int((self.split[:, 0] >= 0).sum()),
            "test_users": int((self.split[:, 1] >= 0).sum()),
            "items_without_interactions": int((counts == 0).sum()),
            **self.repeat_rates(),
            "fingerprint": self.fingerprint,
            **({"catalogue": self.meta["catalogue"]} if "catalogue" in self.meta else {}),
        }
