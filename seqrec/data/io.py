"""Atomic folder and file writes, and safe JSON helpers.

A prepared dataset or a checkpoint is written into a temporary sibling folder
and moved into place with one rename, so an interrupted command never leaves a
half-written folder that a later command would trust.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from seqrec.errors import SeqrecError


@contextlib.contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces `dest` in one rename."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        yield tmp
        _usual_modes(tmp)
        old = None
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            os.replace(dest, old)
        os.replace(tmp, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()  # read once, at import: os.umask can only be read by setting it


def _usual_modes(folder: Path) -> None:
    """The modes a plain mkdir / open would have given (the temporary folder is 0700, and some writers,
    safetensors among them, create 0600 files): a run or an export is shared like any other folder."""
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~UMASK)


def write_json_atomic(path: Path, obj: Any) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    """A JSON file that seqrec wrote (meta.json, config.json, ...); a damaged one is a one-line error naming it."""
    try:
        return json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SeqrecError(f"{path}: not valid JSON ({exc})") from None


RUN_FILES = ("config.json", "results.json", "checkpoint", "state", "data_card.json")  # what makes a run folder


def check_new_run_dir(run_dir: Path) -> None:
    """A new run goes into a folder that is absent or holds no run: its files would mix with the old run's
    (checked by the first process of a distributed run, which writes the folder)."""
    if os.environ.get("RANK", "0") != "0" or not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise SeqrecError(f"{run_dir}: a file is there, not a run folder")
    held = [name for name in RUN_FILES if (run_dir / name).exists()]
    if held:
        raise SeqrecError(f"{run_dir} holds a run ({', '.join(held)}): train into another folder, remove it "
                          "first, or resume it (resume=True; `seqrec train --resume`)")
