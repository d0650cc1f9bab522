"""The live catalogue kept on disk (`seqrec serve --catalogue-log`, `Recommender.keep_log`): a restarted
service comes back with the items added, replaced and removed while it ran (they were lost at every restart)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import pytest
import torch

from seqrec.errors import SeqrecError
from seqrec.serve import Recommender
from seqrec.serve.app import create_app
from seqrec.serve.catalogue import UnknownItem
from seqrec.serve.catalogue_log import CatalogueLogBroken
from tests.serve_helpers import same_catalogue, train_tiny_runs

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return train_tiny_runs(tmp_path_factory.mktemp("catalogue-log"))


def kept_log(runs: dict[str, Path], tmp_path: Path) -> tuple[Path, Recommender, bytes]:
    """A text model keeping a new catalogue log: (the log, the model, the log's bytes)."""
    path = tmp_path / "catalogue.jsonl"
    rec = Recommender.from_run(runs["unisrec"])
    rec.keep_log(path)
    return path, rec, path.read_bytes()


def test_a_restarted_service_comes_back_with_its_catalogue_changes(runs: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "catalogue.jsonl"
    served = Recommender.from_run(runs["unisrec"])
    assert served.keep_log(path) == (0, 0)
    client = TestClient(create_app(served))

    def post(**texts: str) -> None:
        body = {"items": [{"id": raw, "text": text} for raw, text in texts.items()]}
        assert client.post("/items", json=body).status_code == 200

    post(new1="a red tool for the garden", new2="blue glue for paper")
    titled = {"items": [{"id": "new1", "text": "a green saw with teeth", "title": "Green saw"}]}
    assert client.post("/items", json=titled).status_code == 200  # replaced, with a title of its own
    post(new1="a green saw")  # replaced again: its title is its text once more
    titled = {"items": [{"id": "new4", "text": "a long text: brand, categories, ...", "title": "Short title"}]}
    assert client.post("/items", json=titled).status_code == 200
    assert client.delete("/items/i3").status_code == 200
    assert client.delete("/items/new2").status_code == 200
    post(i3="i3 comes back with a text of its own")  # a removed item given a text is recommendable again
    post(new3="small tape")
    assert client.delete("/items/i8").status_code == 200
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["op"] == "catalogue" and len(lines) == 10  # then one line per change, before it was answered
    assert lines[2]["titles"] == {"new1": "Green saw"} and "titles" not in lines[3]
    assert client.get("/items/new4").json()["title"] == "Short title"
    assert client.get("/items/new1").json()["title"] == "a green saw"

    served.close_log()  # as the process would at its end
    restarted = Recommender.from_run(runs["unisrec"])
    assert restarted.keep_log(path) == (9, 0)
    same_catalogue(served, restarted)
    new4 = restarted.catalogue.index["new4"]
    assert restarted.catalogue.title(new4) == "Short title"
    assert restarted.catalogue.texts[new4] == "a long text: brand, categories, ..."
    assert restarted.catalogue.removed == {restarted.catalogue.index[r] for r in ("new2", "i8")}
    # the restarted service goes on writing the same log: a third start has its change too
    TestClient(create_app(restarted)).delete("/items/new3")
    restarted.close_log()
    third = Recommender.from_run(runs["unisrec"])
    assert third.keep_log(path) == (10, 0)
    same_catalogue(restarted, third)


def test_a_cut_short_last_line_is_dropped_and_the_log_goes_on(runs: dict[str, Path], tmp_path: Path) -> None:
    """A process stopped while writing a line never answered its request: the line is dropped (with a warning)
    and the next change starts on a line of its own."""
    path = tmp_path / "catalogue.jsonl"
    path.write_text('{"op": "remove", "ids": ["i1"]}\n{"op": "items", "items": {"x": "half a li')
    rec = Recommender.from_run(runs["sasrec"])
    assert rec.keep_log(path) == (1, 1)
    assert rec.catalogue.removed == {rec.catalogue.index["i1"]}
    rec.remove_items(["i2"])
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"op": "remove", "ids": ["i1"]}, {"op": "remove", "ids": ["i2"]}]
    # a whole last line without its newline is kept, and the next change does not run into it
    rec.close_log()
    path.write_text('{"op": "remove", "ids": ["i1"]}')
    rec = Recommender.from_run(runs["sasrec"])
    assert rec.keep_log(path) == (1, 0)
    rec.remove_items(["i4"])
    assert len(path.read_text().splitlines()) == 2


