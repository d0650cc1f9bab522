"""Readers and catalog on small hand-written files: exact frames and exact errors."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from seqrec.data.catalog import KNOWN_DATASETS, load_format, load_known
from seqrec.data.readers import (
    read_diginetica,
    read_lcrec,
    read_movielens,
    read_p5_pseudo_text,
    read_recbole,
    read_s3rec,
    read_unisrec,
    read_yelp_items,
)
from seqrec.errors import SeqrecError

NULL_TIME = pl.lit(None, dtype=pl.Float64)


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding=encoding)
    return path


def events(
    users: list[str], items: list[str], times: list[float | None], **extra: list
) -> pl.DataFrame:
    frame = pl.DataFrame(
        {"user": users, "item": items, "timestamp": times, **extra},
        schema_overrides={"user": pl.Utf8, "item": pl.Utf8, "timestamp": pl.Float64},
    )
    return frame


# ---------------------------------------------------------------- MovieLens


def _movielens_folder(root: Path, genre_file: bool = True) -> Path:
    write(root / "u.data", "196\t242\t3\t881250949\n186\t302\t4.5\t891717742\n")
    flags_a = "|".join(["0"] * 3 + ["1", "1"] + ["0"] * 14)  # Animation, Children's
    flags_b = "|".join(["1"] + ["0"] * 18)
    flags_c = "|".join(["0"] * 19)
    write(
        root / "u.item",
        f"242|Kolya (1996)|24-Jan-1997||http://x|{flags_a}\n"
        f"302|Land Before Time III (1995) (V)|01-Jan-1995||http://y|{flags_b}\n"
        f"267|Caf\u00e9 unknown||||{flags_c}\n",
        encoding="latin-1",
    )
    if genre_file:
        names = [
            "unknown",
            "Action",
            "Adventure",
            "Animation",
            "Children's",
            "Comedy",
            "Crime",
            "Documentary",
            "Drama",
            "Fantasy",
            "Film-Noir",
            "Horror",
            "Musical",
            "Mystery",
            "Romance",
            "Sci-Fi",
            "Thriller",
            "War",
            "Western",
        ]
        write(root / "u.genre", "".join(f"{n}|{i}\n" for i, n in enumerate(names)) + "\n")
    return root


@pytest.mark.parametrize("genre_file", [True, False])
def test_movielens_frames(tmp_path: Path, genre_file: bool) -> None:
    raw = read_movielens(_movielens_folder(tmp_path, genre_file))
    expected = events(["196", "186"], ["242", "302"], [881250949.0, 891717742.0], rating=[3.0, 4.5])
    assert_frame_equal(raw.interactions.frame, expected)
    assert raw.items is not None
    items = pl.DataFrame(
        {
            "item": ["242", "302", "267"],
            "title": ["Kolya", "Land Before Time III (1995) (V)", "Café unknown"],  # a closing (YYYY) is the year
            "year": ["1996", "1995", None],
            "categories": ["Animation, Children's", "unknown", None],
        },
        schema={c: pl.Utf8 for c in ("item", "title", "year", "categories")},
    )
    assert_frame_equal(raw.items.frame, items)
    assert raw.name == "ml-100k"


def test_movielens_errors(tmp_path: Path) -> None:
    folder = _movielens_folder(tmp_path)
    write(folder / "u.data", "1\t2\t3\t4\n1\t2\t3\n")
    with pytest.raises(SeqrecError, match=r"u\.data, line 2: expected 4 TAB-separated fields"):
        read_movielens(folder)
    write(folder / "u.data", "1\t2\t3\t4\n\n1\t2\tgood\t5\n")
    with pytest.raises(SeqrecError, match=r"u\.data, line 3: rating value 'good' is not a number"):
        read_movielens(folder)
    with pytest.raises(SeqrecError, match=r"u\.data: MovieLens ratings file not found"):
        read_movielens(tmp_path / "nowhere")


# ---------------------------------------------------------------- RecBole


def _recbole_folder(root: Path) -> Path:
    write(
        root / "toy.inter",
        "user_id:token\titem_id:token\trating:float\ttimestamp:float\tdevice:token\n"
        "u1\ti1\t3\t100\tweb\nu1\ti2\t4\t90.5\tapp\nu2\ti1\t5\t80\tweb\n",
    )
    write(
        root / "toy.item",
        "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\tstudio:token\n"
        "i1\tToy Story\t1995\tAnimation Children's Comedy\tPixar\ni2\tHeat\t1995\tAction\t\n",
    )
    return root


def test_recbole_frames(tmp_path: Path) -> None:
    folder = _recbole_folder(tmp_path / "toy")
    for source in (folder, folder / "toy", folder / "toy.inter"):
        raw = read_recbole(source)
        expected = events(
            ["u1", "u1", "u2"],
            ["i1", "i2", "i1"],
            [100.0, 90.5, 80.0],
            rating=[3.0, 4.0, 5.0],
            device=["web", "app", "web"],
        )
        assert_frame_equal(raw.interactions.frame, expected)
        assert raw.name == "toy"
    assert raw.items is not None
    items = pl.DataFrame(
        {
            "item": ["i1", "i2"],
            "title": ["Toy Story", "Heat"],
            "year": ["1995", "1995"],
            "categories": ["Animation, Children's, Comedy", "Action"],
            "studio": ["Pixar", None],
        },
        schema={c: pl.Utf8 for c in ("item", "title", "year", "categories", "studio")},
    )
    assert_frame_equal(raw.items.frame, items)


def test_recbole_without_time_or_items(tmp_path: Path) -> None:
    write(tmp_path / "s.inter", "session_id:token\titem_id:token\ns1\ta\ns1\tb\n")
    raw = read_recbole(tmp_path)
    assert_frame_equal(raw.interactions.frame, events(["s1", "s1"], ["a", "b"], [None, None]))
    assert raw.items is None


def test_recbole_fields_named_as_recbole_names_them(tmp_path: Path) -> None:
    """USER_ID_FIELD / ITEM_ID_FIELD / TIME_FIELD other than RecBole's defaults: --user-col, --item-col,
    --time-col (the item field names the item file's too)."""
    write(tmp_path / "d.inter", "uid:token\tiid:token\tts:float\nu1\ta\t2\nu1\tb\t1\n")
    write(tmp_path / "d.item", "iid:token\ttitle:token_seq\na\tThe A\nb\tThe B\n")
    raw = read_recbole(tmp_path, user_col="uid", item_col="iid", time_col="ts")
    assert_frame_equal(raw.interactions.frame, events(["u1", "u1"], ["a", "b"], [2.0, 1.0]))
    assert raw.items is not None and raw.items.frame["item"].to_list() == ["a", "b"]
    assert raw.items.frame["title"].to_list() == ["The A", "The B"]
    (tmp_path / "e").mkdir()
    write(tmp_path / "e" / "e.inter", "uid:token\tiid:token\tts:float\ttimestamp:float\nu1\ta\t2\t9\nu1\tb\t1\t8\n")
    other = read_recbole(tmp_path / "e", user_col="uid", item_col="iid", time_col="ts")  # `timestamp` left out
    assert other.interactions.frame["timestamp"].to_list() == [2.0, 1.0]
    with pytest.raises(SeqrecError, match=r"d\.inter: no field 'when' \(the time field\); fields are uid, iid, ts"):
        read_recbole(tmp_path, user_col="uid", item_col="iid", time_col="when")
    from seqrec.cli import main

    assert main(["data", "prepare", "d", "--format", "recbole", "--path", str(tmp_path), "--user-col", "uid",
                 "--item-col", "iid", "--time-col", "ts", "--split", "time", "--min-user-len", "1",
                 "--out", str(tmp_path / "prepared")]) == 0


def test_recbole_errors(tmp_path: Path) -> None:
    path = write(tmp_path / "a.inter", "user_id:token\titem_id:token\tts:float\nu\ti\t1\nu\ti\n")
    with pytest.raises(SeqrecError, match=r"a\.inter, line 3: expected 3 TAB-separated fields"):
        read_recbole(path)
    write(path, "user_id:token\titem_id:token\tts:float\nu\ti\t1\nu\ti\tx1\n")
    with pytest.raises(SeqrecError, match=r"a\.inter, line 3: ts value 'x1' is not a number"):
        read_recbole(path)
    write(path, "user_id:token\titem_id\nu\ti\n")
    with pytest.raises(SeqrecError, match=r"a\.inter, line 1: header field 'item_id' needs a type"):
        read_recbole(path)
    write(path, "uid:token\titem_id:token\nu\ti\n")
    with pytest.raises(SeqrecError, match=r"a\.inter: no user_id field \(--user-col names another\); fields are uid"):
        read_recbole(path)
    with pytest.raises(SeqrecError, match=r"missing\.inter: RecBole interaction file not found"):
        read_recbole(tmp_path, name="missing")


# ---------------------------------------------------------------- UniSRec

HEADER = "user_id:token\titem_id_list:token_seq\titem_id:token\n"


def _unisrec_folder(root: Path, test_rows: str | None = None) -> Path:
    """User 0 saw items 0 1 2 3 4 (histories cut at 3); user 1 has no train rows: 5 6 7."""
    write(root / "Toy.train.inter", HEADER + "0\t0 1\t2\n0\t0\t1\n")
    write(root / "Toy.valid.inter", HEADER + "0\t0 1 2\t3\n1\t5\t6\n")
    write(root / "Toy.test.inter", HEADER + (test_rows or "0\t1 2 3\t4\n1\t5 6\t7\n"))
    asins = ["A0", "A1", "A2", "A3", "A4", "A5", "A6", "A7"]
    write(root / "Toy.item2index", "".join(f"{a}\t{i}\n" for i, a in enumerate(asins)))
    write(root / "Toy.user2index", "alice\t0\nbob\t1\n")
    write(
        root / "Toy.text",
        "item_id:token\ttext:token_seq\nA0\tFirst item. Tools. Acme. \nA4\tFifth\n",
    )
    return root


def test_unisrec_rebuilds_full_sequences(tmp_path: Path) -> None:
    raw = read_unisrec(_unisrec_folder(tmp_path))
    expected = events(
        ["alice"] * 5 + ["bob"] * 3,
        ["A0", "A1", "A2", "A3", "A4", "A5", "A6", "A7"],
        [None] * 8,
        split=["train", "train", "train", "valid", "test", "train", "valid", "test"],
    )
    assert_frame_equal(raw.interactions.frame, expected)
    assert raw.name == "Toy"
    assert raw.items is not None
    text = pl.DataFrame({"item": ["A0", "A4"], "text": ["First item. Tools. Acme.", "Fifth"]})
    assert_frame_equal(raw.items.frame, text)


def test_unisrec_without_index_files_keeps_ints(tmp_path: Path) -> None:
    folder = _unisrec_folder(tmp_path)
    for suffix in (".item2index", ".user2index", ".text"):
        (folder / f"Toy{suffix}").unlink()
    raw = read_unisrec(folder / "Toy.test.inter")
    assert raw.interactions.frame["item"].to_list() == [str(i) for i in range(8)]
    assert raw.interactions.frame["user"].to_list() == ["0"] * 5 + ["1"] * 3
    assert raw.items is None


def test_unisrec_inconsistent_history(tmp_path: Path) -> None:
    folder = _unisrec_folder(tmp_path, test_rows="0\t1 2 3\t4\n1\t5 9\t7\n")
    with pytest.raises(
        SeqrecError,
        match=r"Toy\.test\.inter, line 3: history of user 1 does not match .*"
        r"\(history item 2 is '9', expected '6'\)",
    ):
        read_unisrec(folder)
    folder = _unisrec_folder(tmp_path, test_rows="0\t0 1 2 3 4\t4\n1\t5 6\t7\n")
    with pytest.raises(SeqrecError, match=r"Toy\.test\.inter, line 2: user 0 lists 5 history"):
        read_unisrec(folder)


def test_unisrec_duplicate_and_unmapped_rows(tmp_path: Path) -> None:
    folder = _unisrec_folder(tmp_path, test_rows="0\t1 2 3\t4\n1\t5 6\t7\n1\t5 6\t7\n")
    with pytest.raises(
        SeqrecError, match=r"Toy\.test\.inter, line 4: user 1 has more than one row"
    ):
        read_unisrec(folder)
    folder = _unisrec_folder(tmp_path)
    write(folder / "Toy.item2index", "A0\t0\nA1\t1\n")
    with pytest.raises(SeqrecError, match=r"Toy\.item2index: no entry for item '2'"):
        read_unisrec(folder)
    with pytest.raises(SeqrecError, match=r"Nope\.test\.inter: UniSRec test file not found"):
        read_unisrec(folder, name="Nope")


# ---------------------------------------------------------------- S3-Rec lines


def test_s3rec_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "Toy.txt", "1 10 11 12\n2\t11  13\r\n\n3 10\n")
    raw = read_s3rec(path)
    expected = events(
        ["1", "1", "1", "2", "2", "3"], ["10", "11", "12", "11", "13", "10"], [None] * 6
    )
    assert_frame_equal(raw.interactions.frame, expected)
    assert raw.name == "Toy" and raw.items is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1 2 3\n2 4 x5\n", r"Toy\.txt, line 2: id 'x5' is not a non-negative integer"),
        ("1 2 3\n\n7\n", r"Toy\.txt, line 3: expected a user id followed by at least one item"),
        ("1 2 3\n2 -4\n", r"Toy\.txt, line 2: id '-4' is not a non-negative integer"),
    ],
)
def test_s3rec_malformed(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SeqrecError, match=message):
        read_s3rec(write(tmp_path / "Toy.txt", text))


