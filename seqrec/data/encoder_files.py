"""What a local text encoder's vectors depend on, read off its folder.

    revision = names and sizes of every file + the bytes of its small JSON files   (cheap: the cache key)
    weights  = sha256 of the bytes of every file outside hidden folders             (exact: checked at reuse)

`revision` names cache entries and catalogue-log lines, as it always has, so what was cached before
stays found. It misses a rewrite that keeps every size (weights retrained or edited in place), so an
entry also records `weights`, and an entry whose `weights` differs from the folder's now is stale: its
texts are encoded again. An entry made before `weights` was recorded is stale when a file of the folder
changed after it was written. Hidden folders (.git, .cache) are left out: what git or a hub client
keeps there changes without the model changing. The digest is kept per process, by file size and
modification time, so a folder is read once.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

_DIGESTS: dict[tuple, str] = {}  # the file signatures of a folder -> its weights digest


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(path).parts))


def local_revision(path: Path) -> str:
    """The cache-key fingerprint of a local model folder: its config files' bytes and every file's name
    and size (every file, hidden ones included, as entries made before `weights_digest` were keyed)."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(path)}:{f.stat().st_size}\n".encode())
        if f.suffix == ".json" and f.stat().st_size < 1 << 20:
            h.update(f.read_bytes())
    return "local-" + h.hexdigest()[:12]


def weights_digest(path: Path) -> str:
    """sha256 (first 16 hex digits) of the names and bytes of a model folder's files outside hidden folders."""
    files = _files(path)
    signature = (str(path.resolve()), *((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    if signature not in _DIGESTS:
        h = hashlib.sha256()
        for f in files:
            h.update(f"{f.relative_to(path)}\n".encode())
            with f.open("rb") as stream:
                while block := stream.read(1 << 22):
                    h.update(block)
        _DIGESTS[signature] = h.hexdigest()[:16]
    return _DIGESTS[signature]


def newest_change(path: Path) -> float:
    """When a file of a model folder (outside hidden folders) last changed, as a modification time."""
    return max((f.stat().st_mtime for f in _files(path)), default=0.0)


def entry_is_fresh(meta: dict, meta_path: Path, source: str) -> bool:
    """Whether a text-cache entry (its JSON `meta`, at `meta_path`) was made by the files of the local
    encoder folder `source` as they are now: the same `weights`, or, for an entry older than that field,
    no file changed after it was written. True for an encoder that is not a local folder."""
    folder = Path(source)
    if not folder.is_dir():
        return True
    if "weights" in meta:
        return bool(meta["weights"] == weights_digest(folder))
    return meta_path.stat().st_mtime >= newest_change(folder)


def transformer_dir(path: Path) -> Path:
    """A sentence-transformers folder may keep its Transformer module in a subfolder."""
    modules = path / "modules.json"
    if modules.is_file() and not (path / "config.json").is_file():
        for m in json.loads(modules.read_text()):
            if m.get("type", "").endswith("Transformer"):
                return path / m.get("path", "")
    return path
