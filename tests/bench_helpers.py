"""Running a script of benchmarks/ from a test, as a user would (its own process, offline)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str, timeout: float = 300, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """`python benchmarks/<script> args...` from the repository root; with `ok`, its exit status must be 0
    (else the test fails with the end of its stderr)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=timeout, check=False)
    if ok:
        assert done.returncode == 0, done.stderr[-2000:]
    return done
