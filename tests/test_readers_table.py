"""The table reader (CSV / TSV / Parquet / JSON lines) on small hand-written files: exact frames, time
layouts, separators and errors that name the file and line."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from seqrec.data.readers import read_table
from seqrec.errors import SeqrecError
from tests.test_readers import events, write


def test_table_csv_iso_times(tmp_path: Path) -> None:
    path = write(
        tmp_path / "log.csv",
        "uid,iid,when,score\n007,a,2020-01-01T00:00:10,1.5\n007,b,2020-01-01 00:01:00,2\n"
        "8,a,2020-01-02,\n",
    )
    raw = read_table(path, "uid", "iid", "when", extra_cols=["score"])
    expected = events(
        ["007", "007", "8"],
        ["a", "b", "a"],
        [1577836810.0, 1577836860.0, 1577923200.0],
        score=[1.5, 2.0, None],
    )
    assert_frame_equal(raw.interactions.frame, expected)
    assert raw.name == "log"


def test_table_formats_and_numbers(tmp_path: Path) -> None:
    tsv = write(tmp_path / "log.tsv", "u\ti\tt\n1\t2\t10\n1\t3\t5.5\n")
    raw = read_table(tsv, "u", "i", "t")
    assert_frame_equal(raw.interactions.frame, events(["1", "1"], ["2", "3"], [10.0, 5.5]))
    odd = write(tmp_path / "log.dat", "u|i|t\n1|2|03/01/2020 10:00\n")
    raw = read_table(odd, "u", "i", "t", sep="|", time_format="%d/%m/%Y %H:%M")
    assert raw.interactions.frame["timestamp"].to_list() == [1578045600.0]  # 2020-01-03 10:00 UTC
    parquet = tmp_path / "log.parquet"
    pl.DataFrame({"u": [1, 2], "i": ["x", "y"], "t": [3, 4]}).write_parquet(parquet)
    raw = read_table(parquet, "u", "i")
    assert_frame_equal(raw.interactions.frame, events(["1", "2"], ["x", "y"], [None, None]))


def test_table_errors(tmp_path: Path) -> None:
    path = write(tmp_path / "log.csv", "uid,iid,when\n1,a,2020-01-01\n2,b,yesterday\n")
    with pytest.raises(
        SeqrecError, match=r"log\.csv: no column\(s\) 'item'; available: 'uid', 'iid', 'when'$"
    ):
        read_table(path, "uid", "item", "when")
    with pytest.raises(
        SeqrecError, match=r"log\.csv, line 3: time 'when' value 'yesterday' is not ISO"
    ):
        read_table(path, "uid", "iid", "when")
    write(path, "uid,iid\n1,a\n,b\n")
    with pytest.raises(SeqrecError, match=r"log\.csv, line 3: empty user id in column 'uid'"):
        read_table(path, "uid", "iid")
    with pytest.raises(SeqrecError, match=r"log\.xyz: no such file$"):
        read_table(tmp_path / "log.xyz", "a", "b")
    with pytest.raises(SeqrecError, match=r"log\.parquet: no such file$"):
        read_table(tmp_path / "log.parquet", "a", "b")
    with pytest.raises(SeqrecError, match=r"unknown table type '\.xyz'"):
        read_table(write(tmp_path / "log.xyz", "a,b\n"), "a", "b")


def test_iso_times_in_every_layout_are_read(tmp_path: Path) -> None:
    """Without a time format: ISO 8601 with "T" or a space, with or without seconds / fraction / zone."""
    values = ["2020-01-01", "2020-01-01T00:00:10", "2020-01-01 00:01", "2020-01-01T00:00:10.5",
              "2020-01-01T00:00:10Z", "2020-01-01T02:00:10+02:00", "2020-01-01 02:00:10.25+0200"]
    path = write(tmp_path / "log.csv", "u,i,t\n" + "".join(f"1,{n},{v}\n" for n, v in enumerate(values)))
    start = 1577836800.0  # 2020-01-01 00:00 UTC
    expected = [start, start + 10, start + 60, start + 10.5, start + 10, start + 10, start + 10.25]
    assert read_table(path, "u", "i", "t").interactions.frame["timestamp"].to_list() == expected


@pytest.mark.parametrize(("rows", "time_format", "seconds"), [
    # only day-first fits, but nothing says so
    (["13/09/2020 12:27", "14/09/2020 08:00"], "%d/%m/%Y %H:%M", [1600000020.0, 1600070400.0]),
    # every day <= 12: both orders fit, and give different event orders
    (["01/02/2020", "03/01/2020", "05/01/2020"], "%d/%m/%Y", [1580515200.0, 1578009600.0, 1578182400.0]),
    (["01/02/2020", "03/01/2020", "05/01/2020"], "%m/%d/%Y", [1577923200.0, 1583020800.0, 1588291200.0]),
])
def test_other_time_layouts_need_a_time_format(tmp_path: Path, rows: list[str], time_format: str,
                                               seconds: list[float]) -> None:
    """Day / month order is never guessed: without a time format a non-ISO layout is refused at its line,
    with the flag to pass; with one, the values are read in that order."""
    path = write(tmp_path / "log.csv", "u,i,t\n" + "".join(f"1,{n},{v}\n" for n, v in enumerate(rows)))
    with pytest.raises(SeqrecError, match=rf"log\.csv, line 2: time 't' value '{rows[0]}' is not ISO 8601 .*"
                       r"--time-format, e.g. '%d/%m/%Y %H:%M' \(day first\) or '%m/%d/%Y' \(month first\)"):
        read_table(path, "u", "i", "t")
    raw = read_table(path, "u", "i", "t", time_format=time_format)
    assert raw.interactions.frame["timestamp"].to_list() == seconds
    with pytest.raises(SeqrecError, match=r"line 2: time 't' value .* is not in the --time-format layout '%Y'"):
        read_table(path, "u", "i", "t", time_format="%Y")


def test_a_time_column_of_numbers_and_dates_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "log.csv", "u,i,t\n1,a,5\n1,b,2020-01-01\n1,c,yesterday\n")
    with pytest.raises(SeqrecError, match=r"line 4: time 't' value 'yesterday' is not ISO 8601"):
        read_table(path, "u", "i", "t")
    write(path, "u,i,t\n1,a,5\n1,b,2020-01-01\n")
    with pytest.raises(SeqrecError, match=r"line 2: time 't' value '5' is a number, but line 3 holds the date "
                       r"'2020-01-01'; a time column holds numbers or dates, not both"):
        read_table(path, "u", "i", "t")
    write(path, "u,i,t\n1,a,2020-01-01\n1,b,\n")
    with pytest.raises(SeqrecError, match=r"log\.csv, line 3: empty time in column 't'$"):
        read_table(path, "u", "i", "t")


def test_bad_lines_are_named_by_number(tmp_path: Path) -> None:
    """JSON lines: the first line that is not one JSON object; CSV: the first row with too many fields."""
    good = "".join(f'{{"u": 1, "i": {n}}}\n' for n in range(5))
    path = write(tmp_path / "bad5.jsonl", good + '{"u": :}\n{"u": 2, "i": 9}\n')
    with pytest.raises(SeqrecError,
                       match=r"^\S*bad5\.jsonl, line 6: not valid JSON \(Expecting value at character 7\)$"):
        read_table(path, "u", "i")
    write(path, good + "\n[1, 2]\n")
    with pytest.raises(SeqrecError, match=r"bad5\.jsonl, line 7: not a JSON object"):
        read_table(path, "u", "i")
    csv = write(tmp_path / "log.csv", 'u,i,t\n1,"a,b",1\n1,b,2,9,9\n1,c\n')
    with pytest.raises(SeqrecError, match=r"^\S*log\.csv, line 3: 5 ','-separated fields, but the header has 3$"):
        read_table(csv, "u", "i", "t")


@pytest.mark.parametrize("sep", ["\\t", "tab", "TAB", "\t"])
def test_a_tab_separator_may_be_typed_as_an_escape_or_a_word(tmp_path: Path, sep: str) -> None:
    path = write(tmp_path / "log.dat", "u\ti\tt\n1\t2\t10\n1\t3\t11\n")
    raw = read_table(path, "u", "i", "t", sep=sep)
    assert_frame_equal(raw.interactions.frame, events(["1", "1"], ["2", "3"], [10.0, 11.0]))


def test_other_long_separators_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "log.dat", "u;;i\n1;;2\n")
    with pytest.raises(SeqrecError, match=r"one character \(or \\t or tab for a tab\), got ';;'"):
        read_table(path, "u", "i", sep=";;")


def test_the_format_decides_and_a_suffix_of_another_type_is_refused(tmp_path: Path) -> None:
    """--format was ignored where the suffix named a type: a .jsonl given as csv was read as JSON lines."""
    from seqrec.data.catalog import load_format

    jsonl = write(tmp_path / "log.jsonl", '{"u": "a", "i": "x"}\n')
    with pytest.raises(SeqrecError, match=r"log\.jsonl: read as csv, but its suffix '\.jsonl' names a jsonl file"):
        load_format("csv", jsonl, user_col="u", item_col="i")
    with pytest.raises(SeqrecError, match=r"a separator is for CSV / TSV files, not jsonl"):
        load_format("jsonl", jsonl, user_col="u", item_col="i", sep=";")
    txt = write(tmp_path / "log.txt", "u,i\na,x\nb,y\n")  # .txt means TAB unless the format says otherwise
    assert load_format("csv", txt, user_col="u", item_col="i").interactions.frame.height == 2


def test_a_header_read_as_one_column_names_the_separator(tmp_path: Path) -> None:
    path = write(tmp_path / "log.csv", "u;i;t\na;x;1\n")
    with pytest.raises(SeqrecError, match=r"available: 'u;i;t' \(the header was read as one column: it is "
                                          r"separated by ';', not ','; give it with --sep ';', or sep= from Python\)$"):
        read_table(path, "u", "i")
    with pytest.raises(SeqrecError, match=r"separated by ',', not TAB"):
        read_table(write(tmp_path / "log.tsv", "u,i\na,x\n"), "u", "i")


@pytest.mark.parametrize(("value", "kind"), [("true", "true/false"), ('["q"]', "an array"), ('{"a": 1}', "an object")])
def test_json_ids_that_are_not_strings_or_numbers_are_refused_by_line(tmp_path: Path, value: str, kind: str) -> None:
    """Beside string ids polars read true / arrays / objects as their JSON text, which then became ids."""
    path = write(tmp_path / "log.jsonl", f'{{"u": "a", "i": "x"}}\n\n{{"u": "a", "i": {value}}}\n')
    with pytest.raises(SeqrecError, match=rf"log\.jsonl, line 3: id column 'i' holds {re.escape(kind)}, not an id"):
        read_table(path, "u", "i")
    numbers = write(tmp_path / "n.jsonl", f'{{"u": "a", "i": 7}}\n{{"u": "a", "i": {value}}}\n')
    with pytest.raises(SeqrecError, match=rf"n\.jsonl, line 2: field 'i' holds {re.escape(kind)}, but on line 1"):
        read_table(numbers, "u", "i")
    text = write(tmp_path / "s.jsonl", '{"u": "a", "i": "true"}\n{"u": "a", "i": "x"}\n')  # the string "true" is an id
    assert read_table(text, "u", "i").interactions.frame["item"].to_list() == ["true", "x"]


def test_ids_that_often_mean_missing_are_kept_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A walk-through's export had "NA" as the user of 7,681 rows: one giant user, without a word."""
    path = tmp_path / "log.csv"
    path.write_text("u,i\nNA,a\nNA,b\nu1,a\nu1,null\n")
    with caplog.at_level("WARNING", logger="seqrec.data.readers_values"):
        frame = read_table(path, "u", "i").interactions.frame
    assert frame["user"].to_list() == ["NA", "NA", "u1", "u1"]  # kept: it may be a real id
    assert "2 row(s) have the user id 'NA' in column 'u', which often stands for a missing value" in caplog.text
    assert "1 row(s) have the item id 'null' in column 'i'" in caplog.text


def test_an_event_column_of_text_is_kept_but_text_among_numbers_is_named(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"u": "a", "i": "x", "device": "phone"}\n{"u": "a", "i": "y", "device": "tv"}\n')
    frame = read_table(path, "u", "i", extra_cols=["device"]).interactions.frame
    assert frame["device"].to_list() == ["phone", "tv"]  # a category: kept as text
    path = tmp_path / "log.csv"
    path.write_text("u,i,rating\na,x,5\na,y,\na,z,high\n")
    with pytest.raises(SeqrecError, match=r"log\.csv, line 4: column 'rating' holds 'high' among numbers"):
        read_table(path, "u", "i", extra_cols=["rating"])
