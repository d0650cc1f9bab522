"""`seqrec compact-log`: a catalogue log rewritten as the fewest lines that replay to the same catalogue, with
services keeping it or not (seqrec.serve.catalogue_compact), and the processes that keep it moving to the new
file (seqrec.serve.catalogue_log)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch

from seqrec.errors import SeqrecError
from seqrec.serve import Recommender
from seqrec.serve.catalogue_compact import compact
from seqrec.serve.catalogue_log import CatalogueLog, CatalogueLogBroken
from tests.serve_helpers import same_catalogue, train_tiny_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return train_tiny_runs(tmp_path_factory.mktemp("catalogue-compact"))


def test_services_keep_a_log_compacted_under_them(runs: dict[str, Path], tmp_path: Path) -> None:
    """Two processes keep one log (one writes, both follow): compacted between their changes, each goes on in the
    new file after the folded lines (read once, not applied again); their later changes land in the new file and
    every catalogue, a fresh replay's included, stays the same."""
    path = tmp_path / "catalogue.jsonl"
    a, b = Recommender.from_run(runs["unisrec"]), Recommender.from_run(runs["unisrec"])
    a.keep_log(path)
    b.keep_log(path)
    for n in range(6):  # a history worth folding: texts replaced, items removed and given a text again
        a.add_items({f"new{n % 3}": f"tool number {n} for the garden"})
    a.remove_items(["new1", "i4"])
    b.add_items({"new1": "new1 is back", "new9": "blue glue"})
    a.remove_items(["new9"])
    counts = compact(path)
    assert (counts["lines_before"], counts["lines_after"]) == (10, 3)
    head = json.loads(path.read_text().splitlines()[0])
    assert head["compacted"]["lines"] == 3 and head["compacted"]["from"][2] == counts["bytes_before"]
    assert head["compacted"]["total"] == 9 and head["log"] == a.catalogue_log._log_id  # type: ignore[union-attr]

    applied: list[int] = []  # what b applies from here on
    b_apply = b.apply_items
    b.apply_items = lambda items: (applied.append(len(items)), b_apply(items))[1]  # type: ignore[method-assign]
    # b had not read a's last removal: it reads the old file to its end, then skips the folded lines
    assert b.catalogue_log is not None and b.catalogue_log.catch_up(b) == 1
    assert b.catalogue_log.moves == 1 and applied == [] and b.catalogue_log.changes == 9  # changes ever made
    b.add_items({"new3": "small tape"})
    a.remove_items(["new0"])
    assert a.catalogue_log is not None and a.catalogue_log.moves == 1 and a.catalogue_log.changes == 11
    assert b.catalogue_log.catch_up(b) == 1 and applied == []  # a's removal; no item applied again
    same_catalogue(a, b)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["op"] for line in lines] == ["catalogue", "items", "remove", "items", "remove"]
    fresh = Recommender.from_run(runs["unisrec"])
    assert fresh.keep_log(path) == (4, 0) and fresh.catalogue_log is not None
    assert fresh.catalogue_log.changes == b.catalogue_log.changes == 11  # the same count in every process
    same_catalogue(a, fresh)
    assert "new0" in fresh.catalogue.index and fresh.catalogue.index["new0"] in fresh.catalogue.removed
    for rec in (a, b, fresh):
        rec.close_log()