@pytest.mark.parametrize(("text", "needle"), [
    ('{"op": "remove", "ids": ["i1"]}\nnot json\n{"op": "remove", "ids": ["i2"]}\n', "catalogue.jsonl:2"),
    ('{"op": "items", "items": {"x": 3}}\n', "catalogue.jsonl:1"),
    ('{"op": "items", "items": {"x": " "}}\n', "catalogue.jsonl:1"),
    ('{"op": "remove", "ids": ["i1"]}\n{"op": "remove", "ids": ["nope"]}\n', "catalogue.jsonl:2: unknown .*'nope'"),
    ('{"op": "remove", "ids": ["i1"]}\n{"op": "rename"}', "catalogue.jsonl:2"),  # whole JSON: not cut short
    ('{"op": "remove", "ids": ["i1"]}\n{"op": "catalogue", "items": 30, "fingerprint": "x"}\n', "must come first"),
    ('{"op": "items", "items": {"x": "t"}, "encoder": "k", "vectors": "!!"}\n', 'jsonl:1: "vectors" is not base64'),
    ('{"op": "items", "items": {"x": "t", "y": "u"}, "vectors": "AAAAAA=="}\n', "jsonl:1: .*not a row for each of 2"),
    ('{"op": "items", "items": {"x": "t"}, "vectors": 3}\n', 'jsonl:1: .*"vectors" and "encoder" must be strings'),
])
def test_a_bad_line_is_an_error_naming_it_and_changes_nothing(runs: dict[str, Path], tmp_path: Path, text: str,
                                                             needle: str) -> None:
    path = tmp_path / "catalogue.jsonl"
    path.write_text(text)
    rec = Recommender.from_run(runs["unisrec"])
    with pytest.raises(SeqrecError, match=needle):
        rec.keep_log(path)
    assert path.read_text() == text
    assert not rec.catalogue.removed and rec.catalogue_log is None  # no line applied, no log kept


