"""`seqrec carry-log`: a catalogue log carried over to the catalogue of a run trained on other items (a deploy of
a run trained again), while a process keeps the old log (seqrec.serve.catalogue_carry)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqrec.cli import main
from seqrec.errors import SeqrecError
from seqrec.serve import Recommender
from seqrec.serve.catalogue_carry import carry
from seqrec.serve.catalogue_compact import compact
from seqrec.serve.catalogue_file import catalogue_fingerprint
from seqrec.serve.catalogue_log import CatalogueLogCarried
from tests.serve_helpers import train_tiny_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The runs served now (items i0..i29) and the runs trained again on a log that has i30 and i31 too."""
    old = train_tiny_runs(tmp_path_factory.mktemp("carry-old"), names=("unisrec",))
    new = train_tiny_runs(tmp_path_factory.mktemp("carry-new"), n_items=32)
    return {"old": old["unisrec"], "new": new["unisrec"], "new-sasrec": new["sasrec"]}


def test_a_deploy_keeps_the_items_added_by_text_and_the_removals(runs: dict[str, Path], tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Carried over to the new run: items it does not know keep their last text, removals of items it knows stay
    removed; it keeps its own texts of the items it knows. The process serving the old run refuses changes from
    then on; the new run replays the carried log, changes it and compacts it like any log."""
    path = tmp_path / "catalogue.jsonl"
    old = Recommender.from_run(runs["old"])
    old.keep_log(path)
    old.add_items({"new1": "a red saw", "i30": "the old text of i30", "new2": "blue glue"})
    old.add_items({"new1": "a red saw for the garden", "i3": "a text given to i3"})
    old.remove_items(["i4", "new2"])
    before = path.read_bytes()

    assert main(["carry-log", str(path), "--to", str(runs["new"])]) == 0
    said = capsys.readouterr().out
    assert "carrying 1 item(s) added by text and 1 removal(s)" in said
    assert "2 text(s) of items the run knows" in said and "1 removal(s) of items it does not know" in said
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    new = Recommender.from_run(runs["new"])
    head = lines[0]
    assert head["fingerprint"] == catalogue_fingerprint(new.catalogue.raw_ids) and head["items"] == 32
    assert head["carried"]["run"] == str(runs["new"].resolve()) and head["carried"]["from"][2] == len(before)
    assert head["carried"]["version"] == new.version
    assert [(line["op"], line.get("items") or line.get("ids")) for line in lines[1:]] == [
        ("items", {"new1": "a red saw for the garden"}), ("remove", ["i4"])]

    with pytest.raises(CatalogueLogCarried, match=r"carried over to the catalogue of .*restart it on the new run"):
        old.add_items({"new3": "small tape"})
    assert "new3" not in old.catalogue.index

    assert new.keep_log(path) == (2, 0)
    assert new.catalogue.titles[new.catalogue.index["new1"] - 1] == "a red saw for the garden"
    for raw in ("i3", "i30"):  # the new run's own texts
        assert new.catalogue.titles[new.catalogue.index[raw] - 1] == f"Item number {raw[1:]}"
    assert new.catalogue.index["i4"] in new.catalogue.removed and "new2" not in new.catalogue.index
    assert "new1" in [r.item for r in new.recommend(["i5", "new1"], new.catalogue.n_active, exclude_seen=False)]
    new.add_items({"new3": "small tape"})
    new.remove_items(["new1"])
    assert compact(path)["lines_after"] == 3
    fresh = Recommender.from_run(runs["new"])
    fresh.keep_log(path)
    assert fresh.catalogue.raw_ids == new.catalogue.raw_ids and fresh.catalogue.removed == new.catalogue.removed
    for rec in (old, new, fresh):
        rec.close_log()


def test_carrying_into_a_new_file_leaves_the_old_log_to_its_services(runs: dict[str, Path], tmp_path: Path) -> None:
    path, out = tmp_path / "catalogue.jsonl", tmp_path / "next.jsonl"
    old = Recommender.from_run(runs["old"])
    old.keep_log(path)
    old.add_items({"new1": "a red saw"})
    new = Recommender.from_run(runs["new"])
    ids = list(new.catalogue.raw_ids)  # the run's own (keeping a log adds to them)
    counts = carry(path, ids, "next", new.version, new.no_new_text, out)
    assert counts["items"] == 1 and counts["already"] == 0
    old.add_items({"new2": "blue glue"})  # the old log is still the old run's
    assert [json.loads(line)["op"] for line in path.read_text().splitlines()] == ["catalogue", "items", "items"]
    assert new.keep_log(out) == (1, 0) and "new1" in new.catalogue.index and "new2" not in new.catalogue.index
    again = carry(out, ids, "next", new.version, new.no_new_text)
    assert again["already"] == 1  # already the log of that catalogue: left as it is
    with pytest.raises(SeqrecError, match="exists: carry the log into a new file"):
        carry(path, ids, "next", new.version, new.no_new_text, out)
    for rec in (old, new):
        rec.close_log()


def test_what_cannot_be_carried_is_refused_and_the_log_left_as_it_was(runs: dict[str, Path], tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "catalogue.jsonl"
    old = Recommender.from_run(runs["old"])
    old.keep_log(path)
    old.add_items({"new1": "a red saw"})
    before = path.read_bytes()
    assert main(["carry-log", str(path), "--to", str(runs["new-sasrec"])]) == 2
    err = capsys.readouterr().err
    assert "1 item(s) by text that" in err and "sasrec has no item text" in err and "Traceback" not in err
    assert path.read_bytes() == before
    old.add_items({"new2": "blue glue"})  # nothing was replaced: the old process goes on
    for argv, why in (([str(tmp_path / "none.jsonl"), "--to", str(runs["new"])], "no such catalogue log"),
                      ([str(tmp_path), "--to", str(runs["new"])], "not a regular file"),
                      ([str(path), "--to", str(tmp_path / "nothing")], "no such run folder"),
                      ([str(path), "--to", str(runs["new"]), "--dataset", "x"], "is for a pre-training run")):
        assert main(["carry-log", *argv]) == 2
        assert why in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(SeqrecError, match="nothing to carry"):
        carry(tmp_path / "empty.jsonl", ["i1"], "x", None, None)
    only_removals = tmp_path / "removals.jsonl"
    old.close_log()
    old.keep_log(only_removals)
    old.remove_items(["i4", "new1"])
    sasrec = Recommender.from_run(runs["new-sasrec"])
    assert carry(only_removals, sasrec.catalogue.raw_ids, "x", None, sasrec.no_new_text)["removed"] == 1
    assert sasrec.keep_log(only_removals) == (1, 0) and sasrec.catalogue.index["i4"] in sasrec.catalogue.removed
    for rec in (old, sasrec):
        rec.close_log()


def test_the_service_of_the_run_before_asks_clients_to_retry(runs: dict[str, Path], tmp_path: Path) -> None:
    """Between the carry and its replacement, a worker of the old run answers catalogue changes 503 with
    Retry-After (the worker that replaces it takes them) and still recommends; /health says why."""
    from fastapi.testclient import TestClient

    from seqrec.serve.app import create_app

    path = tmp_path / "catalogue.jsonl"
    old = Recommender.from_run(runs["old"])
    old.keep_log(path)
    client = TestClient(create_app(old))
    assert client.post("/items", json={"items": [{"id": "new1", "text": "a red saw"}]}).status_code == 200
    new = Recommender.from_run(runs["new"])
    carry(path, new.catalogue.raw_ids, str(runs["new"]), new.version, new.no_new_text)
    refused = client.post("/items", json={"items": [{"id": "new2", "text": "blue glue"}]})
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "carried over to the catalogue of" in refused.json()["error"]
    assert client.delete("/items/i3").status_code == 503
    assert client.post("/recommend", json={"history": ["i3", "new1"], "k": 5}).status_code == 200
    health = client.get("/health").json()
    assert health["status"] == "degraded" and "carried over" in health["catalogue_log_error"]
    old.close_log()
