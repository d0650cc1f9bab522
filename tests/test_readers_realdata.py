"""Every dataset in ../shared/data read through the catalog: exact counts from its SOURCES.md.

The data folder is `../shared/data` next to the repository, or `$SEQREC_SHARED_DATA`.
Each test skips, saying which folder is missing, when the data is not on this machine.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import polars as pl
import pytest

from seqrec.data.catalog import KNOWN_DATASETS, load_known
from seqrec.data.types import RawDataset

pytestmark = pytest.mark.realdata

SHARED_DATA = Path(
    os.environ.get("SEQREC_SHARED_DATA")
    or Path(__file__).resolve().parents[1].parent / "shared" / "data"
)

# name -> (users, items, interactions), as stated in each SOURCES.md
COUNTS = {
    "ml-100k": (943, 1682, 100000),
    "amazon-beauty-p5": (22363, 12101, 198502),
    "amazon-sports-p5": (35598, 18357, 296337),
    "yelp-p5": (30431, 20033, 316354),
    "lastfm-s3rec": (1090, 3646, 52551),
    "amazon-scientific-unisrec": (8442, 4385, 59427),
    "amazon-instruments-2018-idonly": (17112, 6250, 136226),
    "amazon-scientific-2018-lcrec": (8317, 4344, 58492),
    "amazon-arts-2018-idonly": (22171, 9416, 174079),
    "diginetica-sample": (2986, 7139, 12391),
    "amazon-games-2018": (50546, 16859, 440264),
}
# name -> (item table column, rows with non-empty text), None when the build has no text
TEXT = {
    "ml-100k": ("title", 1682),
    "amazon-beauty-p5": ("title", 12100),  # one ASIN has empty pseudo-text (coverage 0.9999)
    "amazon-sports-p5": ("title", 18357),
    "yelp-p5": ("title", 20033),
    "lastfm-s3rec": None,
    "amazon-scientific-unisrec": ("text", 4385),
    "amazon-instruments-2018-idonly": None,
    "amazon-scientific-2018-lcrec": ("title", 4344),
    "amazon-arts-2018-idonly": None,
    "diginetica-sample": None,
    "amazon-games-2018": ("title", 16859),
}
TIMED = {"ml-100k", "diginetica-sample"}
_CACHE: dict[str, RawDataset] = {}


def load(name: str) -> RawDataset:
    folder = SHARED_DATA / name
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent (set SEQREC_SHARED_DATA to the shared data folder)")
    if name not in _CACHE:
        _CACHE[name] = load_known(name, SHARED_DATA)
    return _CACHE[name]


def test_every_known_dataset_has_expectations() -> None:
    assert set(COUNTS) == set(KNOWN_DATASETS) == set(TEXT)


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_counts_match_sources(name: str) -> None:
    raw = load(name)
    frame = raw.interactions.frame
    users, items, interactions = COUNTS[name]
    assert raw.name == name
    assert frame["user"].n_unique() == users
    assert frame["item"].n_unique() == items
    assert frame.height == interactions
    assert raw.interactions.has_time == (name in TIMED)
    assert frame["timestamp"].null_count() == (0 if name in TIMED else interactions)


@pytest.mark.parametrize("name", sorted(TEXT))
def test_item_text_coverage(name: str) -> None:
    raw = load(name)
    if TEXT[name] is None:
        assert raw.items is None
        return
    column, with_text = TEXT[name]
    assert raw.items is not None
    table = raw.items.frame
    assert table.height == COUNTS[name][1]
    assert table[column].drop_nulls().str.strip_chars().ne("").sum() == with_text
    # every interacted item has a row in the item table
    seen = raw.interactions.frame.select(pl.col("item").unique())
    assert seen.join(table, on="item", how="anti").height == 0


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_counts_agree_with_sources_md(name: str) -> None:
    """The table above is the one SOURCES.md verifies (guards against a stale copy)."""
    sources = SHARED_DATA / name / "SOURCES.md"
    if not sources.is_file():
        pytest.skip(f"{sources} is absent")
    text = sources.read_text()
    block = re.search(r"```json\n(.*?)```", text, re.DOTALL)
    if block is None:  # stated in prose: "N users, N items, N interactions"
        found = re.search(r"([\d,]+) users, ([\d,]+) items, ([\d,]+) interactions", text)
        assert found is not None, f"{sources} states no counts"
        assert tuple(int(g.replace(",", "")) for g in found.groups()) == COUNTS[name]
        return
    stats = json.loads(block.group(1))[name]
    stats = stats.get("full_reconstruction", stats)
    users = stats.get("users", stats.get("sessions"))
    interactions = stats.get("interactions", stats.get("rows"))
    assert (users, stats["items"], interactions) == COUNTS[name]


def test_unisrec_splits() -> None:
    for name in ("amazon-scientific-unisrec", "amazon-instruments-2018-idonly"):
        raw = load(name)
        frame = raw.interactions.frame
        users, _, interactions = COUNTS[name]
        counts = dict(frame.group_by("split").len().iter_rows())
        assert counts == {"train": interactions - 2 * users, "valid": users, "test": users}
        # the last two events of every user are its valid then test target
        tails = frame.group_by("user", maintain_order=True).agg(pl.col("split").tail(2))
        assert tails["split"].to_list() == [["valid", "test"]] * users
    first = load("amazon-scientific-unisrec").interactions.frame.row(0)
    assert first == ("ABW8NXS7SV55K", "B00TNNWMXI", None, "train")


def test_spot_values() -> None:
    ml = load("ml-100k")
    assert ml.interactions.frame.row(0) == ("196", "242", 881250949.0, 3.0)
    assert ml.items is not None
    assert ml.items.frame.row(0) == (
        "1",
        "Toy Story",
        "1995",
        "Animation, Children's, Comedy",
    )
    yelp = load("yelp-p5")
    assert yelp.items is not None
    assert yelp.items.frame.row(0) == (
        "1",
        "The Great Greek",
        "Diners, Greek, Mediterranean, Restaurants",
    )
    beauty = load("amazon-beauty-p5")
    assert beauty.items is not None
    row = beauty.items.frame.filter(pl.col("asin") == "B000P24EI2").row(0, named=True)
    assert row["title"] == "rene furterer complexe 5"
    digi = load("diginetica-sample").interactions.frame
    assert digi.row(0) == ("1", "81766", 1462752000.0 + 526.309)  # 2016-05-09 + 526,309 ms
    day = 86400.0
    assert digi["timestamp"].min() // day * day == 1451779200.0  # 2016-01-03
    assert digi["timestamp"].max() // day * day == 1464739200.0  # 2016-06-01


def test_ml100k_recbole_layout_equals_raw() -> None:
    if not (SHARED_DATA / "ml-100k" / "recbole").is_dir():
        pytest.skip(f"{SHARED_DATA / 'ml-100k' / 'recbole'} is absent")
    raw = load("ml-100k").interactions.frame
    recbole = load_known("ml-100k", SHARED_DATA / "ml-100k" / "recbole")
    assert_columns = ["user", "item", "timestamp", "rating"]
    assert recbole.interactions.frame.select(assert_columns).equals(raw.select(assert_columns))
    assert recbole.items is not None
    assert recbole.items.frame.columns == ["item", "title", "year", "categories"]
    assert recbole.items.frame.row(0) == ("1", "Toy Story", "1995", "Animation, Children's, Comedy")
    # one item table from either source: all but RecBole's own two edits ('unkonwn'; a "(V)" dropped)
    raw_items = load("ml-100k").items
    assert raw_items is not None
    differ = raw_items.frame.join(recbole.items.frame, on="item", suffix="_recbole").filter(
        pl.any_horizontal(pl.col(c).ne_missing(pl.col(f"{c}_recbole")) for c in ("title", "year", "categories")))
    assert differ["title"].to_list() == ["unknown", "Land Before Time III: The Time of the Great Giving (1995) (V)"]


def test_games_sequences_rebuild_the_files_splits() -> None:
    """Leave-one-out on the rebuilt Games sequences gives back both files' targets and histories."""
    frame = load("amazon-games-2018").interactions.frame
    seqs = dict(frame.group_by("user", maintain_order=True).agg("item").iter_rows())
    folder = SHARED_DATA / "amazon-games-2018"
    for split, back in (("test", 1), ("valid", 2)):
        lines = (folder / f"Games-6k.{split}.inter").read_text().splitlines()[1:]
        for line in lines[:: len(lines) // 200]:
            user, history, target = line.split("\t")
            seq = seqs[user]
            assert seq[-back] == target
            assert seq[: len(seq) - back][-len(history.split()):] == history.split()