def test_a_log_of_another_catalogue_is_refused(runs: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "catalogue.jsonl"
    Recommender.from_run(runs["sasrec"]).keep_log(path)
    head = json.loads(path.read_text().splitlines()[0])
    assert head["items"] == 30
    path.write_text(json.dumps({**head, "fingerprint": "0" * 20}) + "\n")
    with pytest.raises(SeqrecError, match="another catalogue"):
        Recommender.from_run(runs["sasrec"]).keep_log(path)


def test_a_failed_write_changes_nothing(runs: dict[str, Path], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path, rec, before = kept_log(runs, tmp_path)

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("seqrec.serve.catalogue_log.os.fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        rec.add_items({"new1": "a red tool"})
    with pytest.raises(OSError, match="No space"):
        rec.remove_items(["i1"])
    monkeypatch.undo()
    assert path.read_bytes() == before  # no half line left
    assert "new1" not in rec.catalogue.index and not rec.catalogue.removed  # and no change made
    rec.add_items({"new1": "a red tool"})  # the next write goes on from there
    last = json.loads(path.read_text().splitlines()[-1])
    assert (last["op"], last["items"], last["encoder"]) == ("items", {"new1": "a red tool"}, rec.encoder_key())


def test_a_failed_change_takes_its_line_back(runs: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path, rec, before = kept_log(runs, tmp_path)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the index failed")

    monkeypatch.setattr(rec.catalogue.retriever, "add", broken)
    with pytest.raises(RuntimeError, match="the index failed"):
        rec.add_items({"new1": "a red tool"})
    assert path.read_bytes() == before and "new1" not in rec.catalogue.index
    # a change that failed half-way may have been made in part: this process stops changing the catalogue
    monkeypatch.undo()
    with pytest.raises(CatalogueLogBroken, match="restart the service"):
        rec.remove_items(["i1"])
    assert path.read_bytes() == before
    restarted = Recommender.from_run(runs["unisrec"])
    assert restarted.keep_log(path) == (0, 0)
    restarted.add_items({"new1": "a red tool"})


def test_a_short_write_still_writes_the_whole_line(runs: dict[str, Path], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """os.write may write fewer bytes than asked (a nearly full disk) without an error."""
    import os

    path = tmp_path / "catalogue.jsonl"
    rec = Recommender.from_run(runs["unisrec"])
    rec.keep_log(path)
    write = os.write
    monkeypatch.setattr("seqrec.serve.catalogue_log.os.write", lambda fd, data: write(fd, bytes(data[:7])))
    rec.add_items({"new1": "a red tool"})
    rec.remove_items(["i1"])
    monkeypatch.undo()
    rec.close_log()
    assert [json.loads(line)["op"] for line in path.read_text().splitlines()] == ["catalogue", "items", "remove"]


def test_no_process_reads_a_line_whose_change_is_being_made(runs: dict[str, Path], tmp_path: Path) -> None:
    """A writer holds the file's exclusive lock from its line until its change is made or taken back: another
    process (here another log on the file, which the lock treats alike) waits, and never sees a line that
    is taken back."""
    path = tmp_path / "catalogue.jsonl"
    a, b = Recommender.from_run(runs["sasrec"]), Recommender.from_run(runs["sasrec"])
    a.keep_log(path)
    b.keep_log(path)
    assert a.catalogue_log is not None and b.catalogue_log is not None
    entered, release = threading.Event(), threading.Event()

    def writer() -> None:
        assert a.catalogue_log is not None
        with contextlib.suppress(RuntimeError), a.catalogue.lock, \
                a.catalogue_log.change(a, {"op": "remove", "ids": ["i4"]}):
            entered.set()
            release.wait(10)
            raise RuntimeError("the change failed")

    first = threading.Thread(target=writer)
    first.start()
    assert entered.wait(10)
    read: list[int] = []
    second = threading.Thread(target=lambda: read.append(b.catalogue_log.catch_up(b)))  # type: ignore[union-attr]
    second.start()
    second.join(0.5)
    assert second.is_alive() and not read  # waiting for the writer
    release.set()
    first.join(10)
    second.join(10)
    assert read == [0] and not b.catalogue.removed  # the line was taken back before b could read it
    assert a.catalogue_log.error is not None and b.catalogue_log.error is None


def test_an_unknown_id_waits_for_the_changes_being_followed(runs: dict[str, Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An id not known yet is looked for in the log; when the follower has just read its line and is still
    applying it, the lookup waits for that instead of calling the id unknown."""
    path = tmp_path / "catalogue.jsonl"
    a, b = Recommender.from_run(runs["unisrec"]), Recommender.from_run(runs["unisrec"])
    a.keep_log(path)
    b.keep_log(path, follow=True)
    assert b.catalogue_log is not None
    apply = type(b.catalogue_log)._apply
    reading = threading.Event()

    def slow_apply(self: object, rec: object, records: list) -> None:
        if records:
            reading.set()
            time.sleep(0.5)
        apply(self, rec, records)  # type: ignore[arg-type]

    monkeypatch.setattr(type(b.catalogue_log), "_apply", slow_apply)
    a.add_items({"new1": "a red tool for the garden"})
    assert reading.wait(5)  # the follower has read the line and is applying it
    assert b.to_indices(["i3", "new1"])[1] == a.catalogue.index["new1"]
    b.close_log()


def test_a_follower_that_cannot_read_the_log_stops_and_says_so(runs: dict[str, Path], tmp_path: Path) -> None:
    from seqrec.cli.serve import build_app

    path = tmp_path / "catalogue.jsonl"
    options = {"run": str(runs["sasrec"]), "index": "exact", "threads": 1, "workers": 2, "max_sessions": 10,
               "session_events": 10, "session_ttl": 60.0, "max_body_bytes": 1 << 20, "catalogue_log": str(path)}
    with TestClient(build_app(options)) as client:  # type: ignore[arg-type]
        assert client.get("/health").json()["status"] == "ok"
        with path.open("a") as f:
            f.write('{"op": "remove", "ids": ["nope"]}\n')  # another process's line this one cannot apply
        deadline = time.monotonic() + 5
        while client.get("/health").json()["status"] == "ok" and time.monotonic() < deadline:
            time.sleep(0.02)
        health = client.get("/health").json()
        assert health["status"] == "degraded" and "unknown item id(s) 'nope'" in health["catalogue_log_error"]
        answer = client.delete("/items/i2")
        assert answer.status_code == 503 and "restart the service" in answer.json()["error"]
        assert client.post("/recommend", json={"history": ["i3"], "k": 3}).status_code == 200  # still serves


def test_processes_sharing_a_log_make_the_same_catalogue(runs: dict[str, Path], tmp_path: Path) -> None:
    """Two processes writing one log (here two logs open on one file, which lock each other as processes do):
    each change is made after the other's changes, so both end with the same items under the same indices."""
    path = tmp_path / "catalogue.jsonl"
    a, b = Recommender.from_run(runs["unisrec"]), Recommender.from_run(runs["unisrec"])
    a.keep_log(path)
    b.keep_log(path)
    a.add_items({"new1": "a red tool for the garden"})
    b.add_items({"new2": "blue glue for paper"})  # b takes new1 from the log first: new2 comes after it
    assert b.catalogue.index["new1"] < b.catalogue.index["new2"]
    b.remove_items(["new1"])
    a.add_items({"new3": "small tape"})  # after new2 and the removal of new1
    with pytest.raises(UnknownItem):
        a.remove_items(["nope"])  # checked against the catalogue with every other change made
    assert b.catalogue_log is not None and b.catalogue_log.catch_up(b) == 1
    assert a.catalogue_log is not None and a.catalogue_log.catch_up(a) == 0
    same_catalogue(a, b)
    torch.testing.assert_close(a.catalogue.vectors, b.catalogue.vectors, atol=1e-6, rtol=0)  # the logged vectors
    a.close_log()
    b.close_log()
    third = Recommender.from_run(runs["unisrec"])
    assert third.keep_log(path) == (4, 0)
    same_catalogue(a, third)


def test_a_replay_takes_the_logged_vectors_and_encodes_texts_without_them(runs: dict[str, Path], tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "catalogue.jsonl"
    served = Recommender.from_run(runs["unisrec"])
    served.keep_log(path)
    served.add_items({"new1": "a red tool for the garden", "new2": "blue glue for paper"})
    served.add_items({"new1": "a green saw"})
    served.close_log()
    lines = path.read_text().splitlines()

    calls: list[list[str]] = []

    def counted(self: object, texts: list[str]) -> torch.Tensor:
        calls.append(texts)
        return original(self, texts)

    original = Recommender._encode
    monkeypatch.setattr(Recommender, "_encode", counted)
    again = Recommender.from_run(runs["unisrec"])
    assert again.keep_log(path, write=False) == (2, 0)
    assert calls == []  # no text went through the encoder
    torch.testing.assert_close(again.catalogue.vectors, served.catalogue.vectors, atol=1e-6, rtol=0)

    # an older line without vectors, and one from another encoder, have their texts encoded again
    old = json.loads(lines[1])
    del old["vectors"]
    other = {**json.loads(lines[2]), "encoder": "another-encoder"}
    path.write_text("\n".join([lines[0], json.dumps(old), json.dumps(other)]) + "\n")
    third = Recommender.from_run(runs["unisrec"])
    assert third.keep_log(path, write=False) == (2, 0)
    assert [sorted(c) for c in calls] == [["a green saw", "blue glue for paper"]]  # one batch; new1's last text
    assert third.catalogue.raw_ids == served.catalogue.raw_ids and third.catalogue.titles == served.catalogue.titles
    torch.testing.assert_close(third.catalogue.vectors, served.catalogue.vectors, atol=1e-5, rtol=0)

    # a line's key counts the encoder files' bytes: vectors of weights since rewritten (every size the same,
    # so names and sizes cannot tell) are encoded again; a line from before the bytes counted keeps its vectors
    legacy = {**json.loads(lines[2]), "encoder": served.encoder_key(legacy=True)}
    assert legacy["encoder"] != served.encoder_key()
    path.write_text("\n".join([lines[0], lines[1], json.dumps(legacy)]) + "\n")
    calls.clear()
    fourth = Recommender.from_run(runs["unisrec"])
    fourth.text_encoder().weights = "rewritten"
    assert fourth.keep_log(path, write=False) == (2, 0)
    assert [sorted(c) for c in calls] == [["blue glue for paper"]]  # lines[1]'s vectors: the old weights'


def test_every_worker_writes_and_follows_the_shared_log(runs: dict[str, Path], tmp_path: Path) -> None:
    """`seqrec serve --workers N --catalogue-log FILE`: a change made through any worker reaches the others
    (their log followers). A cut-short last line is settled by the first worker."""
    from seqrec.cli.serve import build_app

    path = tmp_path / "catalogue.jsonl"
    path.write_text('{"op": "remove", "ids": ["i1"]}\n{"op": "remove", "ids": ["i')
    options = {"run": str(runs["unisrec"]), "index": "exact", "threads": 1, "workers": 2, "max_sessions": 10,
               "session_events": 10, "session_ttl": 60.0, "max_body_bytes": 1 << 20, "catalogue_log": str(path)}
    one, two = (build_app(options) for _ in range(2))
    with TestClient(one) as first, TestClient(two) as second:  # type: ignore[arg-type]
        assert first.get("/items/i1").json()["recommendable"] is False
        assert first.delete("/items/i2").status_code == 200
        deadline = time.monotonic() + 5  # the second worker's follower brings the removal in
        while second.get("/items/i2").json()["recommendable"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert second.get("/items/i2").json()["recommendable"] is False
        body = {"items": [{"id": "new1", "text": "a red tool for the garden"}]}
        assert second.post("/items", json=body).status_code == 200
        history = {"history": ["i5", "new1"], "k": 5}
        at_once = first.post("/recommend", json=history)  # an id not yet followed is looked for in the log
        assert at_once.status_code == 200 and at_once.json() == second.post("/recommend", json=history).json()
        health = first.get("/health").json()
        assert (health["status"], health["catalogue_changes"], health["catalogue_log_error"]) == ("ok", 3, None)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["op"] for line in lines] == ["remove", "remove", "items"]


def test_a_failed_look_at_the_path_lets_the_lock_go(runs: dict[str, Path], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether the log was replaced is asked with the lock held: a failure there (a stale NFS handle, a folder
    made unreadable) lets the lock go, or every other process's changes would wait on it for good."""
    import fcntl
    import os

    path = tmp_path / "catalogue.jsonl"
    rec = Recommender.from_run(runs["sasrec"])
    rec.keep_log(path)

    def stale(*args: object) -> bool:
        raise OSError(116, "Stale file handle")

    monkeypatch.setattr("seqrec.serve.catalogue_log.same_file", stale)
    with pytest.raises(OSError, match="Stale"):
        rec.remove_items(["i1"])
    monkeypatch.undo()
    other = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if the lock were still held
    finally:
        os.close(other)
    rec.close_log()


def test_removing_a_removed_item_again_writes_no_line(runs: dict[str, Path], tmp_path: Path) -> None:
    """DELETE twice: the second changes nothing, so the log gets no line (and its change count stays); a removal
    that holds one item still there is written whole."""
    path = tmp_path / "catalogue.jsonl"
    rec = Recommender.from_run(runs["sasrec"])
    rec.keep_log(path)
    rec.remove_items(["i3"])
    rec.remove_items(["i3"])
    assert rec.catalogue_log is not None and rec.catalogue_log.changes == 1
    rec.remove_items(["i3", "i4"])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line.get("ids") for line in lines[1:]] == [["i3"], ["i3", "i4"]]
    rec.close_log()


def test_a_log_without_a_first_line_naming_its_catalogue_is_replayed_with_a_warning(
        runs: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A walk-through replayed a hand-written log onto a run without a word: its changes cannot be checked
    against the run's items, and the log says so."""
    path = tmp_path / "catalogue.jsonl"
    path.write_text('{"op": "remove", "ids": ["i5"]}\n')
    rec = Recommender.from_run(runs["sasrec"])
    with caplog.at_level("WARNING", logger="seqrec.serve.catalogue_log"):
        rec.keep_log(path)
    assert not rec.catalogue.is_active(rec.index["i5"])
    assert "its first line does not name the catalogue it was written for" in caplog.text
    rec.close_log()
    caplog.clear()
    again = Recommender.from_run(runs["sasrec"])
    with caplog.at_level("WARNING", logger="seqrec.serve.catalogue_log"):
        again.keep_log(tmp_path / "new.jsonl")  # a log it starts itself has the line
    assert "does not name" not in caplog.text
