"""The service and the live catalogue: the HTTP answers equal `Recommender.recommend`, which equals the
model's full ranking; sessions equal a re-encoded history; items added by text are recommendable;
every bad request is a 4xx with a JSON error."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
import torch

from seqrec.cli import main
from seqrec.data.batching import history_batch
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.errors import SeqrecError
from seqrec.serve import Recommender
from seqrec.serve.app import create_app
from seqrec.serve.metrics import Limits
from tests.conftest import synthetic_log
from tests.unisrec_helpers import TEXT_DIM, make_tiny_encoder

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

TINY = ["--set", "model.d=16", "--set", "data.max_len=8", "--set", "train.progress=false", "--set", "train.lr=0.01"]
BLOCKS = ["--set", "model.n_layers=2", "--set", "model.n_heads=2", "--set", "model.d_ff=32"]
HISTORIES = [["i3", "i4", "i5"], ["i1"], ["i7", "i8", "i9", "i10", "i11", "i12", "i13", "i14", "i15", "i16"],
             ["i2", "i2", "i20", "i21"]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny trained runs: SASRec (positions from the start, history bias), SASRec (positions from the end),
    GRU4Rec, BERT4Rec and UniSRec (a tiny text encoder)."""
    root = tmp_path_factory.mktemp("serve")
    data = prepare(synthetic_log(), PrepareOptions(), root / "data").path
    enc = make_tiny_encoder(root / "enc")
    specs = {
        "sasrec": ["--model", "sasrec", "--set", 'model.positions_from="start"', "--set", "model.history_bias=true",
                   "--set", "train.epochs=15"],
        "sasrec-end": ["--model", "sasrec", "--set", "train.epochs=2"],
        "gru4rec": ["--model", "gru4rec", "--set", "train.epochs=2"],
        "bert4rec": ["--model", "bert4rec", "--set", "train.epochs=1"],
        "unisrec": ["--model", "unisrec", "--set", 'model.positions_from="start"', "--set", "train.epochs=3",
                    "--set", f'model.text_encoder="{enc}"', "--set", f"model.text_dim={TEXT_DIM}",
                    "--set", "model.text_max_length=16", "--set", "model.n_experts=2"],
    }
    out = {}
    for name, argv in specs.items():
        blocks = [] if name == "gru4rec" else BLOCKS
        assert main(["train", "--dataset", str(data), "--out", str(root / name), *TINY, *blocks, *argv]) == 0, name
        out[name] = root / name
    return out


def full_ranking(rec: Recommender, history: list[str], k: int) -> tuple[list[str], list[float]]:
    """The reference: the model's own scores of every item (with history offsets), top k."""
    batch = history_batch([rec.to_indices(history)], rec.max_len)
    scores = rec.model.score(batch)[0]
    scores[0] = -torch.inf
    top = torch.topk(scores, k)
    return [rec.catalogue.raw_ids[i - 1] for i in top.indices.tolist()], top.values.tolist()


@pytest.mark.parametrize("name", ["sasrec", "sasrec-end", "gru4rec", "bert4rec", "unisrec"])
def test_exact_path_equals_full_ranking(runs: dict[str, Path], name: str) -> None:
    rec = Recommender.from_run(runs[name])
    for history in HISTORIES:
        recs = rec.recommend(history, 10)
        ids, scores = full_ranking(rec, history, 10)
        assert [r.item for r in recs] == ids
        assert [r.score for r in recs] == pytest.approx(scores, abs=1e-5)


def test_service_topk_equals_recommender(runs: dict[str, Path]) -> None:
    rec = Recommender.from_run(runs["sasrec"])
    client = TestClient(create_app(rec))
    for history in HISTORIES:
        for exclude in (False, True):
            got = client.post("/recommend", json={"history": history, "k": 7, "exclude_seen": exclude})
            assert got.status_code == 200, got.text
            want = rec.recommend(history, 7, exclude_seen=exclude)
            assert [(r["item"], r["title"]) for r in got.json()["items"]] == [(r.item, r.title) for r in want]
            assert [r["score"] for r in got.json()["items"]] == pytest.approx([r.score for r in want], abs=1e-6)
    batch = client.post("/recommend/batch", json={"histories": HISTORIES, "k": 5}).json()["results"]
    assert [[r["item"] for r in row] for row in batch] == [[r.item for r in rec.recommend(h, 5)] for h in HISTORIES]


def test_candidates_rank_as_the_full_ranking_does(runs: dict[str, Path]) -> None:
    """/recommend with candidates: the full ranking's order and scores, restricted to them (a removed one and,
    with exclude_seen, seen ones left out); an unknown candidate is a 404 naming it."""
    rec = Recommender.from_run(runs["sasrec"])
    client = TestClient(create_app(rec))
    rec.remove_items(["i6"])
    candidates = ["i2", "i4", "i6", "i8", "i10", "i12", "i14", "i16"]
    for history in HISTORIES:
        for exclude in (False, True):
            body = {"history": history, "k": 4, "exclude_seen": exclude, "candidates": candidates}
            got = client.post("/recommend", json=body)
            assert got.status_code == 200, got.text
            full = rec.recommend(history, rec.catalogue.n_active, exclude_seen=exclude)
            want = [r for r in full if r.item in candidates][:4]
            assert [r["item"] for r in got.json()["items"]] == [r.item for r in want]
            assert [r["score"] for r in got.json()["items"]] == pytest.approx([r.score for r in want], abs=1e-5)
            assert "i6" not in [r["item"] for r in got.json()["items"]]
    unknown = client.post("/recommend", json={"history": ["i3"], "k": 3, "candidates": ["i2", "nope"]})
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]
    assert client.post("/recommend", json={"history": ["i3"], "k": 3, "candidates": []}).status_code == 422
    none_left = client.post("/recommend", json={"history": ["i3"], "k": 3, "exclude_seen": True,
                                                 "candidates": ["i6", "i3", "i6"]})
    assert none_left.status_code == 400 and none_left.json()["error"] == (
        "no candidate is left to recommend: of 2 distinct, 1 removed from recommendations, 1 (the others) in the "
        "history (exclude_seen)")
    gone = client.post("/recommend", json={"history": ["i3"], "k": 3, "candidates": ["i6"]})  # no history part
    assert gone.json()["error"] == "no candidate is left to recommend: of 1 distinct, 1 removed from recommendations"