def test_yelp_and_p5_item_text(tmp_path: Path) -> None:
    yelp = write(
        tmp_path / "Yelp.item.json",
        json.dumps({"0": {"title": "Cafe", "description": "Food, Coffee"}, "1": {"title": "Bar"}}),
    )
    expected = pl.DataFrame(
        {"item": ["1", "2"], "title": ["Cafe", "Bar"], "categories": ["Food, Coffee", None]},
        schema={c: pl.Utf8 for c in ("item", "title", "categories")},
    )
    assert_frame_equal(read_yelp_items(yelp), expected)
    maps = write(
        tmp_path / "datamaps.json", json.dumps({"id2item": {"1": "B01", "2": "B02", "3": "B03"}})
    )
    phase0 = write(tmp_path / "p0.txt", "B02 red shoe  size 9\nB01 \n")
    expected = pl.DataFrame(
        {
            "item": ["1", "2", "3"],
            "asin": ["B01", "B02", "B03"],
            "title": [None, "red shoe  size 9", None],
        },
        schema={c: pl.Utf8 for c in ("item", "asin", "title")},
    )
    assert_frame_equal(read_p5_pseudo_text(maps, phase0), expected)


# ---------------------------------------------------------------- LC-Rec JSON


def test_lcrec_json(tmp_path: Path) -> None:
    inter = write(tmp_path / "Toy.inter.json", json.dumps({"0": [0, 1, 2], "1": [2, 0]}))
    item_json = write(
        tmp_path / "Toy.item.json",
        json.dumps(
            {
                "0": {"title": "Pen", "categories": ["Office", "Pens"], "brand": "Bic"},
                "1": {"title": "Ink", "categories": "Office", "description": ["Blue", "ink."]},
                "2": {"title": "Pad", "brand": ""},
            }
        ),
    )
    raw = read_lcrec(inter, item_json)
    expected = events(["0", "0", "0", "1", "1"], ["0", "1", "2", "2", "0"], [None] * 5)
    assert_frame_equal(raw.interactions.frame, expected)
    assert raw.name == "Toy"
    items = pl.DataFrame(
        {
            "item": ["0", "1", "2"],
            "title": ["Pen", "Ink", "Pad"],
            "categories": ["Office, Pens", "Office", None],
            "brand": ["Bic", None, None],
            "description": [None, "Blue ink.", None],
        },
        schema={c: pl.Utf8 for c in ("item", "title", "categories", "brand", "description")},
    )
    assert raw.items is not None
    assert_frame_equal(raw.items.frame, items)

    item2id = write(tmp_path / "Toy.item2id", "B0\t0\nB1\t1\nB2\t2\n")
    raw = read_lcrec(inter, item_json, item2id=item2id)
    assert raw.interactions.frame["item"].to_list() == ["B0", "B1", "B2", "B2", "B0"]
    assert raw.items is not None and raw.items.frame["item"].to_list() == ["B0", "B1", "B2"]


