"""Your own catalogue: an item table joined to a log (counts, unmatched items, items with no
interaction), JSON-lines logs, and RecBole's sequential benchmark files rebuilt into sequences."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from seqrec.cli import main
from seqrec.data.dataset import PreparedDataset
from seqrec.data.item_table import join_item_table, read_item_table
from seqrec.data.item_text import item_texts
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.data.readers import read_recbole_sequential, read_table
from seqrec.errors import SeqrecError

LOG = [("u1", "a", 1), ("u1", "b", 2), ("u1", "c", 3), ("u2", "b", 1), ("u2", "c", 2), ("u2", "x", 3),
       ("u3", "a", 5), ("u3", "c", 6), ("u3", "b", 7)]
# a, b, c are in the table and the log; x is only in the log; d and e only in the table
ITEMS = [{"sku": "a", "title": "Alpha", "brand": "Acme", "tags": ["red", "big"]},
         {"sku": "b", "title": "Beta", "brand": None, "tags": []},
         {"sku": "c", "title": "Gamma", "brand": "Bolt", "tags": ["blue"]},
         {"sku": "d", "title": "Delta", "brand": "Acme", "tags": ["red"]},
         {"sku": "e", "title": "", "brand": "", "tags": []}]


def write_log(folder: Path) -> Path:
    path = folder / "log.csv"
    path.write_text("uid,sku,ts\n" + "".join(f"{u},{i},{t}\n" for u, i, t in LOG))
    return path


def write_items(folder: Path, suffix: str) -> Path:
    path = folder / f"items{suffix}"
    frame = pl.DataFrame(ITEMS)
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in ITEMS))
    elif suffix == ".parquet":
        frame.write_parquet(path)
    else:
        frame.with_columns(pl.col("tags").list.join("|")).write_csv(path, separator="\t" if suffix == ".tsv" else ",")
    return path


def test_ids_padded_with_spaces_join_in_the_log_and_the_table(tmp_path: Path) -> None:
    """`a ` in a log and ` a` in an item table are one id (a CSV written with spaces after its commas);
    an id of spaces alone is an empty id, refused at its line."""
    log = tmp_path / "log.csv"
    log.write_text("uid,sku,ts\n" + "".join(f"{u}, {i} ,{t}\n" for u, i, t in LOG))
    items = tmp_path / "items.csv"
    items.write_text("sku,title\n" + "".join(f" {row['sku']},{row['title']}\n" for row in ITEMS))
    raw = read_table(log, "uid", "sku", "ts")
    assert sorted(raw.interactions.frame["item"].unique()) == ["a", "b", "c", "x"]
    joined = join_item_table(raw, read_item_table(items, "sku"))
    assert joined.catalogue is not None and joined.catalogue["log_items_without_row"] == 1  # x alone
    log.write_text("uid,sku,ts\nu1,a,1\nu1,   ,2\n")
    with pytest.raises(SeqrecError, match="line 3: empty item id"):
        read_table(log, "uid", "sku", "ts")


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".parquet", ".jsonl"])
def test_join_counts_unmatched_and_catalogue_only_items(tmp_path: Path, suffix: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    raw = read_table(write_log(tmp_path), "uid", "sku", "ts")
    joined = join_item_table(raw, read_item_table(write_items(tmp_path, suffix), "sku"), "{title}. {brand}")
    # 1 of 4 log items has no row: more than "auto" stands in for, and the warning says what a text model will do
    assert "1 of the log's 4 items have no row" in caplog.text
    assert "2 of the catalogue's 6 items (33.3%) have no text" in caplog.text  # with 'e', whose text is empty
    assert "a text model refuses them until you choose model.text_missing" in caplog.text
    assert joined.catalogue is not None
    assert {k: joined.catalogue[k] for k in ("table_items", "table_items_without_interactions",
                                              "log_items_without_row")} == {
        "table_items": 5, "table_items_without_interactions": 2, "log_items_without_row": 1}
    assert joined.catalogue["table_items_without_text"] == 1  # e: its title and brand are empty
    assert "1 of the table's 5 items have empty text (e.g. 'e')" in caplog.text
    data = prepare(joined, PrepareOptions(), tmp_path / "ds")
    table = data.item_table.sort("idx")
    # the log's items first (a, b, c, x), then the table's items with no interaction (d, e)
    assert table["item"].to_list() == ["a", "b", "c", "x", "d", "e"]
    assert table["text"].to_list() == ["Alpha. Acme", "Beta", "Gamma. Bolt", None, "Delta. Acme", None]
    stats = data.stats()
    assert stats["items"] == 6 and stats["items_without_interactions"] == 2
    assert stats["catalogue"]["log_items_without_row"] == 1
    assert item_texts(data.item_table) == table["text"].to_list()  # the built text is what encoders read


def test_list_fields_become_text(tmp_path: Path) -> None:
    table = read_item_table(write_items(tmp_path, ".jsonl"), "sku").frame
    assert table["tags"].to_list() == ["red, big", None, "blue", "red", None]
    assert table["brand"].to_list() == ["Acme", None, "Bolt", "Acme", None]


def test_without_a_table_no_catalogue_items_are_added(tmp_path: Path) -> None:
    data = prepare(read_table(write_log(tmp_path), "uid", "sku", "ts"), PrepareOptions(), tmp_path / "ds")
    assert data.n_items == 4 and data.stats()["items_without_interactions"] == 0
    assert "catalogue" not in data.meta


def test_item_table_errors(tmp_path: Path) -> None:
    raw = read_table(write_log(tmp_path), "uid", "sku", "ts")
    items = write_items(tmp_path, ".csv")
    with pytest.raises(SeqrecError, match="no item key column 'id'; columns are 'sku', 'title'"):
        read_item_table(items, "id")
    dup = tmp_path / "dup.csv"
    dup.write_text("sku,title\na,A\nb,B\na,again\n")
    with pytest.raises(SeqrecError, match=r"dup.csv, line 4: item id 'a' .* repeats line 2"):
        read_item_table(dup, "sku")
    empty_key = tmp_path / "empty.csv"
    empty_key.write_text("sku,title\na,A\n,B\n")
    with pytest.raises(SeqrecError, match=r"empty.csv, line 3: empty item id"):
        read_item_table(empty_key, "sku")
    table = read_item_table(items, "sku")
    with pytest.raises(SeqrecError, match=r"unknown item field\(s\) \['price'\]"):
        join_item_table(raw, table, "{title} {price}")
    blank = tmp_path / "blank.csv"
    blank.write_text("sku,title\na,\nb,\nc,\n")
    with pytest.raises(SeqrecError, match="empty text for every item"):
        join_item_table(raw, read_item_table(blank, "sku"), "{title}")
    other = tmp_path / "other.csv"
    other.write_text("sku,title\nq,Q\nr,R\n")
    with pytest.raises(SeqrecError, match="none of the log's 4 item ids"):
        join_item_table(raw, read_item_table(other, "sku"))


def test_jsonl_log_reads_like_csv(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps({"uid": u, "sku": i, "ts": t}) + "\n" for u, i, t in LOG))
    from_json = read_table(path, "uid", "sku", "ts").interactions.frame
    from_csv = read_table(write_log(tmp_path), "uid", "sku", "ts").interactions.frame
    assert from_json.equals(from_csv)
    numeric = tmp_path / "num.jsonl"
    numeric.write_text('{"u": 1, "i": 10}\n{"u": 1, "i": 11}\n')
    assert read_table(numeric, "u", "i").interactions.frame["item"].to_list() == ["10", "11"]


def test_cli_prepare_with_items_and_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log, items = write_log(tmp_path), write_items(tmp_path, ".parquet")
    out = tmp_path / "shop"
    argv = ["data", "prepare", "shop", "--format", "csv", "--path", str(log), "--user-col", "uid",
            "--item-col", "sku", "--time-col", "ts", "--items", str(items), "--text-template", "{title} ({brand})",
            "--out", str(out)]
    assert main(argv) == 0
    data = PreparedDataset.load(out)
    assert data.meta["name"] == "shop"
    assert data.item_table.sort("idx")["text"].to_list()[:2] == ["Alpha (Acme)", "Beta"]
    capsys.readouterr()
    assert main(["data", "stats", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "6  (2 without interactions: the item table" in printed and "1 log items without a row" in printed
    assert "1 with empty text" in printed


def test_columns_named_like_seqrecs_own_keep_each_items_text(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """A table column named `idx` or `item` (names prepare uses itself) is kept under another name, and
    every item keeps its own text: prepare once sorted the texts by such a column."""
    raw = read_table(write_log(tmp_path), "uid", "sku", "ts")
    path = tmp_path / "items.csv"
    path.write_text("sku,idx,item,title\nc,0,x1,Gamma\na,2,x2,Alpha\nb,1,x3,Beta\n")
    table = read_item_table(path, "sku")
    assert table.frame.columns == ["item", "idx_field", "item_field", "title"]
    assert "column 'idx' is kept as item field 'idx_field'" in caplog.text
    data = prepare(join_item_table(raw, table, "{title}"), PrepareOptions(), tmp_path / "ds")
    rows = dict(zip(data.item_table["item"].to_list(), data.item_table["text"].to_list(), strict=True))
    assert rows == {"a": "Alpha", "b": "Beta", "c": "Gamma", "x": None}
    assert dict(zip(data.item_table["item"].to_list(), data.item_table["idx_field"].to_list(),
                    strict=True))["a"] == "2"


def test_reserved_names_stay_free_of_the_users_own_and_of_recboles(tmp_path: Path) -> None:
    """`idx` beside an `idx_field` of the user's crashed in polars; a RecBole .item field named `idx` became
    `idx_right` in prepare's join."""
    path = tmp_path / "items.csv"
    path.write_text("sku,idx,idx_field,title\na,1,x,Alpha\n")
    assert read_item_table(path, "sku").frame.columns == ["item", "idx_field_field", "idx_field", "title"]
    (tmp_path / "toy.inter").write_text("user_id:token\titem_id:token\nu1\ti1\nu1\ti2\nu1\ti1\n")
    (tmp_path / "toy.item").write_text("item_id:token\tidx:token\ttitle:token_seq\ni1\t7\tOne\ni2\t8\tTwo\n")
    from seqrec.data.readers import read_recbole

    raw = read_recbole(tmp_path / "toy")
    assert raw.items is not None and raw.items.frame.columns == ["item", "idx_field", "title"]
    data = prepare(raw, PrepareOptions(), tmp_path / "ds")
    assert dict(zip(data.item_table["item"].to_list(), data.item_table["idx_field"].to_list(), strict=True)) == {
        "i1": "7", "i2": "8"}