def test_unknown_ids_may_be_skipped(runs: dict[str, Path]) -> None:
    """unknown = skip: the history without the ids the catalogue lacks (named in skipped), answered as that
    history; none known is a 404 (in a batch, an error for that history alone); a 404 naming them without
    it; times must still match the history given."""
    rec = Recommender.from_run(runs["sasrec"])
    client = TestClient(create_app(rec))
    got = client.post("/recommend", json={"history": ["i3", "gone", "i4", 77], "k": 5, "unknown": "skip"})
    assert got.status_code == 200 and got.json()["skipped"] == ["gone", "77"]
    assert [r["item"] for r in got.json()["items"]] == [r.item for r in rec.recommend(["i3", "i4"], 5)]
    assert client.post("/recommend", json={"history": ["i3", "i4"], "k": 5}).json()["skipped"] == []
    none = client.post("/recommend", json={"history": ["gone"], "k": 5, "unknown": "skip"})
    assert none.status_code == 404 and "no item of the history is known: 'gone'" in none.json()["error"]
    strict = client.post("/recommend", json={"history": ["i3", "gone"], "k": 5})
    assert strict.status_code == 404 and "'gone'" in strict.json()["error"]
    batch = client.post("/recommend/batch", json={"histories": [["i3", "gone", "i4"], ["i5"]], "k": 3,
                                                   "unknown": "skip"}).json()
    assert batch["skipped"] == [["gone"], []]
    assert [[r["item"] for r in row] for row in batch["results"]] == [
        [r.item for r in rec.recommend(h, 3)] for h in (["i3", "i4"], ["i5"])]
    assert batch["errors"] == [None, None]
    # a history with no known id has an error of its own; the others are answered
    part = client.post("/recommend/batch", json={"histories": [["i5"], ["gone", "lost"], ["i3"]], "k": 3,
                                                  "unknown": "skip"})
    assert part.status_code == 200 and part.json()["skipped"] == [[], ["gone", "lost"], []]
    assert part.json()["errors"][0] is None and part.json()["errors"][2] is None
    assert part.json()["errors"][1].startswith("no item of the history is known: 'gone'")
    assert [[r["item"] for r in row] for row in part.json()["results"]] == [
        [r.item for r in rec.recommend(["i5"], 3)], [], [r.item for r in rec.recommend(["i3"], 3)]]
    lost = client.post("/recommend/batch", json={"histories": [["gone"], ["lost"]], "unknown": "skip"})
    assert lost.status_code == 404 and lost.json()["error"].startswith("no history has a known item; histories.0")
    strict = client.post("/recommend/batch", json={"histories": [["i5"], ["gone"]]})
    assert strict.status_code == 404 and strict.json()["error"].startswith("histories.1: ")
    # candidates too: the unknown ones left out and named, the rest ranked exactly; none known is a 404
    picked = client.post("/recommend", json={"history": ["i3", "gone"], "candidates": ["nope", "i5", "i6"], "k": 2,
                                              "unknown": "skip"})
    assert picked.status_code == 200 and picked.json()["skipped"] == ["gone", "nope"]
    assert [r["item"] for r in picked.json()["items"]] == [r.item for r in rec.recommend(["i3"], 2,
                                                                                          candidates=["i5", "i6"])]
    nothing = client.post("/recommend", json={"history": ["i3"], "candidates": ["nope"], "unknown": "skip"})
    assert nothing.status_code == 404 and "no candidate is in the catalogue" in nothing.json()["error"]
    times = client.post("/recommend", json={"history": ["i3", "gone"], "times": [1.0], "k": 5, "unknown": "skip"})
    assert times.status_code in (400, 422) and "times" in times.json()["error"]


