from pathlib import Path

import numpy as np
import polars as pl
import pytest

from seqrec.data.batching import TrainBatches, eval_batches, training_windows
from seqrec.data.dataset import PreparedDataset
from seqrec.data.prepare import PrepareOptions, kcore, prepare
from seqrec.data.types import Interactions, RawDataset
from seqrec.errors import SeqrecError


def raw(rows: list[tuple[str, str, float | None]], split: list[str] | None = None) -> RawDataset:
    frame = pl.DataFrame({"user": [r[0] for r in rows], "item": [r[1] for r in rows],
                          "timestamp": pl.Series([r[2] for r in rows], dtype=pl.Float64)})
    if split is not None:
        frame = frame.with_columns(split=pl.Series(split))
    return RawDataset(Interactions(frame, "test-log"), None, "t")


def sequences(d: PreparedDataset) -> list[list[str]]:
    ids = d.item_table.sort("idx")["item"].to_list()
    return [[ids[i - 1] for i in d.items[a:b]] for a, b in zip(d.offsets[:-1], d.offsets[1:], strict=True)]


def test_time_order_with_row_order_tiebreak(tmp_path: Path) -> None:
    rows = [("a", "x", 5.0), ("a", "y", 1.0), ("a", "z", 5.0), ("a", "w", 3.0), ("b", "x", 1.0),
            ("b", "y", 1.0), ("b", "z", 1.0)]
    d = prepare(raw(rows), PrepareOptions(), tmp_path / "p")
    assert sequences(d) == [["y", "w", "x", "z"], ["x", "y", "z"]]
    # ids: sorted raw ids, 1-based
    assert d.item_table["item"].to_list() == ["w", "x", "y", "z"]
    assert d.item_table["idx"].to_list() == [1, 2, 3, 4]


def test_numeric_ids_sort_numerically(tmp_path: Path) -> None:
    rows = [("1", "10", 1.0), ("1", "9", 2.0), ("1", "100", 3.0)]
    d = prepare(raw(rows), PrepareOptions(), tmp_path / "p")
    assert d.item_table["item"].to_list() == ["9", "10", "100"]


def test_dedupe_and_kcore(tmp_path: Path) -> None:
    rows = [("a", "x", 1.0), ("a", "x", 2.0), ("a", "y", 3.0), ("a", "x", 4.0)]
    d = prepare(raw(rows), PrepareOptions(dedupe="consecutive"), tmp_path / "c")
    assert sequences(d) == [["x", "y", "x"]]
    with pytest.raises(SeqrecError, match="no interactions left"):
        prepare(raw(rows), PrepareOptions(dedupe="first"), tmp_path / "f")  # 2 events < min_user_len
    frame = pl.DataFrame({"user": ["a", "a", "b", "b", "c"], "item": ["x", "y", "x", "y", "x"]})
    # c has 1 event -> dropped; then x has 2, y has 2 -> kept at k=2
    assert sorted(kcore(frame, 2)["user"].unique().to_list()) == ["a", "b"]
    # at k=3 the cascade empties everything
    assert kcore(frame, 3).height == 0


@pytest.mark.parametrize(("stride", "jitter_seed"), [(0, None), (1, None), (3, None), (0, 0), (3, 1), (4, 2)])
def test_leave_one_out_split_keeps_targets_out_of_training(tiny_dataset: PreparedDataset, stride: int,
                                                           jitter_seed: int | None) -> None:
    d = tiny_dataset
    lengths = d.lengths
    np.testing.assert_array_equal(d.split[:, 1], lengths - 1)
    np.testing.assert_array_equal(d.split[:, 0], lengths - 2)
    shift = None
    if jitter_seed is not None:  # jittered boundaries keep every contract below
        shift = np.random.default_rng(jitter_seed).integers(0, stride or 4, size=d.n_users)
        assert shift.any()
    context, start, end, user = training_windows(d.offsets, d.train_end(), max_len=4, stride=stride, shift=shift)
    # every training target lies strictly before the user's validation position
    valid_flat = d.offsets[:-1] + d.split[:, 0]
    assert (end <= valid_flat[user]).all()
    # a window reads at most max_len inputs, all of them the user's, and as many as it can
    first = d.offsets[:-1][user] + 1
    assert (context >= first).all() and (end - context <= 4).all()
    assert ((end - context == 4) | (context == first)).all()
    assert (context <= start).all() and (end - start <= (stride or 4)).all()
    # and every training event after the first is a target exactly once
    covered = np.zeros(len(d.items), dtype=int)
    for s, e in zip(start, end, strict=True):
        covered[s:e] += 1
    for u in range(d.n_users):
        a = d.offsets[u]
        assert covered[a] == 0
        assert (covered[a + 1 : a + d.split[u, 0]] == 1).all()
        assert (covered[a + d.split[u, 0] : d.offsets[u + 1]] == 0).all()


