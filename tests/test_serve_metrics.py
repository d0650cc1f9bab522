"""/metrics: counts, quantiles and histogram of one process, and pooled over the worker processes of one
service through a shared folder (seqrec.serve.metrics)."""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from seqrec.serve.metrics import BUCKETS, Metrics


def values(text: str, name: str) -> dict[str, float]:
    """{labels: value} of the samples of metric `name` in a Prometheus text."""
    return {m[1] or "": float(m[2]) for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M)}


def test_latency_summary_count_is_the_total_not_the_window() -> None:
    """A summary's _count counts every request, not the quantile window (it stopped at 10,000, so
    rate(..._count) read 0 on a busy service); a _sum goes with it."""
    metrics = Metrics(window=3)
    for _ in range(5):
        metrics.observe("POST", "/recommend", 200, 0.01)
    text = metrics.render()
    assert 'seqrec_request_latency_seconds_count{route="/recommend"} 5' in text, text
    assert values(text, "seqrec_request_latency_seconds_sum") == {'{route="/recommend"}': 0.05}


def test_histogram_buckets_are_cumulative_and_bounded_by_le() -> None:
    metrics = Metrics()
    seconds = [0.0002, 0.0005, 0.003, 0.003, 0.2, 42.0]  # 0.0005 sits on a bound: le is "less or equal"
    for s in seconds:
        metrics.observe("GET", "/health", 200, s)
    got = values(metrics.render(), "seqrec_request_duration_seconds_bucket")
    for le in [*BUCKETS, float("inf")]:
        label = "+Inf" if le == float("inf") else str(le)
        assert got[f'{{route="/health",le="{label}"}}'] == sum(s <= le for s in seconds), le
    assert len(got) == len(BUCKETS) + 1


def test_workers_pool_counts_quantiles_and_own_values(tmp_path: Path) -> None:
    """Each worker's counts reach the others' /metrics through the folder: counters and buckets summed,
    quantiles over every worker's recent requests, gauges the largest of the running workers; a worker
    that exited still counts in the counters but no longer in the gauges or the worker count."""
    own = [{"seqrec_sessions": 4, "seqrec_catalogue_items": 30, "seqrec_recommend_batches_total": 7},
           {"seqrec_sessions": 4, "seqrec_catalogue_items": 31, "seqrec_recommend_batches_total": 5}]
    one, two = (Metrics(own=lambda o=o: o, share=tmp_path, interval_s=60.0) for o in own)
    one.start()
    two.start()
    rng = np.random.default_rng(0)
    fast, slow = rng.uniform(0.001, 0.002, 300), rng.uniform(0.1, 0.2, 100)
    for s in fast:
        one.observe("POST", "/recommend", 200, float(s))
    for s in slow:
        two.observe("POST", "/recommend", 200, float(s))
    two.observe("POST", "/recommend", 404, 0.001)
    two.write()
    text = one.render()
    assert values(text, "seqrec_requests_total") == {
        '{method="POST",route="/recommend",status="200"}': 400, '{method="POST",route="/recommend",status="404"}': 1}
    both = np.concatenate([fast, slow, [0.001]])
    quantiles = values(text, "seqrec_request_latency_seconds")
    for q in (0.5, 0.9, 0.99):  # of all 401 requests (float32 in the file: 1e-6 s)
        assert abs(quantiles[f'{{route="/recommend",quantile="{q}"}}'] - np.quantile(both, q)) < 2e-6, q
    assert values(text, "seqrec_request_duration_seconds_count") == {'{route="/recommend"}': 401}
    assert abs(values(text, "seqrec_request_duration_seconds_sum")['{route="/recommend"}'] - both.sum()) < 1e-4
    assert values(text, "seqrec_recommend_batches_total") == {"": 12}
    assert values(text, "seqrec_catalogue_items") == {"": 31} and values(text, "seqrec_sessions") == {"": 4}
    assert values(text, "seqrec_workers") == {"": 2}

    # the second worker's file as written by a process that has exited (its pid no longer runs)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = next(p for p in tmp_path.glob("worker-*.json") if p != one._file)
    record = json.loads(path.read_text())
    record["pid"] = int(gone.stdout)
    path.write_text(json.dumps(record))
    text = one.render()
    assert values(text, "seqrec_requests_total")['{method="POST",route="/recommend",status="200"}'] == 400
    assert values(text, "seqrec_recommend_batches_total") == {"": 12}
    assert values(text, "seqrec_catalogue_items") == {"": 30} and values(text, "seqrec_workers") == {"": 1}
    # its latencies are no longer recent: the quantiles are the running worker's; the counts keep them
    quantiles = values(text, "seqrec_request_latency_seconds")
    assert abs(quantiles['{route="/recommend",quantile="0.99"}'] - np.quantile(fast, 0.99)) < 2e-6
    assert values(text, "seqrec_request_latency_seconds_count") == {'{route="/recommend"}': 401}

    # its file was added into the exited workers' sum, and removed: a scrape reads one file for all of them
    assert not path.exists() and (tmp_path / "retired.json").is_file()
    assert values(one.render(), "seqrec_recommend_batches_total") == {"": 12}  # not counted twice

    # a route only exited workers served keeps its count and sum, with no quantiles
    record.update(counts=[["GET", "/health", 200, 3]], seconds={"/health": 0.003},
                  buckets={"/health": [0, 0, 3] + [0] * (len(BUCKETS) - 2)}, own={})
    path.with_name("worker-gone-2.json").write_text(json.dumps(record))
    text = one.render()
    assert values(text, "seqrec_request_latency_seconds_count")['{route="/health"}'] == 3
    assert values(text, "seqrec_request_duration_seconds_count")['{route="/health"}'] == 3
    assert '{route="/health",quantile' not in text
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["retired.json", one._file.name]  # type: ignore[union-attr]
    one.close()