def test_a_process_that_missed_two_compactions_applies_the_new_file_again(runs: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    """Compacted twice between a follower's reads (the second folds changes it never read): it applies the new
    file from its start, which gives the writer's catalogue again."""
    path = tmp_path / "catalogue.jsonl"
    a, b = Recommender.from_run(runs["unisrec"]), Recommender.from_run(runs["unisrec"])
    a.keep_log(path)
    follower = CatalogueLog(path)  # b reads the file only when told (catch_up), as a follower between two polls
    follower.replay(b, write=False)
    a.add_items({"new1": "a red tool for the garden", "new2": "blue glue for paper"})
    a.remove_items(["i3"])
    compact(path)
    a.add_items({"new3": "small tape", "new1": "a green saw"})
    a.add_items({"i4": a.catalogue.title(a.catalogue.index["i4"]) or "i4"}, {"i4": "I4, titled"})
    a.add_items({"i4": a.catalogue.texts[a.catalogue.index["i4"]]}, {"i4": "I4, titled again"})  # a title alone
    compact(path)
    a.remove_items(["new2"])
    assert a.catalogue_log is not None and a.catalogue_log.moves == 2  # it wrote after each
    applied: list[list[str]] = []
    b_apply = b.apply_items
    b.apply_items = lambda items: (applied.append(sorted(items)), b_apply(items))[1]  # type: ignore[method-assign]
    # b: the two changes it had not read from its first file, then the new file's state (what differs from b's)
    assert follower.catch_up(b) == 2 + 1 and follower.moves == 1 and follower.changes == a.catalogue_log.changes == 6
    # from the first file new1 and new2; from the state only what differs: new1's text, new3, i4's title (new2 is
    # removed)
    assert applied == [["new1", "new2"], ["i4", "new1", "new3"]]
    assert b.catalogue.title(b.catalogue.index["i4"]) == "I4, titled again"
    same_catalogue(a, b)
    a.close_log()
    follower.close()
    assert follower.catch_up(b) == 0 and follower._fd is None  # closed: not opened again


def test_a_log_replaced_by_anything_but_its_compaction_stops_the_process(runs: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    """A file put in the log's place that is not a compaction of it (a new log, or a compaction older than
    what the process read: a backup put back) is not followed: the process stops keeping the log, and says
    so (it is a 503 in a service)."""
    path = tmp_path / "catalogue.jsonl"
    a = Recommender.from_run(runs["sasrec"])
    a.keep_log(path)
    a.remove_items(["i1"])
    other = tmp_path / "other.jsonl"
    b = Recommender.from_run(runs["sasrec"])
    b.keep_log(other)  # a log of the same catalogue, started apart
    b.close_log()
    os.replace(other, path)
    with pytest.raises(CatalogueLogBroken, match="not a compaction of it"):
        a.remove_items(["i2"])
    a.close_log()

    path.unlink()
    a = Recommender.from_run(runs["sasrec"])
    a.keep_log(path)
    a.remove_items(["i1"])
    compact(path)
    backup = path.read_bytes()  # the compaction of one change
    a.remove_items(["i2"])
    a.remove_items(["i3"])
    compact(path)
    a.remove_items(["i4"])  # a is in the second compaction's file
    path.with_name("backup").write_bytes(backup)
    os.replace(path.with_name("backup"), path)
    with pytest.raises(CatalogueLogBroken, match="not a compaction of it"):
        a.remove_items(["i5"])
    a.close_log()


def test_compaction_settles_the_last_line_and_refuses_a_log_without_its_first_line(runs: dict[str, Path],
                                                                                  tmp_path: Path) -> None:
    """A last line whole but for its newline (a writer stopped before that byte) gets it first, so the processes
    reading the file end where the compaction does and go on after its lines; a log written before logs named
    their catalogue cannot be compacted, and says so."""
    path = tmp_path / "catalogue.jsonl"
    a = Recommender.from_run(runs["sasrec"])
    a.keep_log(path, follow=False)
    a.remove_items(["i1"])
    with path.open("a") as f:
        f.write('{"op": "remove", "ids": ["i2"]}')  # no newline
    reader = CatalogueLog(path)
    b = Recommender.from_run(runs["sasrec"])
    reader.replay(b, write=False)  # reads i1's removal; i2's line waits for its newline
    compact(path)
    assert reader.catch_up(b) == 1 and reader.moves == 1 and reader.changes == 2
    assert b.catalogue.removed == {b.catalogue.index["i1"], b.catalogue.index["i2"]}
    reader.close()
    a.close_log()

    inode = path.stat().st_ino  # compact already, nothing appended since: left as it is (no process moves)
    assert compact(path)["lines_after"] == compact(path)["lines_before"] and path.stat().st_ino == inode

    headless = tmp_path / "old.jsonl"
    headless.write_text('{"op": "remove", "ids": ["i1"]}\n{"op": "remove", "ids": ["i2"]}\n')
    with pytest.raises(SeqrecError, match="no catalogue line at its start"):
        compact(headless)


def test_compaction_waits_for_a_change_being_made(runs: dict[str, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction started while a process makes a change (its line written, the change not yet made) waits for
    it: the new file holds that change, and the writer goes on in it."""
    path = tmp_path / "catalogue.jsonl"
    rec = Recommender.from_run(runs["sasrec"])
    rec.keep_log(path)
    rec.remove_items(["i1"])
    inside, go_on = threading.Event(), threading.Event()
    remove = rec.catalogue.remove

    def slow_remove(ids: list[int]) -> None:
        inside.set()
        go_on.wait(10)
        remove(ids)

    monkeypatch.setattr(rec.catalogue, "remove", slow_remove)
    writer = threading.Thread(target=rec.remove_items, args=(["i2"],))
    writer.start()
    assert inside.wait(10)
    done: list[dict[str, int]] = []
    compactor = threading.Thread(target=lambda: done.append(compact(path)))
    compactor.start()
    compactor.join(0.3)
    assert compactor.is_alive() and not done  # waiting for the change's lock
    go_on.set()
    writer.join(10)
    compactor.join(10)
    assert done and done[0]["lines_after"] == 2
    monkeypatch.undo()
    rec.remove_items(["i3"])
    assert rec.catalogue_log is not None and rec.catalogue_log.moves == 1
    fresh = Recommender.from_run(runs["sasrec"])
    fresh.keep_log(path)
    assert fresh.catalogue.removed == {fresh.catalogue.index[i] for i in ("i1", "i2", "i3")}
    rec.close_log()
    fresh.close_log()


def test_compactions_while_two_following_processes_keep_changing(runs: dict[str, Path], tmp_path: Path) -> None:
    """Two processes (each writing, each following in the background) change the catalogue from two threads
    while the log is compacted again and again: none fails, and both end with the catalogue a fresh replay
    of the file gives."""
    path = tmp_path / "catalogue.jsonl"
    a, b = Recommender.from_run(runs["unisrec"]), Recommender.from_run(runs["unisrec"])
    a.keep_log(path, follow=True)
    b.keep_log(path, follow=True)
    errors: list[BaseException] = []

    def changes(rec: Recommender, name: str) -> None:
        try:
            for n in range(12):
                rec.add_items({f"{name}{n % 4}": f"{name} tool {n}", "shared": f"shared text {name} {n}"})
                if n % 3 == 2:
                    rec.remove_items([f"{name}{n % 4}", "i5"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=changes, args=(rec, name)) for rec, name in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    compactions = 0
    while any(t.is_alive() for t in threads):
        compact(path)
        compactions += 1
    for t in threads:
        t.join()
    assert not errors, errors
    assert compactions >= 2
    for rec in (a, b):
        assert rec.catalogue_log is not None and rec.catalogue_log.error is None
        rec.catalogue_log.catch_up(rec)
    fresh = Recommender.from_run(runs["unisrec"])
    fresh.keep_log(path, write=False)
    for rec in (a, b):
        assert rec.catalogue.raw_ids == fresh.catalogue.raw_ids and rec.catalogue.titles == fresh.catalogue.titles
        assert rec.catalogue.removed == fresh.catalogue.removed
        torch.testing.assert_close(rec.catalogue.vectors, fresh.catalogue.vectors, atol=1e-5, rtol=0)
    a.close_log()
    b.close_log()


def test_a_compacted_log_replays_to_the_same_catalogue(runs: dict[str, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`seqrec compact-log`: each item's last text in the order items were first added (the same indices),
    then one removal; an older line without vectors stays without them."""
    path = tmp_path / "catalogue.jsonl"
    served = Recommender.from_run(runs["unisrec"])
    served.keep_log(path)
    served.add_items({"new1": "a red tool for the garden", "new2": "blue glue for paper"})
    served.add_items({"new1": "a green saw", "i3": "i3 with a text of its own"})
    served.remove_items(["new2", "i8", "i3"])
    served.add_items({"new3": "small tape", "i3": "i3 back again"},  # removed, then given a text: back
                     {"i3": "I3 (titled)"})
    served.remove_items(["new3"])
    served.close_log()
    with path.open("a") as f:  # a line from before lines carried vectors
        f.write(json.dumps({"op": "items", "items": {"new4": "a ladder"}}) + "\n")
    replayed = Recommender.from_run(runs["unisrec"])
    replayed.keep_log(path, write=False)  # the catalogue the log replays to before compaction
    replayed.close_log()
    before = path.stat().st_size

    counts = compact(path)
    assert (counts["lines_before"], counts["lines_after"], counts["items"], counts["removed"]) == (7, 4, 5, 3)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["op"] for line in lines] == ["catalogue", "items", "items", "remove"]
    assert list(lines[1]["items"]) == ["new1", "new2", "i3", "new3"] and "vectors" in lines[1]
    assert lines[1]["items"]["i3"] == "i3 back again" and lines[2] == {"op": "items", "items": {"new4": "a ladder"}}
    assert lines[1]["titles"] == {"i3": "I3 (titled)"}
    assert sorted(lines[3]["ids"]) == ["i8", "new2", "new3"] and path.stat().st_size < before
    again = Recommender.from_run(runs["unisrec"])
    assert again.keep_log(path) == (3, 0)
    assert again.catalogue.raw_ids == replayed.catalogue.raw_ids
    assert again.catalogue.titles == replayed.catalogue.titles and "new4" in again.catalogue.index
    assert again.catalogue.texts == replayed.catalogue.texts and "I3 (titled)" in again.catalogue.titles
    assert again.catalogue.removed == replayed.catalogue.removed
    torch.testing.assert_close(again.catalogue.vectors, replayed.catalogue.vectors, atol=1e-5, rtol=0)

    # compacted while a service keeps the file: its next change moves to the new file, after the folded lines
    again.remove_items(["new1"])
    assert compact(path)["lines_after"] == 4 and again._log is not None and again._log.moves == 0
    again.remove_items(["new4"])
    assert again._log.moves == 1 and again._log.changes == 8  # the 7 changes the compaction folded, then one
    again.close_log()
    with path.open("a") as f:
        f.write('{"op": "remove", "ids": ["i')  # cut short by a crash: left out
    assert compact(path)["dropped"] == 1 and not path.read_text().endswith("i")
    from seqrec.cli import main

    assert main(["compact-log", str(path)]) == 0
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["compact-log", str(empty)]) == 0 and empty.read_text() == ""
    assert "is empty (no service has written it yet): nothing to compact" in capsys.readouterr().out
    with pytest.raises(SeqrecError, match="no such catalogue log"):
        compact(tmp_path / "nowhere.jsonl")


def test_compaction_through_a_link_keeps_the_file_and_fails_whole(runs: dict[str, Path], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A link to the log names the same file for the service and for compaction; the compacted file keeps
    the old one's mode; a compaction that fails leaves the log as it was and no file behind."""

    path, link = tmp_path / "catalogue.jsonl", tmp_path / "link.jsonl"
    rec = Recommender.from_run(runs["sasrec"])
    rec.keep_log(path)
    rec.remove_items(["i1"])
    rec.remove_items(["i2"])
    link.symlink_to(path)
    rec.close_log()
    path.chmod(0o640)
    before = path.read_bytes()
    files = sorted(p.name for p in tmp_path.iterdir())

    def full_disk(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("seqrec.serve.catalogue_log.os.replace", full_disk)
    with pytest.raises(SeqrecError, match=r"cannot compact the catalogue log \(No space left"):
        compact(link)
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == files
    assert compact(link)["lines_after"] == 2 and link.is_symlink() and (path.stat().st_mode & 0o777) == 0o640
    again = Recommender.from_run(runs["sasrec"])
    assert again.keep_log(link) == (1, 0)
    assert again.catalogue.removed == {again.catalogue.index[i] for i in ("i1", "i2")}
