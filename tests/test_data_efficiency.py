"""Learning from a fraction of the users (`data.train_fraction`, behind benchmarks/data_efficiency.py):
the sample is seeded, and validation and test (targets and histories) are every user's, unchanged."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from seqrec.cli import main
from seqrec.data.dataset import PreparedDataset
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.errors import SeqrecError
from tests.conftest import synthetic_log

ROOT = Path(__file__).resolve().parents[1]


def test_sampling_is_seeded_and_leaves_evaluation_alone(tiny_dataset: PreparedDataset) -> None:
    data = tiny_dataset
    a, again, other = (data.with_training_users(0.25, s) for s in (3, 3, 4))
    assert a.training_users is not None and other.training_users is not None
    assert np.array_equal(a.training_users, again.training_users)
    assert not np.array_equal(a.training_users, other.training_users)
    assert a.training_users.sum() == round(0.25 * data.n_users)
    full_end = data.train_end()
    assert np.array_equal(a.train_end(), np.where(a.training_users, full_end, 0))
    for split in ("valid", "test"):
        for got, want in zip(a.eval_positions(split), data.eval_positions(split), strict=True):
            assert np.array_equal(got, want)
    assert np.array_equal(a.items, data.items) and np.array_equal(a.offsets, data.offsets)
    # a refit view (validation events as training) keeps the same users
    refit = a.with_valid_as_training()
    assert np.array_equal(refit.train_end() > 0, a.training_users & (refit.lengths > 1))
    assert data.with_training_users(1.0, 0).training_users is None
    assert data.with_training_users(0.001, 0).training_users.sum() == 1  # type: ignore[union-attr]
    with pytest.raises(SeqrecError, match="fraction"):
        data.with_training_users(0.0, 0)


def test_training_on_a_fraction_sees_only_those_users(tmp_path: Path) -> None:
    data = prepare(synthetic_log(), PrepareOptions(), tmp_path / "ds")
    from seqrec.config import resolve
    from seqrec.data.batching import TrainBatches

    cfg = resolve({"model": {"name": "sasrec"}, "data": {"train_fraction": 0.2, "train_fraction_seed": 1}})
    view = data.with_training_users(cfg.data.train_fraction, cfg.data.train_fraction_seed)
    batches = TrainBatches(view, 8, 1000, 0)
    assert view.training_users is not None
    expected = int(np.maximum(data.train_end()[view.training_users] - 1, 0).sum())
    assert batches.n_targets == expected < TrainBatches(data, 8, 1000, 0).n_targets
    out = tmp_path / "run"
    argv = ["train", "--dataset", str(data.path), "--out", str(out), "--set", "data.train_fraction=0.2",
            "--set", "model.d=8", "--set", "model.n_heads=1", "--set", "model.n_layers=1",
            "--set", "train.epochs=1", "--set", "train.progress=false", "--set", "data.max_len=8"]
    assert main(argv) == 0
    assert (out / "results.json").is_file()


def test_popularity_baseline_counts_ties_against_the_target(tiny_dataset: PreparedDataset) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from data_efficiency import popularity

    data = tiny_dataset
    got = popularity(data, 1.0, 0)
    end = data.train_end()
    counts = np.zeros(data.n_items + 1)
    for u in range(data.n_users):
        np.add.at(counts, data.items[data.offsets[u]: data.offsets[u] + end[u]], 1)
    users, pos = data.eval_positions("test")
    ranks = [int((counts[1:] >= counts[t]).sum()) - 1 for t in data.items[data.offsets[users] + pos]]
    ndcg = np.mean([1 / np.log2(r + 2) if r < 10 else 0 for r in ranks])
    assert got["test_ndcg@10"] == pytest.approx(ndcg)


def test_repeat_rates_on_known_logs(tmp_path: Path) -> None:
    import polars as pl

    from seqrec.data.types import Interactions, RawDataset

    def rates(seqs: dict[str, list[str]]) -> dict[str, float]:
        rows = [(u, i, float(t)) for u, s in seqs.items() for t, i in enumerate(s)]
        frame = pl.DataFrame(rows, schema=["user", "item", "timestamp"], orient="row")
        raw = RawDataset(Interactions(frame, "t"), None, "t")
        return prepare(raw, PrepareOptions(), tmp_path / str(len(list(tmp_path.iterdir())))).repeat_rates()

    # training events: all but the last two of each user
    assert rates({"u1": ["a", "b", "c", "d", "e"], "u2": ["c", "d", "e", "f", "g"]}) == {
        "repeat_rate": 0.0, "consecutive_repeat_rate": 0.0}
    got = rates({"u1": ["a", "a", "b", "a", "x", "y"], "u2": ["b", "c", "b", "z", "w", "v"]})
    # later training events: u1 a, b, a (2 repeats, 1 consecutive); u2 c, b, z (1 repeat)
    assert got == {"repeat_rate": pytest.approx(3 / 6), "consecutive_repeat_rate": pytest.approx(1 / 6)}


def test_plot_lines_are_the_validation_picked_variant_of_each_family() -> None:
    from data_efficiency import envelope, family

    assert [family(m) for m in ("sasrec-hist", "unisrec-scratch-hist-p50", "pt-inductive-p50 (games)", "popularity",
                                "unisrec-scratch-b64p30")] == ["sasrec", "unisrec-scratch", "pre-trained",
                                                               "popularity", "unisrec-scratch"]

    def row(method: str, fraction: float, seeds: int, valid: float, test: float) -> dict[str, object]:
        return {"method": method, "fraction": fraction, "seeds": seeds, "valid_ndcg@10_median": valid,
                "test_ndcg@10_median": test}

    summary = [row("unisrec-scratch", 0.01, 3, 0.04, 0.05), row("unisrec-scratch-hist", 0.01, 3, 0.05, 0.04),
               row("unisrec-scratch-probe", 0.01, 1, 0.09, 0.09),  # one seed where three ran: no pick
               row("unisrec-scratch", 0.1, 3, 0.06, 0.06), row("zero-shot (x)", 0.0, 1, 0.03, 0.03)]
    lines = envelope(summary)
    assert list(lines) == ["unisrec-scratch"]  # zero-shot (fraction 0) is a horizontal line of its own
    assert [(p["method"], p["fraction"]) for p in lines["unisrec-scratch"]] == [
        ("unisrec-scratch-hist", 0.01), ("unisrec-scratch", 0.1)]