def test_jitter_moves_window_boundaries_between_epochs(tiny_dataset: PreparedDataset) -> None:
    """Each jittered epoch is a different cut of the same targets: every target once, boundaries moved."""
    batches = TrainBatches(tiny_dataset, max_len=4, batch_size=8, seed=0, jitter=True)
    epochs = []
    for _ in range(3):
        cuts = set()
        n, n_batches = 0, len(batches)  # known before the epoch (data-parallel ranks rely on it)
        for b in batches:
            n_batches -= 1
            assert b.targets is not None and b.users is not None
            n += int((b.targets != 0).sum())
            for u, row in zip(b.users.tolist(), b.targets.tolist(), strict=True):
                cuts.add((u, tuple(t for t in row if t)))
        assert n == batches.n_targets == TrainBatches(tiny_dataset, max_len=4, batch_size=8, seed=0).n_targets
        assert n_batches == 0
        epochs.append(cuts)
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]


def test_batches_are_left_padded_shifted_pairs(tiny_dataset: PreparedDataset) -> None:
    batches = TrainBatches(tiny_dataset, max_len=4, batch_size=8, seed=0)
    for b in batches:
        assert b.targets is not None
        # inputs are the targets shifted right by one, padding aligned
        assert ((b.items == 0) == (b.targets == 0)).all()
        assert (b.items[:, -1] != 0).all()
        assert (b.items[:, 1:] == b.targets[:, :-1]).masked_select(b.targets[:, :-1] != 0).all()


def test_overlapping_windows_give_targets_context(tiny_dataset: PreparedDataset) -> None:
    """With stride 1, each target but a user's first few is predicted from max_len inputs."""
    n = 0
    for b in TrainBatches(tiny_dataset, max_len=4, batch_size=8, seed=0, stride=1):
        assert b.targets is not None
        assert ((b.targets != 0).sum(1) == 1).all()  # one target per window, at the last column
        assert (b.targets[:, -1] != 0).all()
        # the inputs are the events before the target, the most recent last
        assert (b.items[:, 1:][b.items[:, :-1] != 0] != 0).all()
        n += len(b.items)
    assert n == TrainBatches(tiny_dataset, max_len=4, batch_size=8, seed=0).n_targets
    test = next(eval_batches(tiny_dataset, "test", max_len=50, batch_size=1000))
    u = int(test.users[0])
    a, z = tiny_dataset.offsets[u], tiny_dataset.offsets[u + 1]
    assert test.target is not None and int(test.target[0]) == tiny_dataset.items[z - 1]
    row = test.items[0][test.items[0] != 0].numpy()
    np.testing.assert_array_equal(row, tiny_dataset.items[a : z - 1])


def test_presplit_is_honoured_exactly(tmp_path: Path) -> None:
    rows = [("a", "x", None), ("a", "y", None), ("a", "z", None), ("a", "w", None)]
    d = prepare(raw(rows, ["train", "train", "valid", "test"]), PrepareOptions(), tmp_path / "p")
    assert d.split.tolist() == [[2, 3]]
    with pytest.raises(SeqrecError, match="pre-split"):
        prepare(raw(rows, ["train", "valid", "train", "test"]), PrepareOptions(), tmp_path / "q")
    with pytest.raises(SeqrecError, match="pre-split"):
        prepare(raw(rows, ["train", "train", "valid", "test"]), PrepareOptions(kcore=5), tmp_path / "r")


