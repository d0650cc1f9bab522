"""benchmarks/serve_deploy.py in its tiny mode: a new run deployed into `seqrec serve --workers 2` under load
by switching the run's link and sending SIGHUP (the workers replaced one at a time); with a catalogue log carried
over to a run that knows more items, while items are added by text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_helpers import run_benchmark


@pytest.mark.slow
def test_a_deploy_under_load_loses_no_request(tmp_path: Path) -> None:
    out = tmp_path / "serve_deploy.json"
    run_benchmark("serve_deploy.py", "--tiny", "--out", str(out), timeout=600)
    r = json.loads(out.read_text())["result"]
    assert r["switched_after_s"] is not None, "the workers did not all come to serve run B"
    assert r["old_workers"] == 2  # both of run A's workers answered before the deploy, and both were replaced
    load = r["load"]
    assert load["requests"] > 0 and load["error_answers"] == 0 and load["failed_after_retry"] == 0
    assert r["answers_equal_run_b"] == r["answers_checked"] == 20 and r["answers_equal_run_a"] == 0
    assert r["leaked_semaphores"] == 0  # the replaced workers left nothing behind


@pytest.mark.slow
def test_a_deploy_with_a_new_catalogue_keeps_every_item_added(tmp_path: Path) -> None:
    out = tmp_path / "serve_deploy_catalogue.json"
    run_benchmark("serve_deploy.py", "--tiny", "--catalogue", "--out", str(out), timeout=600)
    r = json.loads(out.read_text())["result"]
    assert r["carry_exit"] == 0 and "carrying" in r["carry_said"]
    assert r["switched_after_s"] is not None and r["old_workers"] == 2
    assert r["items_added"] > 0 and r["items_added_found_after"] == r["items_added"] and r["add_failures"] == 0
    assert r["own_texts_kept"] == 5 and r["removed_kept"] == 2 and r["leaked_semaphores"] == 0
    load = r["load"]
    assert load["requests"] > 0 and load["error_answers"] == 0 and load["failed_after_retry"] == 0