def test_lcrec_errors(tmp_path: Path) -> None:
    inter = write(tmp_path / "Toy.inter.json", '{\n  "0": [0, 1],\n  "1": [2,]\n}\n')
    with pytest.raises(SeqrecError, match=r"Toy\.inter\.json, line 3: invalid JSON"):
        read_lcrec(inter)
    write(inter, json.dumps({"0": [0, 1], "1": 5}))
    with pytest.raises(
        SeqrecError, match=r"Toy\.inter\.json: the value for user '1' is not a list"
    ):
        read_lcrec(inter)
    write(inter, json.dumps({"0": [0, 7]}))
    item2id = write(tmp_path / "Toy.item2id", "B0\t0\nB1\t1\n")
    with pytest.raises(SeqrecError, match=r"Toy\.item2id: no entry for item '7'"):
        read_lcrec(inter, item2id=item2id)
    write(item2id, "B0\t0\nB1\tone\n")
    with pytest.raises(SeqrecError, match=r"Toy\.item2id, line 2: index 'one' is not an integer"):
        read_lcrec(inter, item2id=item2id)


def test_diginetica(tmp_path: Path) -> None:
    path = write(
        tmp_path / "views.csv",
        "session_id;user_id;item_id;timeframe;eventdate\n1;NA;81766;526309;2016-05-09\n"
        "1;NA;31331;1031018;2016-05-09\n2;5;32118;0;2016-05-10\n",
    )
    raw = read_diginetica(path)
    expected = events(
        ["1", "1", "2"],
        ["81766", "31331", "32118"],
        [1462752000 + 526.309, 1462752000 + 1031.018, 1462838400.0],
    )
    assert_frame_equal(raw.interactions.frame, expected)
    write(path, "session_id;user_id;item_id;timeframe;eventdate\n1;NA;1;0;2016-13-01\n")
    with pytest.raises(
        SeqrecError, match=r"views\.csv, line 2: time 'eventdate' value '2016-13-01'"
    ):
        read_diginetica(path)


