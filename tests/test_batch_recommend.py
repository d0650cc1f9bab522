"""`seqrec recommend --users / --log`: top-k for many users, to a file, equal to one request at a time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from seqrec.cli import main
from seqrec.cli.recommend import user_history
from seqrec.errors import SeqrecError
from seqrec.serve import Recommender
from tests.conftest import synthetic_log

TRAIN = ["--set", "train.epochs=2", "--set", "model.d=8", "--set", "data.max_len=8", "--set", "train.progress=false"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A rated toy log prepared as `toy` (rating kept as an event column), in a home the module shares (each
    run below is trained once for every test that takes it)."""
    root = tmp_path_factory.mktemp("batch")
    frame = synthetic_log().interactions.frame.rename({"user": "uid", "item": "iid", "timestamp": "ts"})
    frame.with_columns((pl.col("ts") % 5 + 1).alias("rating")).write_csv(root / "log.csv")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SEQREC_HOME", str(root / "home"))
        assert main(["data", "prepare", "toy", "--format", "csv", "--path", str(root / "log.csv"), "--user-col",
                     "uid", "--item-col", "iid", "--time-col", "ts", "--event-cols", "rating"]) == 0
        yield root


RUNS = {  # SASRec with the history bias (its window items are scored apart and merged); GRU4Rec reading
          # time gaps and ratings as event features
    "sasrec": ["--model", "sasrec", "--set", "model.history_bias=true"],
    "gru": ["--model", "gru4rec", "--set", 'features.fields=[{name="gap", level="event", kind="continuous", '
            'transform="log1p"}, {name="rating", level="event", kind="continuous"}]'],
}


def train(home: Path, capsys: pytest.CaptureFixture[str], name: str) -> Path:
    out = home / name
    if not (out / "checkpoint" / "model.json").is_file():
        code, text, _ = run(capsys, "train", "--dataset", "toy", "--out", str(out), *TRAIN, *RUNS[name])
        assert code == 0, text
    return out


def one_at_a_time(run_dir: Path, user: str, k: int, exclude_seen: bool) -> list[tuple[str, float]]:
    history, times, events = user_history(run_dir, user)
    rec = Recommender.from_run(run_dir)
    events = {name: v for name, v in events.items() if name in rec.model.event_feature_names()}
    return [(r.item, r.score) for r in rec.recommend(history, k, exclude_seen=exclude_seen, times=times,
                                                      events=events)]


def rows_of(frame: pl.DataFrame, user: str) -> list[tuple[str, float]]:
    got = frame.filter(pl.col("user") == user)
    assert got["rank"].to_list() == list(range(1, got.height + 1))
    return list(zip(got["item"].to_list(), got["score"].to_list(), strict=True))


def same(got: list[tuple[str, float]], want: list[tuple[str, float]]) -> bool:
    return [i for i, _ in got] == [i for i, _ in want] and all(
        abs(a - b) < 1e-4 for (_, a), (_, b) in zip(got, want, strict=True))


@pytest.mark.parametrize("exclude_seen", [False, True])
def test_every_user_gets_what_one_request_gives(home: Path, capsys: pytest.CaptureFixture[str],
                                                exclude_seen: bool) -> None:
    """SASRec with the history bias (its window items are scored apart and merged), batches of 7 (histories of
    every length in a batch, encoded shortest first): each user's rows equal `recommend` on that user's whole
    history, and the users keep the dataset's order."""
    run_dir = train(home, capsys, "sasrec")
    out = home / "recs.parquet"
    flags = ["--exclude-seen"] if exclude_seen else []
    code, text, _ = run(capsys, "recommend", str(run_dir), "--users", "all", "--out", str(out), "-k", "5",
                        "--batch-size", "7", *flags)
    assert code == 0 and "top 5 for 60 of toy's users" in text and "(300 rows" in text
    frame = pl.read_parquet(out)
    assert frame.columns == ["user", "rank", "item", "score"]  # the CSV log has no titles
    users = pl.read_parquet(home / "home" / "prepared" / "toy" / "users.parquet").sort("idx")["user"].to_list()
    assert frame["user"].unique(maintain_order=True).to_list() == users
    for user in users[::7]:
        assert same(rows_of(frame, user), one_at_a_time(run_dir, user, 5, exclude_seen)), user


