"""benchmarks/cuda_check.py: its ranking check runs on any device in tiny mode, and it catches a
device whose ranks differ from the CPU path's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cuda_check  # noqa: E402

from tests.bench_helpers import run_benchmark  # noqa: E402


def test_ranking_section_tiny_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "cuda_check.json"
    run_benchmark("cuda_check.py", "--tiny", "--device", "cpu", "--only", "peak,ranking", "--out", str(out))
    result = json.loads(out.read_text())
    assert result["peak"]["fp32_tflops"] > 0
    for case in result["ranking"]["equal_to_cpu"].values():  # the same device: the same ranks
        assert case["users"] == 600 and case["mismatches"] == 0
    assert result["ranking"]["users"] == 2000 and result["ranking"]["seconds_median"] > 0


def test_boundary_margin_finds_planted_ties() -> None:
    p = cuda_check.planted(30, 400, 16)
    assert cuda_check.boundary_margin(p, 0, bias=True) == pytest.approx(1.0)  # user 0's target has exact copies
    assert cuda_check.boundary_margin(p, 1, bias=True) > 1.0


def test_a_cuda_request_without_a_gpu_is_refused() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = run_benchmark("cuda_check.py", "--only", "ranking", timeout=120, ok=False)
    assert done.returncode != 0 and "no CUDA device" in done.stderr