def test_a_body_not_sent_as_json_says_so(runs: dict[str, Path]) -> None:
    """curl -d without a content-type sends a form: the 422 says the body must be JSON; a refused input is not
    echoed back in the error's detail."""
    client = TestClient(create_app(Recommender.from_run(runs["sasrec"])))
    form = client.post("/recommend", content=b'{"history": ["i3"]}',
                       headers={"content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 422 and "content-type: application/json" in form.json()["error"]
    huge = client.post("/recommend", json={"history": ["i3"], "k": "x" * 100_000})
    assert huge.status_code == 422 and "x" * 100 not in huge.text


def test_json_integers_are_taken_as_item_ids(runs: dict[str, Path]) -> None:
    """[50, 172] means ["50", "172"] (ids that look like numbers); true and 3.5 are not ids."""
    rec = Recommender.from_run(runs["sasrec"])
    client = TestClient(create_app(rec))
    unknown = client.post("/recommend", json={"history": [3, "i4"], "k": 3})
    assert unknown.status_code == 404 and "'3'" in unknown.json()["error"]
    got = client.post("/recommend", json={"history": ["i3", "i4"], "k": 3, "candidates": ["i5", 7]})
    assert got.status_code == 404 and "'7'" in got.json()["error"]
    for bad in (True, 3.5):
        assert client.post("/recommend", json={"history": [bad], "k": 3}).status_code == 422


@pytest.mark.parametrize("name", ["sasrec", "sasrec-end", "gru4rec", "bert4rec", "unisrec"])
def test_session_equals_recommend_on_the_same_history(runs: dict[str, Path], name: str) -> None:
    rec = Recommender.from_run(runs[name])
    client = TestClient(create_app(rec))
    events = ["i3", "i4", "i5", "i9", "i4", "i10", "i11", "i12", "i13", "i14", "i1"]  # 11 > max_len = 8
    for n, item in enumerate(events, start=1):
        got = client.post("/sessions/s1/events", json={"item": item, "k": 10}).json()
        want = rec.recommend(events[:n], 10)
        assert got["n_events"] == n and got["items"] == events[:n]
        assert [r["item"] for r in got["recommendations"]] == [r.item for r in want], n
        assert [r["score"] for r in got["recommendations"]] == pytest.approx([r.score for r in want], abs=1e-5)
        assert got["cached"] == (rec.model.can_extend() and n <= rec.max_len)
    assert rec.model.can_extend() == (name in ("sasrec", "gru4rec", "unisrec"))
    assert client.get("/sessions/s1").json()["n_events"] == len(events)
    assert client.delete("/sessions/s1").status_code == 200
    assert client.get("/sessions/s1").status_code == 404


@pytest.mark.parametrize("name", ["sasrec", "gru4rec", "bert4rec"])
def test_sessions_shared_by_worker_processes(runs: dict[str, Path], tmp_path: Path, name: str) -> None:
    """Two services over one session store file, as `serve --workers 2` runs them: events spread over both
    answer as `recommend` on the whole history; a process that lacks events the other took extends its
    cache by them; a session ended through one and started again through the other starts afresh."""
    rec = Recommender.from_run(runs[name])
    store = str(tmp_path / "sessions.sqlite")
    one, two = (TestClient(create_app(Recommender.from_run(runs[name]), session_store=store)) for _ in range(2))
    events = ["i3", "i4", "i5", "i9", "i4", "i10", "i11", "i12", "i13", "i14", "i1"]  # 11 > max_len = 8
    route = [one, one, two, one, two, two, one, one, two, one, two]
    last: dict[int, int] = {}  # the last event each service answered
    for n, (item, client) in enumerate(zip(events, route, strict=True), start=1):
        got = client.post("/sessions/s1/events", json={"item": item, "k": 10}).json()
        want = rec.recommend(events[:n], 10)
        assert got["n_events"] == n and got["items"] == events[:n]
        assert [r["item"] for r in got["recommendations"]] == [r.item for r in want], n
        assert [r["score"] for r in got["recommendations"]] == pytest.approx([r.score for r in want], abs=1e-5)
        one_step = n == 1 or last.get(id(client)) == n - 1
        assert got["cached"] == (rec.model.can_extend() and n <= rec.max_len and one_step), n
        last[id(client)] = n
    assert one.get("/sessions/s1").json() == two.get("/sessions/s1").json()
    assert one.get("/health").json()["sessions"] == 1
    assert two.delete("/sessions/s1").status_code == 200
    assert one.get("/sessions/s1").status_code == 404
    for n, item in enumerate(["i7", "i8"], start=1):  # nothing of the ended session's caches is reused
        again = one.post("/sessions/s1/events", json={"item": item, "k": 10}).json()
        assert again["items"] == ["i7", "i8"][:n] and [r["item"] for r in again["recommendations"]] == [
            r.item for r in rec.recommend(["i7", "i8"][:n], 10)]


def test_an_event_whose_answer_fails_is_taken_back(runs: dict[str, Path], tmp_path: Path) -> None:
    """Nothing left to recommend (every item seen, exclude_seen) fails the event and leaves the session as it
    was, through the service's batches and through `Sessions.add_event`; a session ended by another process
    while its event is answered is said to be (409), not answered on a cut history."""
    from seqrec.errors import SeqrecError
    from seqrec.serve.session_store import SessionEnded
    from seqrec.serve.sessions import Sessions

    rec = Recommender.from_run(runs["sasrec"])
    client = TestClient(create_app(rec))
    items = list(rec.catalogue.raw_ids)  # the whole catalogue
    assert len(items) == 30
    for item in items[:-1]:
        assert client.post("/sessions/s/events", json={"item": item}).status_code == 200
    failed = client.post("/sessions/s/events", json={"item": items[-1], "exclude_seen": True})
    assert failed.status_code == 400 and "no item is left" in failed.json()["error"]
    assert client.get("/sessions/s").json()["items"] == items[:-1]
    got = client.post("/sessions/s/events", json={"item": "i1", "k": 10}).json()  # the cache holds no trace of it
    assert got["items"] == [*items[:-1], "i1"]
    assert [r["item"] for r in got["recommendations"]] == [r.item for r in rec.recommend([*items[:-1], "i1"], 10)]

    store = str(tmp_path / "sessions.sqlite")
    one, two = Sessions(rec, store=store), Sessions(rec, store=store)
    for item in items[:-1]:
        one.add_event("t", item)
    with pytest.raises(SeqrecError, match="no item is left"):
        one.add_event("t", items[-1], exclude_seen=True)
    assert one.view("t").items == items[:-1]
    append = two.store.append

    def append_then_end(sid: str, event: object) -> tuple[str, int]:
        taken = append(sid, event)  # type: ignore[arg-type]
        one.end(sid)  # another process ends the session before this one reads its events
        return taken

    two.store.append = append_then_end  # type: ignore[method-assign]
    with pytest.raises(SessionEnded, match="ended while this event was answered"):
        two.add_event("t", "i2")
    assert len(two) == 0


def test_a_session_whose_first_event_fails_is_not_started(runs: dict[str, Path]) -> None:
    """Taken back, a first event leaves no session: no view of an empty history, no slot of --max-sessions."""
    rec = Recommender.from_run(runs["sasrec"])
    rec.remove_items(list(rec.catalogue.raw_ids[1:]))  # one recommendable item left
    client = TestClient(create_app(rec, max_sessions=1))
    only = rec.catalogue.raw_ids[0]
    failed = client.post("/sessions/a/events", json={"item": only, "k": 1, "exclude_seen": True})
    assert failed.status_code == 400 and "no item is left" in failed.json()["error"]
    assert client.get("/sessions/a").status_code == 404
    assert client.get("/health").json()["sessions"] == 0
    assert client.post("/sessions/b/events", json={"item": only, "k": 1}).status_code == 200  # the one slot is free


def test_an_added_item_is_known_before_a_search_can_return_it(runs: dict[str, Path]) -> None:
    """A client may send back at once an id it was just recommended: while the index takes a new item, the
    catalogue already knows its id."""
    rec = Recommender.from_run(runs["unisrec"])
    add, known = rec.catalogue.retriever.add, []

    def add_and_look(*args: object, **kw: object) -> object:
        out = add(*args, **kw)  # type: ignore[arg-type]
        known.append(rec.catalogue.known(["fresh"])[0])  # the search may return it from here on
        return out

    rec.catalogue.retriever.add = add_and_look  # type: ignore[method-assign]
    rec.add_items({"fresh": "small blue tool"})
    assert known == [True]


def test_session_bounds_hold_across_processes(runs: dict[str, Path], tmp_path: Path) -> None:
    """Live sessions, events per session and the idle time are the store's: counted over every process."""
    store = str(tmp_path / "sessions.sqlite")
    a, b = (TestClient(create_app(Recommender.from_run(runs["sasrec"]), max_sessions=2, session_events=3,
                                  session_ttl_s=2.5, session_store=store)) for _ in range(2))
    assert a.post("/sessions/s1/events", json={"item": "i1"}).status_code == 200
    assert b.post("/sessions/s2/events", json={"item": "i1"}).status_code == 200
    assert b.post("/sessions/s3/events", json={"item": "i1"}).status_code == 429
    for client in (b, a):
        assert client.post("/sessions/s1/events", json={"item": "i2"}).status_code == 200
    assert b.post("/sessions/s1/events", json={"item": "i2"}).status_code == 409
    assert a.get("/health").json()["sessions"] == b.get("/health").json()["sessions"] == 2
    time.sleep(2.6)  # both sessions idle out
    assert a.get("/sessions/s1").status_code == 404 and b.get("/health").json()["sessions"] == 0
    assert b.post("/sessions/s3/events", json={"item": "i1"}).status_code == 200


def test_item_added_by_text_is_recommended_and_removal_hides_it(runs: dict[str, Path]) -> None:
    rec = Recommender.from_run(runs["unisrec"])
    client = TestClient(create_app(rec))
    history = ["i3", "i4", "i5"]
    top = client.post("/recommend", json={"history": history, "k": 3}).json()["items"][0]
    # a new item with the text of the best item: the same text gives the same vector, so it ties with it
    title = rec.catalogue.title(rec.index[top["item"]])
    assert title
    added = client.post("/items", json={"items": [{"id": "fresh", "text": title}]})
    assert added.status_code == 200 and added.json()["added"] == ["fresh"]
    n = rec.catalogue.n_items
    assert (added.json()["n_items"], added.json()["n_active"]) == (n, n)
    got = client.post("/recommend", json={"history": history, "k": 3}).json()["items"]
    assert "fresh" in [r["item"] for r in got]
    fresh = next(r for r in got if r["item"] == "fresh")
    assert fresh["score"] == pytest.approx(top["score"], abs=1e-4)
    assert client.get("/items/fresh").json() == {"item": "fresh", "title": title, "recommendable": True}
    # a title of its own is shown and searched; the score comes from the text alone
    body = {"items": [{"id": "fresh2", "text": title, "title": "Fresh, titled"}]}
    assert client.post("/items", json=body).json()["added"] == ["fresh2"]
    got = client.post("/recommend", json={"history": history, "k": 4}).json()["items"]
    fresh2 = next(r for r in got if r["item"] == "fresh2")
    assert fresh2["title"] == "Fresh, titled" and fresh2["score"] == pytest.approx(fresh["score"], abs=1e-5)
    assert client.get("/items", params={"q": "titled"}).json() == [
        {"item": "fresh2", "title": "Fresh, titled", "recommendable": True}]
    client.delete("/items/fresh2")
    # usable in a history at once; similar finds its twin
    assert client.post("/recommend", json={"history": ["i1", "fresh"], "k": 3}).status_code == 200
    assert top["item"] in [r["item"] for r in client.get("/similar/fresh?k=3").json()["items"]]
    assert client.delete("/items/fresh").json()["recommendable"] is False
    got = client.post("/recommend", json={"history": history, "k": 30}).json()["items"]
    assert "fresh" not in [r["item"] for r in got]
    # ids with a slash are reachable by path too
    assert client.post("/items", json={"items": [{"id": "shelf/7", "text": "small blue tool"}]}).status_code == 200
    assert client.get("/items/shelf%2F7").json()["item"] == "shelf/7"
    assert client.get("/similar/shelf/7?k=2").status_code == 200
    # replacing the text brings it back
    removed = client.get("/health").json()
    assert removed["n_items"] - removed["n_active"] == 2  # fresh and fresh2 known, not recommendable
    again = client.post("/items", json={"items": [{"id": "fresh", "text": "red glue tape"}]}).json()
    assert again["replaced"] == ["fresh"] and client.get("/items/fresh").json()["recommendable"] is True
    assert again["n_items"] - again["n_active"] == 1  # fresh is back


def test_items_from_python_are_id_to_text_mappings(runs: dict[str, Path]) -> None:
    rec = Recommender.from_run(runs["unisrec"])
    n = rec.n_items
    for items, titles in (({5: "x"}, None), ({"n1": 5}, None), ({"n1": "red glue"}, {"n1": 7})):
        with pytest.raises(SeqrecError, match="item ids, texts and titles are strings"):
            rec.add_items(items, titles)  # type: ignore[arg-type]
    with pytest.raises(SeqrecError, match="non-empty mapping of item id -> text"):
        rec.add_items(["n1"])  # type: ignore[arg-type]
    assert rec.n_items == n


def test_id_models_refuse_new_items(runs: dict[str, Path]) -> None:
    """Adding needs text; removing does not, so an ID model takes DELETE (docs/design.md says why)."""
    client = TestClient(create_app(Recommender.from_run(runs["sasrec"])))
    got = client.post("/items", json={"items": [{"id": "x", "text": "a new thing"}]})
    assert got.status_code == 400 and "text model" in got.json()["error"]
    assert client.delete("/items/i4").json()["recommendable"] is False
    top = client.post("/recommend", json={"history": ["i3"], "k": 29}).json()["items"]
    assert len(top) == 29 and "i4" not in {r["item"] for r in top}


TOKEN = "t0ken-for-the-tests-0123456789"


def test_catalogue_changes_need_the_write_token_when_one_is_set(runs: dict[str, Path]) -> None:
    client = TestClient(create_app(Recommender.from_run(runs["unisrec"]), write_token=TOKEN))
    assert client.get("/health").json()["writes_need_token"] is True
    body = {"items": [{"id": "fresh", "text": "small blue tool"}]}
    for headers, says in (({}, "Authorization: Bearer TOKEN"), ({"Authorization": "Bearer nope"}, "not this service's"),
                          ({"Authorization": f"Basic {TOKEN}"}, "Authorization: Bearer TOKEN")):
        for method, url, payload in (("post", "/items", body), ("post", "/items/remove", {"ids": ["i4"]}),
                                     ("delete", "/items/i4", None)):
            got = client.request(method.upper(), url, json=payload, headers=headers)
            assert got.status_code == 401 and says in got.json()["error"], (method, url, headers, got.text)
            assert got.headers["www-authenticate"] == "Bearer"
    assert client.get("/items/i4").json()["recommendable"] is True  # nothing changed
    assert client.get("/items/fresh").status_code == 404
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post("/items", json=body, headers=auth).json()["added"] == ["fresh"]
    assert client.delete("/items/i4", headers=auth).json()["recommendable"] is False
    assert client.post("/items/remove", json={"ids": ["i5"]}, headers=auth).status_code == 200
    # the rest stays open: recommendations, look-ups, sessions
    assert client.post("/recommend", json={"history": ["fresh", "i3"], "k": 3}).status_code == 200
    assert client.post("/sessions/s1/events", json={"item": "fresh"}).status_code == 200
    assert client.get("/similar/fresh?k=2").status_code == 200
    schema = client.get("/openapi.json").json()
    assert schema["paths"]["/items"]["post"]["security"] and "security" not in schema["paths"]["/recommend"]["post"]
    # without a token nothing is asked
    open_client = TestClient(create_app(Recommender.from_run(runs["sasrec"])))
    assert open_client.get("/health").json()["writes_need_token"] is False
    assert open_client.delete("/items/i4").status_code == 200


def test_a_public_service_without_a_write_token_warns(runs: dict[str, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    import uvicorn

    from seqrec.cli import serve as serve_cli

    started: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append(app))  # no real service
    monkeypatch.setattr(serve_cli, "build_app", lambda options: options)
    monkeypatch.delenv(serve_cli.TOKEN_ENV, raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    assert main(["serve", str(runs["sasrec"]), "--host", "0.0.0.0", "--public", "--port", port]) == 0
    assert "anyone who reaches 0.0.0.0" in capsys.readouterr().err and started[-1]["write_token"] is None
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    assert main(["serve", str(runs["sasrec"]), "--host", "0.0.0.0", "--public", "--port", port,
                 "--write-token-file", str(token)]) == 0
    assert "anyone" not in capsys.readouterr().err and started[-1]["write_token"] == TOKEN


def test_the_write_token_comes_from_a_file_or_the_environment(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from seqrec.cli.serve import TOKEN_ENV, write_token

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert write_token(None) is None
    monkeypatch.setenv(TOKEN_ENV, f" {TOKEN}\n")
    assert write_token(None) == TOKEN
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}x\nsecond line ignored\n")
    assert write_token(str(path)) == TOKEN + "x"  # the file wins over the environment
    for text, says in (("short\n", "16 to 4096 characters long, this one 5"), ("", "this one 0"),
                       ("has a space in the middle of it\n", "no spaces"), ("tökentökentökentöken", "'ö'")):
        path.write_text(text)
        with pytest.raises(SeqrecError, match=says):
            write_token(str(path))
    with pytest.raises(SeqrecError, match=r"--write-token-file .*missing: cannot be read"):
        write_token(str(tmp_path / "missing"))


@pytest.mark.parametrize(("method", "url", "body", "status", "message"), [
    ("post", "/recommend", "{not json", 422, "malformed JSON at character 1"),
    ("post", "/recommend", {"history": ["nope"]}, 404, "'nope'"),
    ("post", "/recommend", {"history": []}, 422, "history"),
    ("post", "/recommend", {"history": ["i1"] * 10_001}, 422, "history"),
    ("post", "/recommend", {"history": ["i1"], "k": 0}, 422, "k"),
    ("post", "/recommend", {"history": ["i1"], "k": 31}, 400, "k=31"),
    ("post", "/recommend", {"history": ["i1"], "colour": "red"}, 422, "colour"),
    ("post", "/recommend", {"history": ["i1"], "times": [1.0, 2.0]}, 400, "times"),
    ("post", "/recommend", {"history": ["i1"], "events": {"rating": [4.0]}}, 400, "unknown event feature"),
    ("post", "/recommend/batch", {"histories": [["i1"], []]}, 422, "histories"),
    ("post", "/recommend/batch", {"histories": [["i1"], ["zz"]]}, 404, "'zz'"),
    ("post", "/items", {"items": [{"id": "n", "text": ""}]}, 422, "text"),
    ("post", "/items", {"items": [{"id": "n", "text": "   "}]}, 400, "non-empty text"),
    ("post", "/items", {"items": [{"id": "n", "text": "a saw", "title": ""}]}, 422, "title"),
    ("post", "/items", {"items": [{"id": "n", "text": "a saw", "title": "  "}]}, 400, "'n': a title, when given"),
    ("post", "/items", {"items": []}, 422, "items"),
    ("get", "/items/zz", None, 404, "'zz'"),
    ("delete", "/items/zz", None, 404, "'zz'"),
    ("get", "/similar/zz", None, 404, "'zz'"),
    ("get", "/similar/i1?k=0", None, 422, "k"),
    ("post", "/sessions/s/events", {"item": "zz"}, 404, "'zz'"),
    ("get", "/sessions/never", None, 404, "never"),
    ("get", "/no/such/page", None, 404, "no endpoint GET /no/such/page"),
])
def test_bad_requests_are_4xx_json(runs: dict[str, Path], method: str, url: str, body: object, status: int,
                                   message: str) -> None:
    client = TestClient(create_app(Recommender.from_run(runs["unisrec"])))
    kwargs = {"content": body} if isinstance(body, str) else {"json": body} if body is not None else {}
    got = client.request(method.upper(), url, headers={"content-type": "application/json"}, **kwargs)
    assert got.status_code == status, got.text
    assert message in got.json()["error"]


def test_limits_body_size_and_sessions(runs: dict[str, Path]) -> None:
    rec = Recommender.from_run(runs["sasrec"])
    client = TestClient(create_app(rec, max_sessions=2, session_events=3, limits=Limits(max_body_bytes=2000)))
    big = client.post("/recommend", content=json.dumps({"history": ["i1"] * 1000}),
                      headers={"content-type": "application/json"})
    assert big.status_code == 413 and "2000 bytes" in big.json()["error"]
    for sid in ("a", "b"):
        assert client.post(f"/sessions/{sid}/events", json={"item": "i1"}).status_code == 200
    full = client.post("/sessions/c/events", json={"item": "i1"})
    assert full.status_code == 429 and "too many live sessions" in full.json()["error"]
    assert 1 <= int(full.headers["retry-after"]) <= 1800  # when the oldest idle session expires
    for _ in range(2):
        client.post("/sessions/a/events", json={"item": "i2"})
    long = client.post("/sessions/a/events", json={"item": "i2"})
    assert long.status_code == 409 and "3 events" in long.json()["error"]  # no retry helps: start a new one


def test_health_metrics_and_page(runs: dict[str, Path]) -> None:
    client = TestClient(create_app(Recommender.from_run(runs["sasrec"])))
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["n_items"] == 30 and health["index"] == "exact"
    digest = hashlib.sha256((runs["sasrec"] / "checkpoint" / "model.json").read_bytes()).hexdigest()
    assert (health["run"], health["version"], health["pid"]) == (str(runs["sasrec"].resolve()), digest[:12],
                                                                 os.getpid())  # what a deploy switched to
    for _ in range(3):
        client.post("/recommend", json={"history": ["i1"]})
    client.post("/recommend", json={"history": ["zz"]})
    text = client.get("/metrics").text
    assert 'seqrec_requests_total{method="POST",route="/recommend",status="200"} 3' in text
    assert 'seqrec_requests_total{method="POST",route="/recommend",status="404"} 1' in text
    assert 'seqrec_request_latency_seconds{route="/recommend",quantile="0.99"}' in text
    assert "seqrec_catalogue_items 30" in text
    page = client.get("/")
    assert page.status_code == 200 and 'id="recommend"' in page.text
    assert client.get("/openapi.json").json()["paths"]["/recommend"]["post"]


def test_a_clients_request_id_is_logged_and_echoed(runs: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    import logging

    client = TestClient(create_app(Recommender.from_run(runs["sasrec"]), limits=Limits(max_body_bytes=200)))
    with caplog.at_level(logging.INFO, logger="seqrec.serve"):
        for i, (method, url, body, status) in enumerate((("POST", "/recommend", {"history": ["i1"]}, 200),  # fast path
                                                         ("GET", "/items/nope", None, 404),
                                                         ("POST", "/recommend", {"history": ["i1"] * 100}, 413))):
            got = client.request(method, url, json=body, headers={"X-Request-ID": f"req-{i}"})
            assert got.status_code == status and got.headers["x-request-id"] == f"req-{i}", (url, got.text)
        got = client.post("/recommend", json={"history": ["i1"]}, headers={"X-Request-ID": "x" * 129})
        assert got.status_code == 200 and "x-request-id" not in got.headers  # not an id to repeat
        assert "x-request-id" not in client.get("/health").headers
    lines = [r.getMessage() for r in caplog.records if r.name == "seqrec.serve"]
    for i, what in enumerate(("POST /recommend 200", "GET /items/nope 404", "POST /recommend 413")):
        assert any(line.startswith(what) and line.endswith(f"ms id=req-{i}") for line in lines), (what, lines)
    assert not any("xxxx" in line for line in lines)


def test_faiss_index_in_the_service(runs: dict[str, Path]) -> None:
    rec = Recommender.from_run(runs["unisrec"], index="hnsw")
    exact = Recommender.from_run(runs["unisrec"])
    for history in HISTORIES:
        assert [r.item for r in rec.recommend(history, 5)] == [r.item for r in exact.recommend(history, 5)]
    rec.add_items({"n1": "red glue"})
    assert rec.recommend(["n1"], 3)


def test_session_cache_follows_a_replaced_item_text(runs: dict[str, Path]) -> None:
    rec = Recommender.from_run(runs["unisrec"])
    client = TestClient(create_app(rec))
    for item in ("i3", "i4"):
        client.post("/sessions/s/events", json={"item": item})
    rec.add_items({"i3": "large green saw"})  # i3's keys and values in the cache are stale now
    got = client.post("/sessions/s/events", json={"item": "i5"}).json()
    want = rec.recommend(["i3", "i4", "i5"], 10)
    assert [r["item"] for r in got["recommendations"]] == [r.item for r in want]
    assert [r["score"] for r in got["recommendations"]] == pytest.approx([r.score for r in want], abs=1e-5)


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(runs: dict[str, Path]) -> None:
    import asyncio

    import httpx

    rec = Recommender.from_run(runs["sasrec"])
    app = create_app(rec)
    bodies = [{"history": h, "k": k, "exclude_seen": ex} for h in HISTORIES for k in (1, 4, 9) for ex in (False, True)]
    bodies.append({"history": ["i1"], "k": 30, "exclude_seen": True})  # 29 left: fewer than k is fine
    bodies.append({"history": [f"i{i}" for i in range(30)], "k": 3, "exclude_seen": True})  # nothing left: 400
    bodies.append({"history": ["zz"], "k": 3})  # a bad one among good ones fails alone

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await asyncio.gather(*(client.post("/recommend", json=b) for b in bodies))

    answers = asyncio.run(fire())
    for body, got in zip(bodies[:-2], answers[:-2], strict=True):
        assert got.status_code == 200, got.text
        want = rec.recommend(body["history"], body["k"], exclude_seen=body["exclude_seen"])  # type: ignore[arg-type]
        assert [r["item"] for r in got.json()["items"]] == [r.item for r in want]
    assert answers[-2].status_code == 400 and "no item is left" in answers[-2].json()["error"]
    assert answers[-1].status_code == 404
    batcher = app.state.batcher
    assert batcher.batched == len(bodies) - 1 and batcher.batches < batcher.batched  # some ran together


def test_session_events_join_the_batches_and_each_stays_exact(runs: dict[str, Path]) -> None:
    """Events of several sessions at once, among /recommend requests: one search serves them together,
    each answer is `recommend` on its session's history, and a bad event fails alone."""
    import asyncio

    import httpx

    rec = Recommender.from_run(runs["sasrec"])
    app = create_app(rec)
    plans = {f"s{j}": [f"i{(j * 5 + n) % 29 + 1}" for n in range(6)] for j in range(6)}

    async def session(client: httpx.AsyncClient, sid: str) -> list[httpx.Response]:
        return [await client.post(f"/sessions/{sid}/events", json={"item": item, "exclude_seen": sid == "s1"})
                for item in plans[sid]]

    async def fire() -> tuple[list[list[httpx.Response]], list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            others = [client.post("/recommend", json={"history": h}) for h in HISTORIES]
            bad = client.post("/sessions/bad/events", json={"item": "zz"})
            *results, bad_answer = await asyncio.gather(*(session(client, sid) for sid in plans), *others, bad)
            return results[: len(plans)], results[len(plans):], bad_answer

    sessions, recommends, bad = asyncio.run(fire())
    for (sid, plan), answers in zip(plans.items(), sessions, strict=True):
        for n, got in enumerate(answers, start=1):
            want = rec.recommend(plan[:n], 10, exclude_seen=sid == "s1")
            assert got.status_code == 200 and got.json()["n_events"] == n, got.text
            assert [r["item"] for r in got.json()["recommendations"]] == [r.item for r in want], (sid, n)
            assert [r["score"] for r in got.json()["recommendations"]] == pytest.approx(
                [r.score for r in want], abs=1e-5)
    for history, got in zip(HISTORIES, recommends, strict=True):
        assert [r["item"] for r in got.json()["items"]] == [r.item for r in rec.recommend(history, 10)]
    assert bad.status_code == 404 and "'zz'" in bad.json()["error"]
    batcher = app.state.batcher
    assert batcher.batched == 6 * 6 + len(HISTORIES) + 1  # every event went through the batches ...
    assert batcher.batches < batcher.batched  # ... and some ran together


def test_requests_after_the_model_thread_is_gone_fail_instead_of_waiting(runs: dict[str, Path]) -> None:
    import asyncio

    from seqrec.serve.batcher import Batcher

    batcher = Batcher(Recommender.from_run(runs["sasrec"]))
    batcher.close()

    async def ask() -> None:
        await asyncio.wait_for(batcher.recommend([1, 2], {}, 5, False), timeout=10)

    with pytest.raises(RuntimeError, match="shutdown"):
        asyncio.run(ask())


def test_a_port_in_use_is_a_one_line_error(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(runs["sasrec"]), "--port", str(port)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("seqrec: error: cannot listen on 127.0.0.1:") and "\n" not in err
        # a folder that holds no run is the mistake named, whether the port is free or not
        assert main(["serve", str(runs["sasrec"].parent), "--port", str(port)]) == 2
        assert "not a run folder (no checkpoint/model.json)" in capsys.readouterr().err


def test_idle_sessions_expire(runs: dict[str, Path]) -> None:
    import time

    client = TestClient(create_app(Recommender.from_run(runs["sasrec"]), max_sessions=1, session_ttl_s=0.2))
    assert client.post("/sessions/old/events", json={"item": "i1"}).status_code == 200
    assert client.post("/sessions/new/events", json={"item": "i1"}).status_code == 429  # the one place is taken
    time.sleep(0.3)
    assert client.post("/sessions/new/events", json={"item": "i1"}).status_code == 200  # the idle one is gone
    assert client.get("/sessions/old").status_code == 404


def test_chunked_body_over_the_limit_is_413(runs: dict[str, Path]) -> None:
    client = TestClient(create_app(Recommender.from_run(runs["sasrec"]), limits=Limits(max_body_bytes=100)))

    def chunks():  # no Content-Length: the limit is enforced while the body is read
        yield b'{"history": ['
        for _ in range(50):
            yield b'"i1", '
        yield b'"i1"]}'

    got = client.post("/recommend", content=chunks(), headers={"content-type": "application/json"})
    assert got.status_code == 413 and "100 bytes" in got.json()["error"]


def test_service_with_the_onnx_engine_answers_as_pytorch(runs: dict[str, Path]) -> None:
    """`seqrec serve --engine onnx`: build_app passes the engine on, and /recommend gives PyTorch's top-k."""
    from seqrec.cli.serve import build_app

    options = {"run": str(runs["sasrec"]), "index": "exact", "threads": 1, "workers": 1, "max_sessions": 10,
               "session_events": 10, "session_ttl": 60.0, "max_body_bytes": 1 << 20, "device": "cpu",
               "engine": "onnx"}
    app = build_app(options)
    rec = app.state.recommender  # type: ignore[attr-defined]
    assert rec._onnx is not None
    reference = Recommender.from_run(runs["sasrec"])
    client = TestClient(app)  # type: ignore[arg-type]
    for history in (["i1"], ["i3", "i4", "i5"], ["i7", "i2", "i9", "i10", "i11"]):
        got = client.post("/recommend", json={"history": history, "k": 5})
        assert got.status_code == 200
        assert [r["item"] for r in got.json()["items"]] == [r.item for r in reference.recommend(history, k=5)]


def test_a_catalogue_known_by_its_text_alone_shows_and_searches_its_texts() -> None:
    """UniSRec's files give items a text and no title: the service showed every item untitled, and searching
    the catalogue by words found nothing, while items added by text were shown by their text."""
    import polars as pl

    from seqrec.models.sasrec import SASRec, SASRecConfig

    items = pl.DataFrame({"item": ["a", "b", "c"], "idx": [1, 2, 3], "text": ["Red glue", "Blue saw", "Green tape"]})
    client = TestClient(create_app(Recommender(SASRec(SASRecConfig(d=8, n_heads=2), 3, 4), items, 4)))
    assert client.get("/items", params={"q": "saw"}).json() == [{"item": "b", "title": "Blue saw",
                                                                "recommendable": True}]
    assert {r["title"] for r in client.post("/recommend", json={"history": ["a"], "k": 3}).json()["items"]} == {
        "Red glue", "Blue saw", "Green tape"}


def test_many_items_removed_in_one_request_all_or_none(runs: dict[str, Path], tmp_path: Path) -> None:
    """POST /items/remove takes many ids (a catalogue clean-up was one DELETE per item): every one stops being
    recommended, an unknown id removes none (404 naming it), and a catalogue log keeps them as one change."""
    rec = Recommender.from_run(runs["sasrec"])
    rec.keep_log(tmp_path / "catalogue.jsonl")
    client = TestClient(create_app(rec))
    refused = client.post("/items/remove", json={"ids": ["i4", "nope", "i5"]})
    assert refused.status_code == 404 and "nope" in refused.json()["error"]
    assert rec.catalogue.n_active == 30 and (tmp_path / "catalogue.jsonl").read_text().count("\n") == 1
    done = client.post("/items/remove", json={"ids": ["i4", "i5", "i6", "i4"]})
    assert done.status_code == 200 and done.json() == {"removed": ["i4", "i5", "i6", "i4"], "n_items": 30,
                                                       "n_active": 27}
    health = client.get("/health").json()  # the same two counts, under the same names
    assert (health["n_items"], health["n_active"]) == (30, 27)
    top = client.post("/recommend", json={"history": ["i3"], "k": 27}).json()["items"]
    assert len(top) == 27 and not {"i4", "i5", "i6"} & {r["item"] for r in top}
    assert [client.get(f"/items/{i}").json()["recommendable"] for i in ("i4", "i5", "i6", "i7")] == [
        False, False, False, True]
    assert (tmp_path / "catalogue.jsonl").read_text().count("\n") == 2  # the catalogue's line, then the change