def test_items_without_text_are_counted_as_the_text_models_read_them(tmp_path: Path) -> None:
    """Without a template, the models read the default text fields (title, categories, brand, description):
    an item with only a price has no text, and a table with no such field has none for any item."""
    raw = read_table(write_log(tmp_path), "uid", "sku", "ts")
    priced = tmp_path / "priced.csv"
    priced.write_text("sku,price,title\na,1,Alpha\nb,2,\nc,3,Gamma\n")
    assert join_item_table(raw, read_item_table(priced, "sku")).catalogue["table_items_without_text"] == 1
    named = tmp_path / "named.csv"
    named.write_text("sku,name\na,Alpha\nb,Beta\nc,Gamma\n")
    assert join_item_table(raw, read_item_table(named, "sku")).catalogue["table_items_without_text"] == 3


@pytest.mark.parametrize(("content", "read", "match"), [
    ("sku,title,title\na,A,B\n", "items", r"bad.csv: column 'title' appears twice in the header"),
    ("uid,sku,sku\nu1,a,b\n", "log", r"bad.csv: column 'sku' appears twice"),
    ("sku,title\n", "join", r"bad.csv: the item table has no rows"),
])
def test_a_header_naming_a_column_twice_or_no_rows_is_refused(tmp_path: Path, content: str, read: str,
                                                              match: str) -> None:
    raw = read_table(write_log(tmp_path), "uid", "sku", "ts")
    bad = tmp_path / "bad.csv"
    bad.write_text(content)
    with pytest.raises(SeqrecError, match=match):
        if read == "log":
            read_table(bad, "uid", "sku")
        else:
            join_item_table(raw, read_item_table(bad, "sku"), "{title}")


