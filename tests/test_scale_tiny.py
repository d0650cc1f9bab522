"""benchmarks/scale.py runs end to end in its tiny mode (20k generated interactions)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_helpers import run_benchmark


def test_scale_benchmark_tiny_mode() -> None:
    done = run_benchmark("scale.py", "--tiny")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["interactions"] == 20_000 and row["prepare"]["total_s"] > 0 and row["prepare"]["peak_rss_mb"] > 0
    assert row["epoch"]["targets"] > 0 and row["epoch"]["epoch_targets"] > 0
    assert row["evaluation"]["users"] == 500 and row["index"]["build_s"] > 0


def test_step_profile_tiny(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    run_benchmark("step_profile.py", "--sizes", "20000", "--steps", "2", "--out", str(out))
    dense, sparse = json.loads(out.read_text())["rows"]  # the same size with dense, then sparse table gradients
    assert (dense["sparse_items"], sparse["sparse_items"]) == (False, True) and dense["items"] == sparse["items"] > 0
    for row in (dense, sparse):
        assert row["steps"] == 2 and set(row["median_s"]) == {"forward", "backward", "clip", "optimizer"}
        assert row["step_s"] == sum(row["median_s"].values())


def test_train_throughput_tiny(tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    run_benchmark("train_throughput.py", "--tiny", "--dims", "16", "--steps", "2", "--warmup", "1", "--out", str(out))
    result = json.loads(out.read_text())
    assert {r["precision"] for r in result["rows"]} == {"float32", "bf16"}
    for row in result["rows"]:
        assert row["steps"] == 2 and row["targets"] > 0 and row["seconds"] > 0
        assert row["gflop_per_step"] > 0 and 0 < row["fraction_of_peak"] == row["gflop_per_s"] / row["peak_gflop_per_s"]
        assert row["auto"]["model.loss"] == "ce" and set(row["median_phase_s"]) >= {"forward", "backward", "optimizer"}
