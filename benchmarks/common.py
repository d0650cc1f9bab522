"""Helpers shared by the benchmark scripts: where data lives, preparing it once, machine facts."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from seqrec.data.catalog import KNOWN_DATASETS, load_known
from seqrec.data.dataset import PreparedDataset
from seqrec.data.prepare import PrepareOptions, prepare

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SEQREC_SHARED_DATA", ROOT.parent / "shared" / "data"))
WORK = ROOT / "benchmarks" / "work"
RESULTS = ROOT / "benchmarks" / "results"


def prepared(name: str) -> PreparedDataset:
    """The prepared dataset `name` from ../shared/data, prepared once into benchmarks/work."""
    dest = WORK / "prepared" / name
    if (dest / "meta.json").is_file():
        return PreparedDataset.load(dest)
    source = SHARED_DATA / name
    if not source.is_dir():
        raise SystemExit(f"{source} is absent: benchmarks need ../shared/data (or SEQREC_SHARED_DATA)")
    options = {k: v for k, v in KNOWN_DATASETS[name].prepare.items() if k in ("dedupe", "kcore", "min_user_len")}
    return prepare(load_known(name, source), PrepareOptions(**options), dest)


def machine() -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=False).stdout.strip()
    except OSError:
        commit = ""
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "commit": commit}


def write_result(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")