# ---------------------------------------------------------------- catalog


def test_catalog_dispatch(tmp_path: Path) -> None:
    with pytest.raises(
        SeqrecError, match=r"unknown dataset 'ml-1m'; known: ml-100k, amazon-beauty"
    ):
        load_known("ml-1m", tmp_path)
    with pytest.raises(SeqrecError, match=r"unknown format 'xls'; known: movielens, recbole"):
        load_format("xls", tmp_path)
    path = write(tmp_path / "log.txt", "u;i\n1;2\n")
    with pytest.raises(SeqrecError, match=r"format 'csv': .*user_col.* \(options: user_col"):
        load_format("csv", path)
    with pytest.raises(SeqrecError, match=r"format 's3rec': .*'colour'"):
        load_format("s3rec", path, colour="red")
    raw = load_format("csv", path, user_col="u", item_col="i", sep=";")
    assert_frame_equal(raw.interactions.frame, events(["1"], ["2"], [None]))
    assert all(
        spec.description and isinstance(spec.prepare, dict) for spec in KNOWN_DATASETS.values()
    )
    assert KNOWN_DATASETS["diginetica-sample"].prepare["min_user_len"] == 3


def test_catalog_ml100k_layouts(tmp_path: Path) -> None:
    _movielens_folder(tmp_path / "ml-100k" / "raw")
    raw = load_known("ml-100k", tmp_path)  # parent of ml-100k/raw
    assert raw.name == "ml-100k" and raw.interactions.frame.height == 2
    assert raw.items is not None and raw.items.frame["title"][0] == "Kolya"
    recbole = _recbole_folder(tmp_path / "other" / "recbole")
    (recbole / "toy.inter").rename(recbole / "ml-100k.inter")
    (recbole / "toy.item").rename(recbole / "ml-100k.item")
    raw = load_known("ml-100k", tmp_path / "other")
    assert raw.name == "ml-100k" and raw.interactions.frame["user"].to_list() == ["u1", "u1", "u2"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(SeqrecError, match=r"expected u\.data or ml-100k\.inter"):
        load_known("ml-100k", tmp_path / "empty")
    with pytest.raises(SeqrecError, match=r"dataset folder for 'yelp-p5' not found"):
        load_known("yelp-p5", tmp_path / "nowhere")