def test_prepared_folder_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import seqrec.data.dataset as ds

    rows = [("a", "x", 1.0), ("a", "y", 2.0), ("a", "z", 3.0)]
    prepare(raw(rows), PrepareOptions(), tmp_path / "p")

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(ds.np, "save", boom)
    with pytest.raises(RuntimeError):
        prepare(raw(rows), PrepareOptions(), tmp_path / "p")
    # the earlier complete folder is still there and loads; no temp folders are left
    assert PreparedDataset.load(tmp_path / "p").n_items == 3
    assert [p.name for p in tmp_path.iterdir()] == ["p"]


def _interleaved_log(n_users: int = 80, seed: int = 1) -> RawDataset:
    """Users active over overlapping stretches of one global clock."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        n = int(rng.integers(3, 12))
        for t in np.sort(rng.uniform(0, 1000, n)):
            rows.append((f"u{u}", f"i{rng.integers(40)}", float(t)))
    frame = pl.DataFrame(rows, schema=["user", "item", "timestamp"], orient="row")
    return RawDataset(Interactions(frame, "interleaved"), None, "interleaved")


def test_time_split_trains_only_before_the_validation_cutoff(tmp_path: Path) -> None:
    opts = PrepareOptions(split="time", test_frac=0.2, valid_frac=0.2)
    d = prepare(_interleaved_log(), opts, tmp_path / "t")
    assert d.times is not None
    v_from, t_from = d.meta["options"]["valid_from"], d.meta["options"]["test_from"]
    assert d.meta["options"]["split"] == "time" and v_from < t_from
    from seqrec.config import EvalConfig
    from seqrec.eval.evaluate import protocol

    assert protocol(d, EvalConfig(), "test", 50)["test_from"] == t_from  # every result records the cutoffs
    assert np.mean(d.times >= t_from) == pytest.approx(0.2, abs=0.02)
    _, start, end, _ = training_windows(d.offsets, d.train_end(), max_len=50)
    targets = np.concatenate([np.arange(s, e) for s, e in zip(start, end, strict=True)])
    assert (d.times[targets] < v_from).all()  # no training target from the evaluated periods
    for which, lo, hi in (("valid", v_from, t_from), ("test", t_from, np.inf)):
        users, pos = d.eval_positions(which)
        assert len(users) > 10
        flat = d.offsets[users] + pos
        assert ((d.times[flat] >= lo) & (d.times[flat] < hi)).all() and (pos >= 1).all()
        for u, p in zip(users, pos, strict=True):  # the first such event of the user (with a history)
            t = d.times[d.offsets[u] + 1 : d.offsets[u] + p]
            assert not ((t >= lo) & (t < hi)).any()
    # a user without a later event keeps every event for training
    quiet = np.flatnonzero((d.split == -1).all(1) & (d.times[d.offsets[1:] - 1] < v_from))
    assert len(quiet) and (d.train_end()[quiet] == d.lengths[quiet]).all()
    # the refit before test learns from the validation period too, still not from the test period
    _, start, end, _ = training_windows(d.offsets, d.with_valid_as_training().train_end(), max_len=50)
    targets = np.concatenate([np.arange(s, e) for s, e in zip(start, end, strict=True)])
    assert (d.times[targets] < t_from).all() and (d.times[targets] >= v_from).any()
    # no training event at all (inputs, counts) from after the cutoff: not even a user's first event there
    for data, cutoff in ((d, v_from), (d.with_valid_as_training(), t_from)):
        lengths = data.lengths
        pos = np.arange(len(data.items)) - np.repeat(data.offsets[:-1], lengths)
        training = pos < np.repeat(data.train_end(), lengths)
        assert training.any() and (data.times[training] < cutoff).all()
    late = np.flatnonzero(d.times[d.offsets[:-1]] >= v_from)  # users whose first event is in an evaluated period
    assert len(late) and (d.train_end()[late] == 0).all()


def test_time_split_needs_timestamps_and_keeps_presplit_sources(tmp_path: Path) -> None:
    raw = _interleaved_log()
    frame = raw.interactions.frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("timestamp"))
    no_time = RawDataset(Interactions(frame, "x"), None, "x")
    with pytest.raises(SeqrecError, match="needs timestamps"):
        prepare(no_time, PrepareOptions(split="time"), tmp_path / "a")
    with pytest.raises(SeqrecError, match="sum below 1"):
        PrepareOptions(split="time", test_frac=0.6, valid_frac=0.5)


def _log(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "log.csv"
    path.write_text("u,i,t\n" + "\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_non_finite_timestamps_are_refused_with_their_line(tmp_path: Path, bad: str) -> None:
    from seqrec.data.readers_table import read_table

    path = _log(tmp_path, ["a,x,1", "a,y,2", f"b,x,{bad}"])
    with pytest.raises(SeqrecError, match=r"log\.csv, line 4: time 't' value .* is not a finite number"):
        read_table(path, "u", "i", "t")


def test_out_of_range_timestamps_are_kept_in_order_with_a_warning(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    from seqrec.data.readers_table import read_table

    path = _log(tmp_path, ["a,x,-3", "a,y,1e30", "a,z,5"])
    raw = read_table(path, "u", "i", "t")
    assert raw.interactions.frame["timestamp"].to_list() == [-3.0, 1e30, 5.0]
    assert "outside epoch seconds" in caplog.text and "log.csv" in caplog.text


def test_a_log_of_one_item_is_refused(tmp_path: Path) -> None:
    from seqrec.data.readers_table import read_table

    raw = read_table(_log(tmp_path, [f"a,x,{t}" for t in range(6)]), "u", "i", "t")
    with pytest.raises(SeqrecError, match="only one distinct item"):
        prepare(raw, PrepareOptions(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _ml100k_source(folder: Path) -> Path:
    """A raw GroupLens folder (u.data only): 4 users x 5 ratings over 6 items, one second apart."""
    folder.mkdir(parents=True)
    rows = [f"{u}\t{(u + k) % 6 + 1}\t3\t{1000 + 10 * u + k}\n" for u in range(1, 5) for k in range(5)]
    (folder / "u.data").write_text("".join(rows))
    return folder


def test_a_prepared_dataset_is_named_after_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`prepare ml-100k --split time --out .../ml-100k-time` is ml-100k-time (what `--dataset` finds it by, and
    what its runs' results say), not a second "ml-100k"; without --out it is NAME."""
    from seqrec.cli import main

    monkeypatch.setenv("SEQREC_HOME", str(tmp_path / "home"))
    source = _ml100k_source(tmp_path / "src")
    prepared = tmp_path / "home" / "prepared"
    assert main(["data", "prepare", "ml-100k", "--source", str(source), "--split", "time", "--test-frac", "0.2",
                 "--valid-frac", "0.2", "--out", str(prepared / "ml-100k-time")]) == 0
    assert main(["data", "prepare", "ml-100k", "--source", str(source)]) == 0
    timed, loo = PreparedDataset.load(prepared / "ml-100k-time"), PreparedDataset.load(prepared / "ml-100k")
    assert (timed.meta["name"], timed.stats()["split"]) == ("ml-100k-time", "time")
    assert (loo.meta["name"], loo.stats()["split"]) == ("ml-100k", "leave-one-out")
    log = tmp_path / "log.csv"
    log.write_text("u,i,t\n" + "".join(f"{u},{i},{u + i}\n" for u in range(3) for i in range(4)))
    assert main(["data", "prepare", "shop", "--format", "csv", "--path", str(log), "--user-col", "u",
                 "--item-col", "i", "--out", str(tmp_path / "shop-v2")]) == 0
    assert PreparedDataset.load(tmp_path / "shop-v2").meta["name"] == "shop-v2"


@pytest.mark.parametrize(("options", "message"), [
    ({"kcore": -1}, r"^kcore \(--kcore\) must be >= 0, got -1$"),
    ({"min_user_len": 0}, r"^min_user_len \(--min-user-len\) must be >= 1, got 0$"),
    ({"test_frac": 1.5}, r"^test_frac \(--test-frac\) and valid_frac \(--valid-frac\) must be in \(0, 1\)"),
])
def test_option_errors_name_the_field_and_its_flag(options: dict, message: str) -> None:
    with pytest.raises(SeqrecError, match=message):
        PrepareOptions(**options)
