"""benchmarks/serve_compaction.py in its tiny mode: `seqrec serve --workers 2 --catalogue-log` taking items
added by text under load while the log is compacted from another process every half second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_helpers import run_benchmark

pytest.importorskip("onnxruntime")
pytest.importorskip("faiss")


@pytest.mark.slow
def test_compactions_under_load_lose_nothing(tmp_path: Path) -> None:
    out = tmp_path / "serve_compaction.json"
    run_benchmark("serve_compaction.py", "--tiny", "--out", str(out), timeout=600)
    r = json.loads(out.read_text())["result"]
    assert r["compactions"] >= 1, "no compaction ran while the items were added"
    assert r["add_failures"] == 0 and r["new_in_history_failures"] == 0 and r["load_during_adds"]["failed"] == 0
    assert r["visible_within_1s"] == r["added"] == 20  # each returned by either worker within a second
    replay = r["replay"]  # the compacted log, replayed into a fresh model, holds every item added
    assert replay["items_added_found"] == 20 and replay["items_active"] == replay["items_expected"]
    assert replay["dropped"] == 0
