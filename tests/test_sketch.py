"""The events sketch: the same events give the same sample whatever prepared them, the hash is the
documented one (stable across machines and versions), and the containment estimate tracks the truth."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import polars as pl

from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.data.sketch import K, contained, events_sketch
from seqrec.data.types import Interactions, ItemTable, RawDataset
from tests.conftest import synthetic_log

MASK = (1 << 64) - 1


def reference_hash(user: str, item: str) -> int:
    """The sketch's event hash written out in plain integers (blake2b of each raw id, splitmix64's finaliser)."""
    def blake(raw: str) -> int:
        return int.from_bytes(hashlib.blake2b(raw.encode(), digest_size=8).digest(), "little")

    x = ((blake(user) * 0x9E3779B97F4A7C15) & MASK) ^ blake(item)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def log(pairs: list[tuple[str, str]]) -> RawDataset:
    users, items = zip(*pairs, strict=True)
    frame = pl.DataFrame({"user": users, "item": items, "timestamp": np.arange(len(pairs), dtype=float)})
    table = pl.DataFrame({"item": sorted(set(items))})
    return RawDataset(Interactions(frame, "t"), ItemTable(table, "t"), "t")


def test_the_sketch_is_the_documented_hash_of_the_raw_ids(tmp_path: Path) -> None:
    pairs = [(f"u{u}", f"i{(u * 7 + t) % 40}") for u in range(30) for t in range(6)]
    data = prepare(log(pairs), PrepareOptions(), tmp_path / "d")
    expected = sorted({reference_hash(u, i) for u, i in pairs})[:K]
    assert events_sketch(data) == [f"{v:016x}" for v in expected]


def test_the_same_events_prepared_otherwise_give_the_same_sketch(tmp_path: Path) -> None:
    raw = synthetic_log(n_users=200, n_items=50, seed=3)
    one = prepare(raw, PrepareOptions(), tmp_path / "one")
    other = prepare(raw, PrepareOptions(split="time", dedupe="first"), tmp_path / "other")
    assert one.fingerprint != other.fingerprint
    assert events_sketch(one) == events_sketch(other) and contained(events_sketch(other), events_sketch(one)) == 1.0


def test_containment_tracks_the_share_of_events_held(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    walks = [[(f"u{u}", f"i{i}") for i in rng.choice(3000, size=12, replace=False)] for u in range(1500)]
    a = prepare(log([e for w in walks for e in w[:8]]), PrepareOptions(), tmp_path / "a")
    b = prepare(log([e for w in walks for e in w[:4] + w[8:]]), PrepareOptions(), tmp_path / "b")
    share = contained(events_sketch(a), events_sketch(b))  # a's events b holds: half of them
    assert share is not None and abs(share - 0.5) < 0.08
    assert contained(events_sketch(a), events_sketch(a)) == 1.0
    tiny = prepare(log([e for w in walks[:5] for e in w[:4]]), PrepareOptions(), tmp_path / "tiny")
    assert contained(events_sketch(tiny), events_sketch(a)) is None  # too few hashes in a common range to say
