"""Schema fuzz of the HTTP service: schemathesis generates requests (valid and invalid) for every
operation of the app's OpenAPI schema and sends them in-process to a tiny SASRec service and a tiny
UniSRec service (a text model, so POST /items adds real items). No request may get a 5xx, and every
response whose status the schema declares must match the declared schema.

Each operation's cases come from `operation.as_strategy()` under plain Hypothesis: schemathesis's own
pytest loader (`from_fixture(...).parametrize()`) fails under pytest 9 ('Function' object has no
attribute '_nodeid')."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import response_schema_conformance  # noqa: E402

from seqrec.serve import Recommender  # noqa: E402
from seqrec.serve.app import create_app  # noqa: E402
from tests.serve_helpers import train_tiny_runs  # noqa: E402

CHECKS = [not_a_server_error, response_schema_conformance]
OPERATIONS = {  # every operation of the schema; a new route must be added here (and is then fuzzed)
    "POST /recommend", "POST /recommend/batch", "POST /items", "GET /items", "GET /items/{item_id}",
    "DELETE /items/{item_id}", "GET /similar/{item_id}", "POST /sessions/{session_id}/events",
    "GET /sessions/{session_id}", "DELETE /sessions/{session_id}", "GET /health", "GET /metrics",
    "POST /items/remove",
}
REACH_THE_MODEL = {"POST /recommend", "POST /recommend/batch", "GET /items/{item_id}", "GET /similar/{item_id}",
                   "POST /sessions/{session_id}/events"}
# 30 examples per operation and generation mode, the same ones on every run (a CI failure reproduces)
FUZZ = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return train_tiny_runs(tmp_path_factory.mktemp("fuzz"))


def _schema(run: Path) -> tuple[schemathesis.BaseSchema, list[str]]:
    """A fresh service over the run, as schemathesis sees it, and the run's item ids."""
    rec = Recommender.from_run(run)
    return schemathesis.openapi.from_asgi("/openapi.json", create_app(rec)), list(rec.catalogue.raw_ids)


@pytest.mark.parametrize("model", ["sasrec", "unisrec"])
def test_schema_lists_every_operation(runs: dict[str, Path], model: str) -> None:
    """Guards the fuzz below against fuzzing less than the whole service."""
    schema, _ = _schema(runs[model])
    assert {op.ok().label for op in schema.get_all_operations()} == OPERATIONS


NO_INPUT = {"GET /health", "GET /metrics"}  # nothing to make invalid: fuzzed with valid requests only
CASES = [(mode, model, op) for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
         for model in ("sasrec", "unisrec") for op in sorted(OPERATIONS)
         if not (mode == GenerationMode.NEGATIVE and op in NO_INPUT)]


def _with_known_ids(case: schemathesis.Case, known: list[str], start: int) -> None:
    """Swap the generated item ids of a case for catalogue ids (in turn from `start`) and fold k into
    1..n_items, so that requests reach the model and the catalogue, not only the 404 / 400 answers."""
    turn = itertools.islice(itertools.cycle(known), start, None)
    if case.path_parameters and "item_id" in case.path_parameters:
        case.path_parameters["item_id"] = next(turn)
    if case.query and isinstance(case.query.get("k"), int):
        case.query["k"] = 1 + (case.query["k"] - 1) % len(known)
    body = case.body
    if not isinstance(body, dict):
        return
    if isinstance(body.get("k"), int) and not isinstance(body["k"], bool):
        body["k"] = 1 + (body["k"] - 1) % len(known)
    if isinstance(body.get("history"), list):
        body["history"] = [next(turn) for _ in body["history"]]
    if isinstance(body.get("histories"), list):
        body["histories"] = [[next(turn) for _ in h] if isinstance(h, list) else h for h in body["histories"]]
    if isinstance(body.get("item"), str):
        body["item"] = next(turn)
    if isinstance(body.get("ids"), list):
        body["ids"] = [next(turn) for _ in body["ids"]]
    for new in body.get("items") or []:
        if isinstance(new, dict) and isinstance(new.get("id"), str):
            new["id"] = next(turn)


@pytest.mark.parametrize(("mode", "model", "operation"), CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_fuzz(runs: dict[str, Path], mode: GenerationMode, model: str, operation: str) -> None:
    """`mode` positive: valid requests, half of them with catalogue ids; negative: requests that break
    the schema (each must be a 4xx). A fresh service per operation, so DELETE /items cannot empty the
    catalogue of the others."""
    schema, known = _schema(runs[model])
    method, path = operation.split(" ")
    statuses: list[int] = []

    @FUZZ
    @given(case=schema[path][method].as_strategy(generation_mode=mode), use_known=st.booleans(),
           start=st.integers(0, len(known) - 1))
    def fuzz(case: schemathesis.Case, use_known: bool, start: int) -> None:
        if use_known and mode == GenerationMode.POSITIVE:
            _with_known_ids(case, known, start)
        statuses.append(case.call_and_validate(checks=CHECKS).status_code)

    fuzz()
    if mode == GenerationMode.POSITIVE and operation in REACH_THE_MODEL:
        assert 200 in statuses, f"no valid request got an answer: {sorted(set(statuses))}"