def test_event_features_come_from_the_data(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model with time gaps and ratings as event features: --users reads each user's times and ratings from
    the prepared data, --log from the log's time and rating columns, and both equal `recommend` given them."""
    run_dir = train(home, capsys, "gru")
    (home / "some.txt").write_text("u3\nnobody\nu5\n\nu3\n")
    code, text, _ = run(capsys, "recommend", str(run_dir), "--users", str(home / "some.txt"), "--out",
                        str(home / "some.csv"), "-k", "4")
    assert code == 0 and "top 4 for 2 of toy's users" in text and "1 user id(s) not in the dataset: nobody" in text
    frame = pl.read_csv(home / "some.csv", schema_overrides={"user": pl.Utf8, "item": pl.Utf8})
    assert frame["user"].unique(maintain_order=True).to_list() == ["u3", "u5"]
    for user in ("u3", "u5"):
        assert same(rows_of(frame, user), one_at_a_time(run_dir, user, 4, False)), user
    # the same users' events as a log, shuffled: each history is put back in time order
    log = pl.read_csv(home / "log.csv", schema_overrides={"uid": pl.Utf8, "iid": pl.Utf8})
    log.filter(pl.col("uid").is_in(["u3", "u5"])).sample(fraction=1.0, shuffle=True, seed=3).write_parquet(
        home / "export.parquet")
    code, text, _ = run(capsys, "recommend", str(run_dir), "--log", str(home / "export.parquet"), "--user-col",
                        "uid", "--item-col", "iid", "--time-col", "ts", "--out", str(home / "again.jsonl"), "-k", "4")
    assert code == 0, text
    again = pl.read_ndjson(home / "again.jsonl")
    for user in ("u3", "u5"):
        assert same(rows_of(again, user), rows_of(frame, user)), user


def test_a_log_with_items_the_run_does_not_know(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Unknown items are left out of a history and counted; a user with none known gets no row and is named."""
    run_dir = train(home, capsys, "sasrec")
    pl.DataFrame({"who": ["a", "a", "a", "b", "c"], "what": ["i3", "zzz", "i4", "yyy", "i9"]}).write_csv(
        home / "new.tsv", separator="\t")
    code, text, _ = run(capsys, "recommend", str(run_dir), "--log", str(home / "new.tsv"), "--user-col", "who",
                        "--item-col", "what", "--out", str(home / "new.parquet"), "-k", "3")
    assert code == 0, text
    assert "top 3 for 2 of the users of" in text and "1 user(s) with no item the run knows: no rows: b" in text
    assert "2 event(s) of items the run does not know were left out" in text
    frame = pl.read_parquet(home / "new.parquet")
    rec = Recommender.from_run(run_dir)
    assert rows_of(frame, "a") == [(r.item, pytest.approx(r.score, abs=1e-4)) for r in rec.recommend(["i3", "i4"], 3)]
    assert frame["user"].unique(maintain_order=True).to_list() == ["a", "c"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--users", "all"], "--users writes its top-k to a file: give --out PATH"),
    (["--users", "all", "--out", "{tmp}/r.xlsx"], "unknown output type '.xlsx'"),
    (["--history", "i1", "--out", "{tmp}/r.csv"], "--out goes with --users or --log"),
    (["--user", "u1", "--batch-size", "5"], "--batch-size goes with --users or --log"),
    (["--users", "all", "--history", "i1", "--out", "{tmp}/r.csv"], "not --history and --users"),
    (["--users", "all", "--out", "{tmp}/r.csv", "--candidates", "i1"], "--candidates goes with --history"),
    (["--users", "{home}/none.txt", "--out", "{tmp}/r.csv"], "neither 'all' nor a file of user ids"),
    (["--users", "{home}/empty.txt", "--out", "{tmp}/r.csv"], "no user id in it"),
    (["--users", "all", "--out", "{tmp}/r.csv", "--batch-size", "0"], "batch size must be >= 1"),
    (["--users", "all", "--out", "{tmp}/r.csv", "-k", "99"], "k=99"),
    (["--log", "{home}/log.csv", "--out", "{tmp}/r.csv"], "--log needs --user-col and --item-col"),
    (["--log", "{home}/log.csv", "--user-col", "nope", "--item-col", "iid", "--out", "{tmp}/r.csv"],
     "no column(s) 'nope'"),
    (["--log", "{home}/unknown.csv", "--user-col", "x", "--item-col", "y", "--out", "{tmp}/r.csv"],
     "no user has an item the run knows"),
])
def test_batch_mistakes_are_one_line_errors_and_write_nothing(home: Path, capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path, argv: list[str], message: str) -> None:
    run_dir = train(home, capsys, "sasrec")
    (home / "empty.txt").write_text("\n \n")
    (home / "unknown.csv").write_text("x,y\nu1,zzz\n")
    code, _, err = run(capsys, "recommend", str(run_dir), *[a.format(home=home, tmp=tmp_path) for a in argv])
    assert code == 2 and err.startswith("seqrec: error:") and message in err, err
    assert len(err.strip().splitlines()) == 1
    assert not list(tmp_path.glob("r.*")) and not list(tmp_path.glob(".r.*"))


def test_from_python_with_a_changed_catalogue(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The library form: an item removed from the catalogue stays history context but is never in a list, and
    rows equal `recommend_many` on the same histories."""
    from seqrec.serve import batch

    run_dir = train(home, capsys, "sasrec")
    rec = Recommender.from_run(run_dir)
    rec.remove_items(["i6"])
    log = pl.DataFrame({"user": ["a", "a", "b", "b"], "item": ["i4", "i5", "i6", "i2"],
                        "timestamp": [1.0, 2.0, None, None]})
    hist = batch.from_log(rec, log)
    assert [h.tolist() for h in hist.items] == [rec.to_indices(["i4", "i5"]), rec.to_indices(["i6", "i2"])]
    frame = batch.recommend_histories(rec, hist, k=29)
    assert "i6" not in frame["item"].to_list() and frame.height == 2 * 29
    want = rec.recommend_many([["i4", "i5"], ["i6", "i2"]], k=29)
    for user, recs in zip(["a", "b"], want, strict=True):
        assert same(rows_of(frame, user), [(r.item, r.score) for r in recs])


def test_a_text_model_with_items_added_by_text(tmp_path: Path) -> None:
    """UniSRec: the adaptor runs once for the whole job (its input table), and an item added by text is in the
    histories and the lists as one request at a time has it."""
    from seqrec.serve import batch
    from tests.serve_helpers import train_tiny_runs

    rec = Recommender.from_run(train_tiny_runs(tmp_path, ("unisrec",))["unisrec"])
    rec.add_items({"new": "red glue tool"})
    histories = [["i1", "new"], ["i2", "i3", "i4"], ["new"]]
    log = pl.DataFrame({"user": [f"u{n}" for n, h in enumerate(histories) for _ in h],
                        "item": [i for h in histories for i in h], "timestamp": [None] * 6},
                       schema_overrides={"timestamp": pl.Float64})
    frame = batch.recommend_histories(rec, batch.from_log(rec, log), k=31, batch_size=2)
    assert "new" in frame["item"].to_list()
    for n, recs in enumerate(rec.recommend_many(histories, k=31)):
        assert same(rows_of(frame, f"u{n}"), [(r.item, r.score) for r in recs])


def test_what_a_log_may_hold(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Parquet log with integer user ids and events out of time order, a user whose history holds every item
    (--exclude-seen leaves nothing: no rows, named), a rating column that is text, and a log that lacks a
    feature the model reads (a note says it is taken as missing)."""
    from seqrec.serve import batch

    run_dir = train(home, capsys, "gru")
    rec = Recommender.from_run(run_dir)
    items = [int(i[1:]) for i in rec.catalogue.raw_ids]
    log = pl.DataFrame({"u": [7, 7, 7, 8, *[9] * len(items)], "i": [3, 4, 5, 6, *items],
                        "t": [30.0, 20.0, 10.0, 1.0, *range(len(items))], "rating": [1, 2, 3, 4, *[5] * len(items)]})
    # ids as the run has them ("i3"): an integer log of "3" would not match, so the test renames the catalogue's
    log.with_columns(("i" + pl.col("i").cast(pl.Utf8)).alias("i")).write_parquet(home / "ints.parquet")
    code, text, err = run(capsys, "recommend", str(run_dir), "--log", str(home / "ints.parquet"), "--user-col", "u",
                          "--item-col", "i", "--time-col", "t", "--out", str(home / "out.csv"), "-k", "3",
                          "--exclude-seen")
    assert code == 0, err
    assert "1 user(s) with no item left once their own are excluded: no rows: 9" in text
    frame = pl.read_csv(home / "out.csv", schema_overrides={"user": pl.Utf8, "item": pl.Utf8})
    assert frame["user"].unique(maintain_order=True).to_list() == ["7", "8"]
    want = rec.recommend(["i5", "i4", "i3"], 3, exclude_seen=True, times=[10.0, 20.0, 30.0],
                         events={"rating": [3.0, 2.0, 1.0]})
    assert same(rows_of(frame, "7"), [(r.item, r.score) for r in want])
    # the same log without its rating column: the feature is missing (NaN), and the note says so
    log.drop("rating").with_columns(("i" + pl.col("i").cast(pl.Utf8)).alias("i")).write_csv(home / "plain.csv")
    code, text, _ = run(capsys, "recommend", str(run_dir), "--log", str(home / "plain.csv"), "--user-col", "u",
                        "--item-col", "i", "--out", str(home / "plain.parquet"), "-k", "3")
    assert code == 0 and "(note: the model's event feature(s) rating, gap are not in" in text
    plain = pl.read_parquet(home / "plain.parquet")
    want = rec.recommend(["i3", "i4", "i5"], 3)  # file order without --time-col; gap and rating missing
    assert same(rows_of(plain, "7"), [(r.item, r.score) for r in want])
    # a rating that is text is named, not read as missing
    text_rating = pl.DataFrame({"user": ["a"], "item": ["i3"], "timestamp": [None], "rating": ["five"]},
                               schema_overrides={"timestamp": pl.Float64})
    with pytest.raises(SeqrecError, match=r"column 'rating' .* holds 'five', not a number"):
        batch.from_log(rec, text_rating)


def test_more_mistakes(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = train(home, capsys, "sasrec")
    (home / "latin1.txt").write_bytes("u1\nj\xe9r\xf4me\n".encode("latin-1"))
    (home / "nobody.txt").write_text("x\ny\n")
    (home / "bom.txt").write_text("\ufeffu1\nu2\n", encoding="utf-8")
    (home / "header.csv").write_text("uid,iid\n")
    for argv, message in [
        (["--users", "{home}/latin1.txt"], "latin1.txt: not utf-8 text"),
        (["--users", "{home}/nobody.txt"], "none of the 2 user id(s) of"),
        (["--users", "all", "--user-col", "uid"], "--user-col goes with --log"),
        (["--log", "{home}/header.csv", "--user-col", "uid", "--item-col", "iid"], "header.csv: no events in it"),
    ]:
        code, _, err = run(capsys, "recommend", str(run_dir), *[a.format(home=home) for a in argv], "--out",
                           str(home / "r.csv"))
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    code, text, _ = run(capsys, "recommend", str(run_dir), "--users", str(home / "bom.txt"), "--out",
                        str(home / "bom.csv"))
    assert code == 0 and "for 2 of toy's users" in text  # a byte-order mark is not part of the first id


def test_a_failed_write_leaves_nothing(home: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = train(home, capsys, "sasrec")

    def half_written(self: pl.DataFrame, path: Path, *args: object, **kwargs: object) -> None:
        Path(path).write_bytes(b"PAR1 half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", half_written)
    code, _, err = run(capsys, "recommend", str(run_dir), "--users", "all", "--out", str(tmp_path / "r.parquet"))
    assert code == 2 and "r.parquet: cannot write (No space left on device)" in err, err
    assert not list(tmp_path.glob("r.parquet")) and not list(tmp_path.glob(".r.parquet*"))


def test_an_ann_index_with_exclusions(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--index ivf --exclude-seen: the batch's lists are what the same IVF index gives one request at a time."""
    run_dir = train(home, capsys, "sasrec")
    code, _, _ = run(capsys, "recommend", str(run_dir), "--users", "all", "--out", str(home / "ivf.jsonl"),
                     "--index", "ivf", "--exclude-seen", "-k", "5")
    assert code == 0
    frame = pl.read_ndjson(home / "ivf.jsonl")
    rec = Recommender.from_run(run_dir, index="ivf")
    for user in ("u0", "u17", "u42"):
        history, _, _ = user_history(run_dir, user)
        assert same(rows_of(frame, user), [(r.item, r.score) for r in rec.recommend(history, 5, exclude_seen=True)])
