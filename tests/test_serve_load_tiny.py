"""benchmarks/serve_load.py in its tiny mode: the service under bounded loopback load, the live catalogue
on both engines (a text model served by ONNX Runtime while items are added by text), shared by two worker
processes through a catalogue log, the restarts, sessions spread over two worker processes, the sessions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_helpers import run_benchmark

pytest.importorskip("onnxruntime")
pytest.importorskip("faiss")


@pytest.mark.slow
def test_the_benchmark_runs_tiny(tmp_path: Path) -> None:
    out = tmp_path / "serve_load.json"
    run_benchmark("serve_load.py", "--tiny", "--out", str(out), timeout=600)
    result = json.loads(out.read_text())
    assert result["tiny"] and result["n_items"] == 2_000
    assert set(result["recommend"]) == {"exact", "ivf", "ivf, onnx engine"}
    for rows in result["recommend"].values():
        assert set(rows) == {"1", "8", "32"} and all(r["failed"] == 0 and r["ok"] > 0 for r in rows.values())
    fast = result["fast_path"]  # the same service with and without the fast path, each its server's CPU counted
    for label in ("fast path", "FastAPI routing"):
        r = fast[label]["median"]
        assert r["failed"] == 0 and r["statuses"] == {"200": r["ok"]} and r["server_cpu_ms_per_request"] > 0
    assert fast["cpu_ratio"] > 0 and fast["throughput_ratio"] > 0
    assert set(result["floor"]) == {"1", "8", "32"}  # GET /health: the HTTP stack alone
    assert all(r["failed"] == 0 and r["ok"] > 0 and r["statuses"] == {"200": r["ok"]} for r in result["floor"].values())
    start = result["start"]  # a start that exports the ONNX graph, and one that loads the graph kept
    assert set(start["start_s"]) == {"export", "kept"} and all(len(t) == 1 for t in start["start_s"].values())
    for key, engine in (("live", "torch"), ("live_ivf_onnx", "onnx")):
        live = result[key]
        assert live["engine"] == engine and live["add_failures"] == 0 and live["load_during_adds"]["failed"] == 0
        assert live["added"] == 20 and live["new_in_history_failures"] == 0  # a history may hold a new item
        assert live["visible_s_max"] < 5  # every added item found by /similar (the benchmark waits up to 5 s)
    live = result["workers"]["2"]  # the adds through the catalogue log, both workers following it
    assert live["added"] == 20 and live["add_failures"] == 0 and live["load_during_adds"]["failed"] == 0
    assert live["new_in_history_failures"] == 0 and live["visible_s_max"] < 5 and "1" not in result["workers"]
    restart = result["workers"]["restart"]
    assert restart["changes"] == 20 and restart["log_bytes"] > restart["log_without_vectors_bytes"]
    # tiny: the restarts that replay the log, once each (the full run adds starts with no log, its baseline)
    assert set(restart["start_s"]) == {"log with vectors", "log without vectors"}
    assert all(len(times) == 1 for times in restart["start_s"].values())
    for key, index in (("deletes_hnsw", "hnsw"), ("deletes_ivf", "ivf")):
        gone = result[key]  # 600 of 2,000 items deleted: past a quarter, so the index was rebuilt
        assert gone["index"] == index and gone["deleted"] == 600 and gone["delete_failures"] == 0
        assert gone["rebuilds_logged"] >= 1 and gone["load_during_deletes"]["failed"] == 0
    shared = result["shared_sessions"]["2"]  # sessions spread over the workers answer as /recommend does
    assert set(result["shared_sessions"]) == {"2"}
    assert shared["events"] == 160 and shared["failures"] == 0 and shared["differ_from_recommend"] == 0
    # /metrics, through whichever worker answers it, counts what every worker answered
    assert shared["metrics"] == {"events": 160, "recommend": shared["recommend_checks"], "workers": 2}
    assert set(result["sessions"]) == {"10", "50"}
    # parts run again keep the others
    before = result["sessions"]
    run_benchmark("serve_load.py", "--tiny", "--out", str(out), "--parts", "sessions")
    again = json.loads(out.read_text())
    assert again["recommend"] == result["recommend"] and again["sessions"] != before