def test_counters_never_fall_whichever_worker_answers(tmp_path: Path) -> None:
    """A scrape writes what it shows of its own first: the next scrape, through another worker, adds at least
    that (it added the other's last timed write, older, and a counter fell: Prometheus reads a reset)."""
    a, b = Metrics(share=tmp_path, interval_s=60.0), Metrics(share=tmp_path, interval_s=60.0)
    a.start()
    b.start()  # from here on no timed write within the test
    total = 'seqrec_requests_total{method="GET",route="/health",status="200"}'
    shown = []
    for worker, n in ((a, 5), (b, 3), (a, 2), (b, 1)):
        for _ in range(n):
            worker.observe("GET", "/health", 200, 0.001)
        shown.append(values(worker.render(), total.split("{")[0])[total[len("seqrec_requests_total"):]])
    assert shown == [5, 8, 10, 11]
    a.close()
    b.close()


def test_the_writer_goes_on_after_a_failure_and_close_never_raises(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The service's own values come from the session store: an error there (sqlite3's, not an OSError) is
    logged once, and the next write succeeds; a stop whose last write fails still stops."""
    fail = [True]

    def own() -> dict[str, float]:
        if fail[0]:
            raise sqlite3.OperationalError("database is locked")
        return {"seqrec_sessions": 1}

    writer, reader = Metrics(own=own, share=tmp_path, interval_s=0.02), Metrics(share=tmp_path)
    with caplog.at_level(logging.WARNING, logger="seqrec.serve"):
        writer.start()  # its first write fails: logged, and the worker starts all the same
        time.sleep(0.1)
    assert [r.getMessage() for r in caplog.records if "could not write" in r.getMessage()] == [
        f"metrics: could not write {writer._file}: database is locked"]  # once, not every 0.02 s
    writer.observe("GET", "/health", 200, 0.001)
    fail[0] = False
    deadline = time.monotonic() + 5
    while "seqrec_requests_total{" not in reader.render() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert values(reader.render(), "seqrec_sessions") == {"": 1}
    fail[0] = True
    writer.close()  # its last write fails: logged, not raised


def test_a_worker_writes_on_its_own_and_when_it_stops(tmp_path: Path) -> None:
    """The writer thread: a first write at start, new counts within its interval, a last write at close;
    a file that is not a worker's is skipped, not an error."""
    (tmp_path / "worker-junk.json").write_text("{not json")
    writer, reader = Metrics(share=tmp_path, interval_s=0.05), Metrics(share=tmp_path)
    writer.start()
    assert "seqrec_workers 2" in reader.render()
    writer.observe("GET", "/health", 200, 0.001)
    deadline = time.monotonic() + 5
    while "seqrec_requests_total{" not in reader.render() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert values(reader.render(), "seqrec_requests_total") == {'{method="GET",route="/health",status="200"}': 1}
    writer.interval_s = 60.0  # no timed write any more: only close's last one brings the next count
    time.sleep(0.1)
    writer.observe("GET", "/health", 200, 0.001)
    assert values(reader.render(), "seqrec_requests_total") == {'{method="GET",route="/health",status="200"}': 1}
    writer.close()
    assert values(reader.render(), "seqrec_requests_total") == {'{method="GET",route="/health",status="200"}': 2}


def test_an_exited_workers_file_added_before_a_stop_is_not_added_twice(tmp_path: Path) -> None:
    """The sum of exited workers names the files it took in until they are removed: one still there (the process
    that added it stopped before removing it) is removed, not added again."""
    from seqrec.serve.metrics import Counted

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    worker = Counted(counts={("GET", "/health", 200): 4}, seconds={"/health": 0.004},
                     buckets={"/health": [4] + [0] * len(BUCKETS)})
    (tmp_path / "worker-a.json").write_text(worker.to_json(int(gone.stdout)))
    retired = Counted(running=False, folded=["worker-a.json"])
    retired.add(worker)
    (tmp_path / "retired.json").write_text(retired.to_json(None))
    reader = Metrics(share=tmp_path)
    reader.start()
    total = values(reader.render(), "seqrec_requests_total")
    assert total['{method="GET",route="/health",status="200"}'] == 4  # from the sum only
    assert not (tmp_path / "worker-a.json").exists()
    reader.close()


def test_routes_are_labelled_as_the_api_names_them() -> None:
    from seqrec.serve.metrics import route_of

    assert route_of("/items/remove", "POST") == "/items/remove"  # bulk removal, not an item's page
    assert route_of("/items/remove", "DELETE") == "/items/{id}"  # an item whose id is "remove"
    assert route_of("/items/i42", "GET") == route_of("/items/i42", "DELETE") == "/items/{id}"
    assert route_of("/sessions/s1/events", "POST") == "/sessions/{id}/events" and route_of("/x/y/z") == "other"
