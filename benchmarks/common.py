"""Helpers shared by the benchmark scripts: where data lives, preparing it once, machine facts."""

from __future__ import annotations

import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
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


# The training settings the stored results were measured with before each model had training
# defaults of its own (seqrec.config.with_model_train_defaults: SASRec's AdamW, weight average and
# refit): scripts that rerun those recipes from the library defaults put these first
PLAIN_TRAIN = ['train.optimizer="adam"', "train.ema=0.0", "train.refit=false"]


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


def fresh_run(path: Path) -> Path:
    """A benchmark's run folder, its earlier run removed (`fit` refuses to write into a folder holding one)."""
    shutil.rmtree(path, ignore_errors=True)
    return path


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it ("AMD EPYC ...", "Intel(R) Xeon(R) ..."), "" if unknown:
    machines lent for a session differ, and so do their matmul units (native bf16 or not)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")


def machine() -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=False).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                 capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        commit = changed = ""
    if commit and changed:  # measured with changes not yet committed: the commit alone does not name the code
        commit += "+changes"
    gpu = {"gpu": torch.cuda.get_device_name()} if torch.cuda.is_available() else {}
    return {"cpu": platform.processor() or platform.machine(), "cpu_model": cpu_model(), "cores": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "commit": commit, **gpu}


def median_run(d: dict[str, Any]) -> dict[str, Any]:
    """The run of the median time among `d["runs"]`, whole: its rate and fraction of the peak belong to
    that time (medians taken field by field mix runs); with an even count, the faster of the two middle."""
    return sorted(d["runs"], key=lambda r: r["seconds"])[(len(d["runs"]) - 1) // 2]


def matmul_gflops(threads: int, n: int = 4096, repeats: int = 3, dtype: torch.dtype = torch.float32) -> float:
    """Median GFLOP/s of an n x n matrix product in `dtype` on `threads` threads: the peak that
    compute-bound work is measured against, in the same run."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


def checkout_env(root: Path, *more: Path, **extra: str) -> dict[str, str]:
    """This process's environment with `root` (another checkout, whose seqrec a child process must import) and
    `more` first on PYTHONPATH, and the `extra` variables set."""
    path = os.pathsep.join([str(root), *map(str, more), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, **extra, "PYTHONPATH": path}


def load_result(name: str) -> Any:
    """results/<name> as JSON, or None where that benchmark has not run."""
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def write_result(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


def seqrec_cmd(*args: str, launcher: list[str] | None = None) -> list[str]:
    return [*(launcher or [sys.executable]), "-m", "seqrec.cli", *args]


def command_sets(command: str) -> dict[str, str]:
    """The `--set key=value` overrides of a recorded command line (the last one of a key wins)."""
    words = command.split()
    return dict(w.split("=", 1) for a, w in itertools.pairwise(words) if a == "--set" and "=" in w)


def train_run(out: Path, name: str, dataset: str, config: str | None, sets: list[str],
              launcher: list[str] | None = None, model: str | None = None) -> dict[str, Any]:
    """`seqrec train` (under `launcher`, e.g. torchrun) into out/name from a config (or a model's
    defaults) with `--set` overrides: its wall time, per-epoch medians and metrics, or its error."""
    run = out / name
    chosen = ["--config", str(ROOT / config)] if config else ["--model", str(model)]
    cmd = seqrec_cmd("train", "--dataset", dataset, *chosen, "--out", str(run), "--overwrite",  # a rerun replaces it
                     *[a for s in sets for a in ("--set", s)], launcher=launcher)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout)[-2000:], "command": " ".join(cmd[2:])}
    res = json.loads((run / "results.json").read_text())
    epochs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    epoch_s = [e["train_s"] for e in epochs if "train_s" in e]
    rates = [e["targets_per_s"] for e in epochs if "targets_per_s" in e]
    return {"command": " ".join(cmd[2:]), "wall_s": wall, "train_seconds": res["train_seconds"],
            "epochs_run": res["epochs_run"], "median_epoch_s": statistics.median(epoch_s) if epoch_s else None,
            "median_targets_per_s": statistics.median(rates) if rates else None,
            "device": res.get("device"), "test": res["test"], "valid": res["valid"], "run": str(run)}
