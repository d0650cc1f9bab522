"""seqrec from Python, as a notebook uses it: one config for several runs, DataFrames in, and mistakes
(wrong types, the wrong dataset, unknown options) answered by a `SeqrecError` that names them, never a
traceback from inside torch, polars or FAISS, nor a silently wrong result."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from seqrec.config import load_toml, resolve
from seqrec.data.catalog import load_format
from seqrec.data.dataset import PreparedDataset
from seqrec.data.item_table import read_item_table
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.errors import SeqrecError
from seqrec.eval.compare import compare_runs
from seqrec.eval.evaluate import evaluate
from seqrec.serve import Recommender
from seqrec.serve.batch import from_dataset, from_log
from seqrec.train.loop import fit
from tests.conftest import synthetic_log

QUICK = ["model.d=16", "data.max_len=8", "train.epochs=1", "train.progress=false", "eval.ks=[10]",
         "train.threads=1"]


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two datasets of different sizes and a run on each, trained from one config object."""
    root = tmp_path_factory.mktemp("pyapi")
    small = prepare(synthetic_log(n_users=40, n_items=20, seed=1), PrepareOptions(), root / "small")
    large = prepare(synthetic_log(n_users=60, n_items=30), PrepareOptions(), root / "large")
    cfg = resolve({}, [*QUICK, "model.name=sasrec"])
    before = copy.deepcopy(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        fit(cfg, small, root / "run-small")
        assert torch.get_num_threads() == 2  # train.threads=1 held for the run only
        fit(cfg, str(large.path), str(root / "run-large"))  # a folder and a str path will do too
    finally:
        torch.set_num_threads(threads)
    assert cfg == before  # "auto" settings stay "auto" for the next run
    return {"root": root, "small": small.path, "large": large.path,
            "run-small": root / "run-small", "run-large": root / "run-large"}


def test_one_config_serves_several_runs(two: dict[str, Path]) -> None:
    for name in ("small", "large"):
        saved = json.loads((two[f"run-{name}"] / "config.json").read_text())
        assert saved["data"]["dataset"] == str(two[name].resolve())
        results = json.loads((two[f"run-{name}"] / "results.json").read_text())
        assert results["auto"], "each run makes and records its own auto decisions"


def test_fit_refuses_a_folder_holding_a_run(two: dict[str, Path]) -> None:
    before = sorted(p.name for p in two["run-small"].iterdir())
    with pytest.raises(SeqrecError, match="holds a run"):
        fit(resolve({}, [*QUICK, "model.name=gru4rec"]), PreparedDataset.load(two["small"]), two["run-small"])
    assert sorted(p.name for p in two["run-small"].iterdir()) == before


def test_prepare_names_the_dataset_after_its_folder(two: dict[str, Path]) -> None:
    assert PreparedDataset.load(two["small"]).meta["name"] == "small"


def test_evaluate_refuses_another_datasets_model(two: dict[str, Path]) -> None:
    rec = Recommender.from_run(two["run-large"])
    small, large = PreparedDataset.load(two["small"]), PreparedDataset.load(two["large"])
    cfg = resolve({}, QUICK)
    with pytest.raises(SeqrecError, match="30 items and small has 20"):
        evaluate(rec.model, small, "test", 8, cfg.eval, torch.device("cpu"))
    with pytest.raises(SeqrecError, match="'valid' or 'test'"):
        evaluate(rec.model, large, "train", 8, cfg.eval, torch.device("cpu"))
    assert evaluate(rec.model, large, "test", 8, cfg.eval, torch.device("cpu"))["n_users"] == 60


def test_recommend_refuses_what_it_cannot_take(two: dict[str, Path]) -> None:
    rec = Recommender.from_run(two["run-large"])
    same = rec.recommend(["i3", "i4"], k=3)
    assert [r.item for r in rec.recommend(np.array(["i3", "i4"]), k=3)] == [r.item for r in same]
    for k in (1.5, True, "5"):
        with pytest.raises(SeqrecError, match="k must be a whole number"):
            rec.recommend(["i3"], k=k)  # type: ignore[arg-type]
    assert len(rec.recommend(["i3"], k=np.int64(3))) == 3
    with pytest.raises(SeqrecError, match=r"holds 3, a int: item ids are strings.*'3'"):
        rec.recommend([3, 4], k=3)  # type: ignore[list-item]
    with pytest.raises(SeqrecError, match="item ids are strings"):
        rec.similar(3)  # type: ignore[arg-type]
    with pytest.raises(SeqrecError, match=r"unknown event feature\(s\) \['rating'\]"):
        rec.recommend(["i3", "i4"], k=3, events={"rating": [5, 4]})
    with pytest.raises(SeqrecError, match="has no item text: new items need a text model"):
        rec.add_items({"n1": "a drill"})


def test_index_options_are_checked(two: dict[str, Path]) -> None:
    with pytest.raises(SeqrecError, match=r"unknown index option\(s\) k; the options are"):
        Recommender.from_run(two["run-large"], k=5)
    rec = Recommender.from_run(two["run-large"])
    for kind, option in (("ivf", {"n_probe": 0}), ("ivf", {"n_probe": -1}), ("hnsw", {"ef_search": -5}),
                         ("hnsw", {"ef_search": 2.5})):
        with pytest.raises(SeqrecError, match="must be a whole number >= 1"):
            rec.use_index(kind, **option)
    with pytest.raises(SeqrecError, match="not a device"):
        Recommender.from_run(two["run-large"], device="tpu")


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_a_k_near_the_catalogue_size_gets_k_items(two: dict[str, Path], kind: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recommender.from_run(two["run-large"])
    exact = rec.recommend(["i3", "i4"], k=29, exclude_seen=True)
    retriever = rec.use_index(kind, ef_search=1, hnsw_m=2) if kind == "hnsw" else rec.use_index(kind, n_lists=8,
                                                                                                n_probe=1)
    found = retriever._candidates  # type: ignore[attr-defined]

    def unreachable(*args: object) -> tuple[np.ndarray, np.ndarray]:  # items no graph search reaches
        scores, ids = found(*args)
        cut = ids == int(rec.index["i20"])
        return np.where(cut, -np.inf, scores), np.where(cut, 0, ids)

    monkeypatch.setattr(retriever, "_candidates", unreachable)
    found = rec.recommend(["i3", "i4"], k=29, exclude_seen=True)
    assert len(exact) == len(found) == 28  # every item but the two seen
    assert [r.item for r in found] == [r.item for r in exact]


def test_a_dataframe_reads_as_its_file(tmp_path: Path) -> None:
    log = synthetic_log().interactions.frame.rename({"user": "user_id", "item": "item_id"})
    log.write_csv(tmp_path / "log.csv")
    options = {"user_col": "user_id", "item_col": "item_id", "time_col": "timestamp"}
    from_file = load_format("csv", tmp_path / "log.csv", **options).interactions.frame
    from_frame = load_format("table", log, **options).interactions.frame
    assert from_frame.equals(from_file)
    nan = log.with_columns(pl.when(pl.int_range(pl.len()) == 3).then(float("nan")).otherwise(pl.col("timestamp"))
                           .alias("timestamp"))
    with pytest.raises(SeqrecError, match="<DataFrame>, row 4: time 'timestamp' value nan is not a finite number"):
        load_format("table", nan, **options)
    with pytest.raises(SeqrecError, match="<DataFrame>, row 2: empty user id"):
        load_format("table", log.with_columns(pl.when(pl.int_range(pl.len()) == 1).then(None)
                                              .otherwise(pl.col("user_id")).alias("user_id")), **options)
    with pytest.raises(SeqrecError, match="format 'movielens' reads files"):
        load_format("movielens", log)
    with pytest.raises(SeqrecError, match="not a LazyFrame"):
        load_format("table", log.lazy(), **options)
    table = read_item_table(pl.DataFrame({"sku": [1, 2], "title": ["a", "b"]}), item_key="sku")
    assert table.frame["item"].to_list() == ["1", "2"]
    categorical = log.with_columns(pl.col("user_id").cast(pl.Categorical), pl.col("item_id").cast(pl.Categorical))
    assert load_format("table", categorical, **options).interactions.frame.equals(from_file)


def test_pandas_frames_too() -> None:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    frame = pd.DataFrame({"u": ["a", "a", "b"], "i": ["x", "y", "x"], "t": pd.to_datetime([1, 2, 3], unit="s")})
    read = load_format("table", frame, user_col="u", item_col="i", time_col="t").interactions.frame
    assert read["timestamp"].to_list() == [1.0, 2.0, 3.0]


def test_python_mistakes_are_named(two: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(SeqrecError, match=r"overrides are a list.*\['train.epochs=2'\]"):
        resolve({}, "train.epochs=2")  # type: ignore[arg-type]
    with pytest.raises(SeqrecError, match="config file not found"):
        load_toml(str(tmp_path / "none.toml"))
    with pytest.raises(SeqrecError, match="give a list of run folders"):
        compare_runs(str(two["run-small"]))  # type: ignore[arg-type]
    rec = Recommender.from_run(two["run-large"])
    raw = load_format("table", pl.DataFrame({"user_id": ["a", "a"], "item_id": ["i1", "i2"]}),
                      user_col="user_id", item_col="item_id")
    assert from_log(rec, raw).users == ["a"]  # the RawDataset a reader gives, or its frame
    with pytest.raises(SeqrecError, match="no column"):
        from_log(rec, pl.DataFrame({"user_id": ["a"], "item_id": ["i1"]}))
    data = PreparedDataset.load(two["large"])
    assert from_dataset(rec, data, ["u1", "nobody"]).unknown_users == ["nobody"]
    with pytest.raises(SeqrecError, match="users are a list of user ids, strings"):
        from_dataset(rec, data, [1, 2])  # type: ignore[list-item]


def test_the_time_budget_ends_an_epoch_and_progress_is_logged(two: dict[str, Path], caplog: pytest.LogCaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Past train.time_budget_s an epoch ends after its current step (a budget only checked between epochs
    let one long epoch run for as long as it took); without a terminal, progress comes as log lines."""
    from seqrec import progress

    monkeypatch.setattr(progress, "EVERY_S", -1.0)
    cfg = resolve({}, [*QUICK, "model.name=sasrec", "train.epochs=5", "train.batch_size=4", "train.progress=true",
                       "train.time_budget_s=1e-6"])
    run = two["root"] / "run-budget"
    with caplog.at_level("INFO", logger="seqrec"):
        results = fit(cfg, two["large"], run)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["cut_at_budget"] is True
    assert "time budget" in results["stopped_by"]
    # the chosen epoch was cut: a refit would train it whole (more than was validated, past the budget)
    assert cfg.train.refit and not results["protocol"]["refit"] and "without the refit" in results["stopped_by"]
    assert not (run / "checkpoint-selected").exists()
    assert "inside the epoch" in caplog.text and "epoch 1: 1 of " in caplog.text
