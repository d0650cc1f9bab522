"""POST /recommend answered beneath the framework (`seqrec.serve.fast_route`) answers every request, good or
bad, exactly as FastAPI's own route does: the same status, body and content type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from seqrec.serve import Recommender
from seqrec.serve.app import create_app
from seqrec.serve.fast_route import FastRoute
from seqrec.serve.metrics import Limits
from tests.serve_helpers import train_tiny_runs

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

JSON = {"content-type": "application/json"}

# (body, headers): each a request a client could send; bodies given as bytes are sent as they are
REQUESTS: list[tuple[Any, dict[str, str]]] = [
    ({"history": ["i3", "i4", "i5"], "k": 5}, JSON),
    ({"history": ["i1"]}, JSON),
    ({"history": ["i3", "i4"], "k": 3, "exclude_seen": True}, JSON),
    ({"history": ["i3", "nope", "i5"], "unknown": "skip"}, JSON),
    ({"history": ["i3"], "candidates": ["i7", "i8", "i9"], "k": 2}, JSON),
    ({"history": ["i3"], "candidates": ["i7", "gone"], "unknown": "skip", "k": 2}, JSON),
    ({"history": ["i3"], "k": 3}, {"content-type": "application/json; charset=utf-8"}),
    ({"history": ["i3"], "k": 3}, {"content-type": "application/vnd.api+json"}),
    # refused: by validation (replayed to the framework), by the handler (the app's exception handlers)
    ({"history": ["nope"]}, JSON),
    ({"history": [3, 4]}, JSON),  # integer ids are their decimal strings: not these items
    ({"history": ["i3"], "candidates": ["gone"], "unknown": "skip"}, JSON),
    ({"history": []}, JSON),
    ({"history": ["i3"], "k": 0}, JSON),
    ({"history": ["i3"], "k": 999}, JSON),  # a valid k, more than the catalogue holds
    ({"history": ["i3"], "k": True}, JSON),
    ({"history": ["i3"], "k": "3"}, JSON),
    ({"history": ["i3"], "extra": 1}, JSON),
    ({"history": ["i3"], "times": [1.0, 2.0]}, JSON),
    ({"history": ["i3"], "events": {"rating": [4.0]}}, JSON),
    (b'{"history": ["i3"], "times": [NaN]}', JSON),
    (b'{"history": ["i3"', JSON),
    (b"\xff\xfe", JSON),
    (b"[1, 2]", JSON),
    (b"", JSON),
    (b'{"history": ["i3"]}', {"content-type": "text/plain"}),
    (b'{"history": ["i3"]}', {}),
    (b"history=i3", {"content-type": "application/x-www-form-urlencoded"}),
    (b'{"history": ["' + b"i3" * 400 + b'"]}', JSON),  # over the body limit below: a 413
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny_runs(tmp_path_factory.mktemp("fast"), ("sasrec",))["sasrec"]


def answers(client: TestClient) -> list[tuple[int, str, Any]]:
    out = []
    for body, headers in REQUESTS:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = client.post("/recommend", content=content, headers=headers)
        out.append((r.status_code, r.headers.get("content-type", ""), r.json()))
    return out


def test_fast_route_answers_as_the_framework(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    limits = Limits(max_body_bytes=600)
    fast_calls = []
    call = FastRoute.__call__

    async def counted(self: FastRoute, *args: Any) -> None:
        fast_calls.append(1)
        await call(self, *args)

    monkeypatch.setattr(FastRoute, "__call__", counted)
    with TestClient(create_app(Recommender.from_run(run), limits=limits, fast_path=False)) as framework:
        want = answers(framework)
    assert not fast_calls
    with TestClient(create_app(Recommender.from_run(run), limits=limits)) as fast:
        got = answers(fast)
        metrics = fast.get("/metrics").text
    assert len(fast_calls) == len(REQUESTS) - 1  # all but the one refused for its declared length
    for (body, _), g, w in zip(REQUESTS, got, want, strict=True):
        assert g == w, body
    statuses = [status for status, _, _ in want]
    assert statuses[:8] == [200] * 8 and all(400 <= s < 500 for s in statuses[8:]), statuses
    assert 413 in statuses and 404 in statuses and 400 in statuses and 422 in statuses
    # the fast path's requests are counted and timed as every other request
    assert 'seqrec_requests_total{method="POST",route="/recommend",status="200"} 8' in metrics, metrics
