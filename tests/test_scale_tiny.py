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
    run_benchmark("train_throughput.py", "--tiny", "--compare", "--dims", "16", "--steps", "2", "--warmup", "1",
                  "--out", str(out))
    result = json.loads(out.read_text())
    assert {r["precision"] for r in result["rows"]} == {"float32", "bf16"}
    for row in result["rows"]:
        assert row["steps"] == 2 and row["targets"] > 0 and row["seconds"] > 0
        assert row["gflop_per_step"] > 0 and row["fraction_of_peak"] > 0
        assert row["auto"]["model.loss"] == "ce" and set(row["median_phase_s"]) >= {"forward", "backward", "optimizer"}
        assert row["reference"]["targets"] == row["targets"] > 0  # the replaced code trained on the same batches


def test_replaced_code_computes_the_same_loss(tmp_path: Path) -> None:
    """The speed-up column compares like with like: the code the profile replaced gives the same loss
    (UniSRec's whitening layer is checked draw for draw in test_unisrec)."""
    import sys

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import train_throughput as tt

    from seqrec.data.prepare import PrepareOptions, prepare
    from seqrec.data.synthetic import LogShape, generated_dataset

    data = prepare(generated_dataset(LogShape(n_interactions=3000, n_users=200, n_items=150)), PrepareOptions(),
                   tmp_path / "d")
    cfg, _ = tt.config_for(16, data, "float32")  # the defaults: full softmax + history bias, dropout
    assert cfg.model.history_bias is True
    _, _, batches, step = tt.setup(cfg, data, torch.device("cpu"))
    batch = next(iter(batches))
    torch.manual_seed(5)
    loss = step(batch)
    with tt.reference_paths():
        torch.manual_seed(5)  # the same dropout draws
        ref = step(batch)
    torch.testing.assert_close(loss, ref)
