"""benchmarks/defaults.py finds the best-validated run of a model on a dataset across results files
of different shapes, and leaves out peers' runs, seen-filtered runs and its own file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import defaults  # noqa: E402


def test_best_rows_across_file_shapes(tmp_path: Path) -> None:
    def run(valid: float, test: float, **extra: object) -> dict[str, object]:
        return {"valid": {"ndcg@10": valid}, "test": {"ndcg@10": test}, **extra}

    (tmp_path / "zoo.json").write_text(json.dumps({
        "ml-100k/sasrec": run(0.05, 0.04, dataset="ml-100k", model="sasrec"),
        "ml-100k/gru4rec": run(0.06, 0.05, dataset="ml-100k", model="gru4rec")}))
    (tmp_path / "sasrec_quality_x.json").write_text(json.dumps({
        "a": run(0.07, 0.06, config={"data": {"dataset": "/p/ml-100k"}, "model": {"name": "sasrec"}}),
        "filtered": run(0.5, 0.5, config={"data": {"dataset": "/p/ml-100k"}, "model": {"name": "sasrec"}},
                        protocol={"filter_seen": True})}))
    (tmp_path / "speed_vs_recbole.json").write_text(json.dumps({"runs": {
        "recbole": {"best_valid_ndcg@10": 0.9, "test": {"ndcg@10": 0.9}},
        "seqrec-recbole-arch": {"best_valid_ndcg@10": 0.08, "test": {"ndcg@10": 0.07}}}}))
    (tmp_path / "defaults.json").write_text(json.dumps({"x": run(0.99, 0.99, dataset="ml-100k", model="sasrec")}))

    def flat(method: str, valid: float, test: float) -> dict[str, object]:
        return {"method": method, "fraction": 0.25, "seed": 1, "valid_ndcg@10": valid, "test_ndcg@10": test,
                "test_recall@10": 2 * test}

    (tmp_path / "data_efficiency_games.json").write_text(json.dumps({"target": "games", "runs": [
        flat("sasrec-p20", 0.03, 0.02), flat("pt-inductive (pre)", 0.04, 0.035), flat("unisrec-scratch", 0.05, 0.03),
        flat("popularity", 0.9, 0.9)]}))
    best = defaults.best_rows(tmp_path)
    assert best[("games", "sasrec")]["test"] == {"ndcg@10": 0.02, "recall@10": 0.04}
    assert best[("games", "unisrec")]["from"] == ("data_efficiency_games.json/runs/2 "
                                                  "(unisrec-scratch, 25% of users, seed 1)")
    assert ("games", "popularity") not in best
    assert best[("ml-100k", "sasrec")]["from"] == "speed_vs_recbole.json/runs/seqrec-recbole-arch"
    assert best[("ml-100k", "sasrec")]["test"]["ndcg@10"] == 0.07
    assert best[("ml-100k", "gru4rec")]["valid_ndcg@10"] == 0.06


def test_run_records_take_from_their_own_folder_only(tmp_path: Path) -> None:
    """A record is filled from its run folder (training defaults, cap) only while the folder holds that run:
    a later run into the same folder must not lend its settings to the earlier record."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"train": {"optimizer": "adamw", "weight_decay": 0.1, "ema": 0.997,
                                                           "refit": True, "time_budget_s": 100.0}}))
    (run / "results.json").write_text(json.dumps({"test": {"ndcg@10": 0.2}, "auto": [{"key": "history_bias"}]}))
    (run / "metrics.jsonl").write_text('{"epoch": 1, "elapsed_s": 60.0}\n{"epoch": 2, "elapsed_s": 120.0}\n')
    mine = {"run": str(run), "test": {"ndcg@10": 0.2}, "train_seconds": 240.0}  # with the refit
    other = {"run": str(run), "test": {"ndcg@10": 0.1}, "train_seconds": 50.0, "stopped_by_cap": False}
    assert defaults._folder_holds(mine) and not defaults._folder_holds(other)
    filled = defaults.with_run_folder(dict(mine))
    assert filled["train_defaults"] == {"optimizer": "adamw", "weight_decay": 0.1, "ema": 0.997, "refit": True}
    assert filled["stopped_by_cap"] is True and filled["auto"] == [{"key": "history_bias"}]
    (run / "metrics.jsonl").write_text('{"epoch": 1, "elapsed_s": 60.0}\n')  # early-stopped: the refit is not the cap
    assert defaults.stopped_by_cap(mine) is False
    gone = defaults.with_run_folder({"run": str(tmp_path / "gone"), "test": {}, "stopped_by_cap": True})
    assert gone["stopped_by_cap"] is True and "train_defaults" not in gone  # what the record had is kept


def test_candidate_keeps_each_default_runs_cap_and_compares_on_validation() -> None:
    """A candidate default runs under the cap its default run had (the last `--set` wins) and is compared
    with that run on validation and test NDCG@10."""
    command = ("seqrec.cli train --dataset d --model sasrec --set train.time_budget_s=600.0 "
               "--set train.threads=1 --set train.time_budget_s=900.0")
    assert defaults.command_sets(command).get("train.time_budget_s") == "900.0"
    assert defaults.command_sets(command).get("train.epochs") is None
    base = {"valid": {"ndcg@10": 0.10}, "test": {"ndcg@10": 0.20}, "device": "cpu"}
    new = {"valid": {"ndcg@10": 0.12}, "test": {"ndcg@10": 0.15}, "device": "cpu"}
    rep = defaults.candidate_report("c", ["model.n_heads=2"], {"d/sasrec": {**new, "replaces": base},
                                                               "e/sasrec": new})
    row, lone = rep["rows"]
    assert abs(row["valid_ratio"] - 1.2) < 1e-9 and abs(row["test_ratio"] - 0.75) < 1e-9
    assert "default" not in lone and "valid_ratio" not in lone and rep["sets"] == ["model.n_heads=2"]