SEQ_HEADER = "user_id:token\titem_id_list:token_seq\titem_id:token\n"


def test_recbole_sequential_rebuilds_sequences(tmp_path: Path) -> None:
    full = {"7": ["1", "2", "3", "4"], "8": ["3", "1", "2"], "9": ["5", "4", "3", "2", "1", "0"]}
    test = "".join(f"{u}\t{' '.join(s[:-1])}\t{s[-1]}\n" for u, s in full.items())
    valid = "".join(f"{u}\t{' '.join(s[:-2])}\t{s[-2]}\n" for u, s in full.items())
    (tmp_path / "G-6k.test.inter").write_text(SEQ_HEADER + test)
    (tmp_path / "G-6k.valid.inter").write_text(SEQ_HEADER + valid)
    (tmp_path / "G.item").write_text("item_id:token\ttitle:token_seq\n" + "".join(f"{i}\tT{i}\n" for i in range(6)))
    raw = read_recbole_sequential(tmp_path)
    got = dict(raw.interactions.frame.group_by("user", maintain_order=True).agg("item").iter_rows())
    assert got == full
    assert raw.items is not None and raw.items.frame["title"].to_list() == [f"T{i}" for i in range(6)]
    data = prepare(raw, PrepareOptions(), tmp_path / "ds")
    raw_ids = data.item_table.sort("idx")["item"].to_list()
    user_ids = pl.read_parquet(data.path / "users.parquet").sort("idx")["user"].to_list()
    for u, seq in enumerate(np.split(data.items, data.offsets[1:-1])):
        expect = full[user_ids[u]]
        assert [raw_ids[i - 1] for i in seq] == expect
        assert data.split[u].tolist() == [len(expect) - 2, len(expect) - 1]


def test_recbole_sequential_checks_valid_against_test(tmp_path: Path) -> None:
    (tmp_path / "G.test.inter").write_text(SEQ_HEADER + "7\t1 2 3\t4\n")
    (tmp_path / "G.valid.inter").write_text(SEQ_HEADER + "7\t1 2\t9\n")
    with pytest.raises(SeqrecError, match=r"G.valid.inter, line 2: user '7' has validation target '9' but its "
                                          r"test history ends with '3'"):
        read_recbole_sequential(tmp_path)
    (tmp_path / "G.valid.inter").write_text(SEQ_HEADER + "8\t1 2\t3\n")
    with pytest.raises(SeqrecError, match=r"user '8' has no row in G\.test\.inter"):
        read_recbole_sequential(tmp_path)
    (tmp_path / "G.test.inter").write_text("user_id:token\titem_id:token\n7\t4\n")
    with pytest.raises(SeqrecError, match="no item_id_list field"):
        read_recbole_sequential(tmp_path)
