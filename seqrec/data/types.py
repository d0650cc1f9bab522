"""The two tables every reader returns.

`Interactions.frame` columns:
    user       Utf8     raw user id
    item       Utf8     raw item id
    timestamp  Float64  seconds (or any monotone clock); null when the source has order only
    split      Utf8     optional: "train" / "valid" / "test" for sources that come pre-split
    ...        any extra event-level columns (e.g. rating) are kept as they are
Row order is meaningful: it is the source's own order, and `prepare` uses it to
break timestamp ties (and as the only order when timestamps are null).

`ItemTable.frame` columns: `item` (Utf8, unique) plus item fields such as
`title`, `categories`, `brand`, `description` (Utf8) and any other attributes.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from seqrec.errors import SeqrecError

INTERACTION_COLUMNS = ("user", "item", "timestamp")


@dataclass(frozen=True)
class Interactions:
    frame: pl.DataFrame
    source: str

    def __post_init__(self) -> None:
        missing = [c for c in INTERACTION_COLUMNS if c not in self.frame.columns]
        if missing:
            raise SeqrecError(f"{self.source}: interactions lack column(s) {missing}")
        if self.frame.schema["user"] != pl.Utf8 or self.frame.schema["item"] != pl.Utf8:
            raise SeqrecError(f"{self.source}: user and item columns must be strings")
        if self.frame.schema["timestamp"] != pl.Float64:
            raise SeqrecError(f"{self.source}: timestamp column must be Float64")
        if "split" in self.frame.columns:
            bad = set(self.frame["split"].unique().to_list()) - {"train", "valid", "test"}
            if bad:
                raise SeqrecError(f"{self.source}: unknown split value(s) {sorted(bad)}")

    @property
    def has_time(self) -> bool:
        return self.frame["timestamp"].null_count() < self.frame.height


@dataclass(frozen=True)
class ItemTable:
    frame: pl.DataFrame
    source: str

    def __post_init__(self) -> None:
        if "item" not in self.frame.columns or self.frame.schema["item"] != pl.Utf8:
            raise SeqrecError(f"{self.source}: item table needs a string 'item' column")
        if self.frame["item"].n_unique() != self.frame.height:
            raise SeqrecError(f"{self.source}: item table has duplicate item ids")


@dataclass(frozen=True)
class RawDataset:
    """What a reader returns: the log and, when the source has one, the item table."""

    interactions: Interactions
    items: ItemTable | None
    name: str
    # Set when the item table is the catalogue (`seqrec.data.item_table`): its items with no interaction
    # are kept by `prepare`; the dict is the join report recorded in the prepared dataset's meta.
    catalogue: dict | None = None
