"""fetch_ml100k: source order, fallback, hash pins, atomicity, idempotence.

The network is never touched by default: the two downloaders are replaced by
functions that write small zip files, and the pins by the digests of their content.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import urllib.error
import zipfile
from pathlib import Path

import pytest

from seqrec.data import fetch
from seqrec.errors import SeqrecError

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ml-100k"

OFFICIAL_CONTENT = {
    "u.data": b"196\t242\t3\t881250949\n186\t302\t3\t891717742\n",
    "u.item": b"1|Toy Story (1995)|01-Jan-1995||http://x|0|0|0|1|1|1|0|0|0|0|0|0|0|0|0|0|0|0|0\n",
    "u.user": b"1|24|M|technician|85711\n",
    "u.genre": b"unknown|0\n",
    "u.occupation": b"administrator\n",
    "u.info": b"943 users\n",
    "README": b"terms\n",
}
MIRROR_CONTENT = {
    "ml-100k.inter": b"user_id:token\titem_id:token\trating:float\ttimestamp:float\n196\t242\t3\t1\n",
    "ml-100k.item": b"item_id:token\tmovie_title:token_seq\n1\tToy Story\n",
    "ml-100k.user": b"user_id:token\tage:token\n1\t24\n",
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


class FakeSources:
    """Stand-ins for the two downloaders that count their calls."""

    def __init__(self, official_ok: bool = True, mirror_ok: bool = True) -> None:
        self.official_ok, self.mirror_ok = official_ok, mirror_ok
        self.official_calls = 0
        self.mirror_calls = 0
        self.official_content = dict(OFFICIAL_CONTENT)

    def official(self, url: str, dest: Path, timeout: float) -> Path:
        self.official_calls += 1
        assert url == fetch.OFFICIAL_URL and timeout <= 30
        if not self.official_ok:
            raise urllib.error.URLError("Name or service not known")
        members = {f"ml-100k/{k}": v for k, v in self.official_content.items()}
        members["ml-100k/u1.base"] = b"not taken\n"
        return write_zip(dest, members)

    def mirror(self, dest_dir: Path) -> Path:
        self.mirror_calls += 1
        if not self.mirror_ok:
            raise OSError("pip download exited 1: no matching distribution")
        members = {f"recbole/dataset_example/ml-100k/{k}": v for k, v in MIRROR_CONTENT.items()}
        members["recbole/__init__.py"] = b""
        return write_zip(dest_dir / "recbole-1.2.1-py3-none-any.whl", members)


@pytest.fixture
def sources(monkeypatch: pytest.MonkeyPatch) -> FakeSources:
    fake = FakeSources()
    monkeypatch.setattr(fetch, "_download_official", fake.official)
    monkeypatch.setattr(fetch, "_download_mirror", fake.mirror)
    monkeypatch.setattr(fetch, "OFFICIAL_PINS",
                        {k: sha(OFFICIAL_CONTENT[k]) for k in ("u.data", "u.item")})
    monkeypatch.setattr(fetch, "MIRROR_PINS",
                        {k: sha(MIRROR_CONTENT[k]) for k in ("ml-100k.inter", "ml-100k.item")})
    return fake


def leftovers(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "raw").iterdir() if p.name != "ml-100k")


def test_official_archive_is_used_when_it_answers(tmp_path: Path, sources: FakeSources) -> None:
    result = fetch.fetch_ml100k(tmp_path)

    assert (sources.official_calls, sources.mirror_calls) == (1, 0)
    assert result.source == fetch.OFFICIAL_URL
    assert result.layout == "movielens-raw"
    assert result.fetched
    assert result.directory == tmp_path / "raw" / "ml-100k"
    assert sorted(p.name for p in result.directory.iterdir()) == sorted(
        [*OFFICIAL_CONTENT, "SOURCE.json"])
    assert (result.directory / "u.data").read_bytes() == OFFICIAL_CONTENT["u.data"]
    assert result.files == {k: sha(v) for k, v in OFFICIAL_CONTENT.items()}
    record = json.loads((result.directory / "SOURCE.json").read_text())
    assert record["source"] == fetch.OFFICIAL_URL
    assert record["layout"] == "movielens-raw"
    assert record["files"] == result.files
    assert record["pinned"] == ["u.data", "u.item"]
    assert leftovers(tmp_path) == []


def test_mirror_is_used_when_the_official_site_is_unreachable(
    tmp_path: Path, sources: FakeSources
) -> None:
    sources.official_ok = False
    result = fetch.fetch_ml100k(tmp_path)

    assert (sources.official_calls, sources.mirror_calls) == (1, 1)
    assert result.source == "pip:recbole==1.2.1"
    assert result.layout == "recbole-atomic"
    assert sorted(p.name for p in result.directory.iterdir()) == sorted(
        [*MIRROR_CONTENT, "SOURCE.json"])
    assert (result.directory / "ml-100k.inter").read_bytes() == MIRROR_CONTENT["ml-100k.inter"]
    record = json.loads((result.directory / "SOURCE.json").read_text())
    assert (record["source"], record["layout"]) == ("pip:recbole==1.2.1", "recbole-atomic")
    assert leftovers(tmp_path) == []


def test_offline_official_goes_straight_to_the_mirror(
    tmp_path: Path, sources: FakeSources
) -> None:
    result = fetch.fetch_ml100k(tmp_path, offline_official=True)
    assert (sources.official_calls, sources.mirror_calls) == (0, 1)
    assert result.layout == "recbole-atomic"


def test_hash_mismatch_raises_and_leaves_nothing_trusted(
    tmp_path: Path, sources: FakeSources
) -> None:
    sources.official_content["u.data"] = b"196\t242\t3\t881250950\n"  # one byte off
    with pytest.raises(SeqrecError, match=r"u\.data: sha256 .* does not match"):
        fetch.fetch_ml100k(tmp_path)
    assert sources.mirror_calls == 0  # a corrupt source is an error, not a reason to switch
    assert not (tmp_path / "raw" / "ml-100k").exists()
    assert leftovers(tmp_path) == []


def test_mirror_hash_mismatch_raises(
    tmp_path: Path, sources: FakeSources, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources.official_ok = False
    monkeypatch.setitem(fetch.MIRROR_PINS, "ml-100k.item", "0" * 64)
    with pytest.raises(SeqrecError, match=r"ml-100k\.item: sha256"):
        fetch.fetch_ml100k(tmp_path)
    assert not (tmp_path / "raw" / "ml-100k").exists()


def test_both_sources_failing_names_both(tmp_path: Path, sources: FakeSources) -> None:
    sources.official_ok = sources.mirror_ok = False
    with pytest.raises(SeqrecError) as err:
        fetch.fetch_ml100k(tmp_path)
    message = str(err.value)
    assert fetch.OFFICIAL_URL in message and "Name or service not known" in message
    assert "pip:recbole==1.2.1" in message and "no matching distribution" in message
    assert str(tmp_path / "raw" / "ml-100k") in message
    assert not (tmp_path / "raw" / "ml-100k").exists()


def test_second_call_is_a_no_op_that_says_so(
    tmp_path: Path, sources: FakeSources, caplog: pytest.LogCaptureFixture
) -> None:
    first = fetch.fetch_ml100k(tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in first.directory.iterdir()}
    with caplog.at_level(logging.INFO, logger="seqrec.data.fetch"):
        second = fetch.fetch_ml100k(tmp_path)

    assert (sources.official_calls, sources.mirror_calls) == (1, 0)
    assert not second.fetched
    assert (second.source, second.layout, second.files) == (first.source, first.layout,
                                                             first.files)
    assert {p.name: p.stat().st_mtime_ns for p in second.directory.iterdir()} == before
    assert "already present" in caplog.text


def test_corrupted_folder_is_fetched_again(tmp_path: Path, sources: FakeSources) -> None:
    first = fetch.fetch_ml100k(tmp_path)
    (first.directory / "u.item").write_bytes(b"truncated")
    second = fetch.fetch_ml100k(tmp_path)
    assert sources.official_calls == 2 and second.fetched
    assert (second.directory / "u.item").read_bytes() == OFFICIAL_CONTENT["u.item"]
    assert leftovers(tmp_path) == []


def test_interrupted_fetch_is_not_trusted(tmp_path: Path, sources: FakeSources) -> None:
    # What a killed fetch leaves: a staging folder, never the final one.
    stale = tmp_path / "raw" / ".ml-100k-abc123" / "ml-100k"
    stale.mkdir(parents=True)
    (stale / "u.data").write_bytes(OFFICIAL_CONTENT["u.data"])
    result = fetch.fetch_ml100k(tmp_path)
    assert result.fetched and sources.official_calls == 1


def test_files_put_in_place_by_hand_are_adopted(tmp_path: Path, sources: FakeSources) -> None:
    target = tmp_path / "raw" / "ml-100k"
    target.mkdir(parents=True)
    for name, data in MIRROR_CONTENT.items():
        (target / name).write_bytes(data)
    result = fetch.fetch_ml100k(tmp_path)
    assert (sources.official_calls, sources.mirror_calls) == (0, 0)
    assert (result.source, result.layout, result.fetched) == ("local", "recbole-atomic", False)
    assert json.loads((target / "SOURCE.json").read_text())["source"] == "local"


def test_seqrec_home_reads_the_environment(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setenv("SEQREC_HOME", str(tmp_path / "h"))
    assert fetch.seqrec_home() == tmp_path / "h"
    monkeypatch.setenv("SEQREC_HOME", "")
    assert fetch.seqrec_home() == Path.home() / ".cache" / "seqrec"
    monkeypatch.delenv("SEQREC_HOME")
    assert fetch.seqrec_home() == Path.home() / ".cache" / "seqrec"


@pytest.mark.realdata
@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data/ml-100k")
def test_pins_match_the_staged_release() -> None:
    for name, pin in fetch.OFFICIAL_PINS.items():
        assert sha((SHARED / "raw" / name).read_bytes()) == pin, name
    for name, pin in fetch.MIRROR_PINS.items():
        assert sha((SHARED / "recbole" / name).read_bytes()) == pin, name


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SEQREC_NETWORK_TESTS") != "1",
                    reason="set SEQREC_NETWORK_TESTS=1 to download recbole==1.2.1 with pip")
def test_real_pip_mirror(tmp_path: Path) -> None:
    result = fetch.fetch_ml100k(tmp_path, offline_official=True)
    assert (result.source, result.layout) == ("pip:recbole==1.2.1", "recbole-atomic")
    assert result.files["ml-100k.user"] == (
        "4f670007d9cfbeb9807e757209af1555b9bcc186bde25e767f67cb67c6dd5972")
