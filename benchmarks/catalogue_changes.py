"""What one change of a live catalogue costs the retriever, against the catalogue's size: adding an item,
giving one a new vector, removing one and restoring it (`Retriever.add / update / remove / restore`, one
item each), on the exact, IVF and HNSW retrievers of `seqrec.serve.ann` over synthetic catalogues of
width 64 (10,000, 100,000 and 1,000,000 items; HNSW up to 100,000, whose 1M build alone takes minutes).
A service makes these changes under the catalogue's lock, inside the POST or DELETE that asks for them.

Each cell: the median and p99 over `--ops` changes after 20 warm-up ones, 1 thread, the index built
first (rebuilds it may start in the background are waited for before the next kind of change). With
`--against CHECKOUT`, the same measurement of another checkout's seqrec in the same run: for every
(size, kind) a process of each checkout in turn, `--repeats` times, each cell the median over the
repeats (timings here drift by the minute, so a change is judged by the ratio measured side by side).

    python benchmarks/catalogue_changes.py --against /tmp/seqrec-before --change "..."
    python benchmarks/catalogue_changes.py --tiny --out /tmp/changes.json   # seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT, checkout_env, machine, write_result

SIZES = (10_000, 100_000, 1_000_000)
HNSW_MAX = 100_000
OPS = ("add", "update", "remove", "restore")


def measure(n: int, kind: str, ops: int) -> dict[str, Any]:
    """(In the measuring process.) Per change kind: median and p99 ms over `ops` changes."""
    import numpy as np
    import torch

    from seqrec.serve.ann import build_retriever

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    vectors = torch.randn(n + 1, 64, generator=g) * torch.exp(0.3 * torch.randn(n + 1, 1, generator=g))
    r = build_retriever(kind, vectors, torch.randn(n + 1, generator=g) * 0.1)
    picks = torch.randperm(n, generator=g)[: ops + 20] + 1
    fresh = torch.randn(ops + 20, 64, generator=g) * 0.5  # shorter than the longest item: no rebuild for a new M
    out: dict[str, Any] = {}
    for op in OPS:
        times = []
        for j in range(ops + 20):
            i = int(picks[j])
            t = time.perf_counter()
            if op == "add":
                r.add(fresh[j : j + 1], torch.zeros(1))
            elif op == "update":
                r.update([i], fresh[j : j + 1], torch.zeros(1))
            elif op == "remove":
                r.remove([i])
            else:
                r.restore([i])
            times.append((time.perf_counter() - t) * 1e3)
        r.wait(600)
        ms = np.array(times[20:])
        out[op] = {"ms_p50": float(np.median(ms)), "ms_p99": float(np.percentile(ms, 99))}
    return out


def in_process(root: Path, n: int, kind: str, ops: int) -> dict[str, Any]:
    """`measure` in a new process running `root`'s seqrec."""
    env = checkout_env(root, ROOT / "benchmarks", OMP_NUM_THREADS="1")
    code = (f"import json, catalogue_changes as c; print('RESULT', json.dumps(c.measure({n}, {kind!r}, {ops})))")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def median_cells(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {op: {key: statistics.median(r[op][key] for r in runs) for key in ("ms_p50", "ms_p99")} for op in OPS}


def table(d: dict[str, Any]) -> list[str]:
    from tables import table as render

    against = d.get("against")
    head = ["items", "index", *[f"{op} ms (p50 / p99)" for op in OPS]]
    if against:
        head += [f"{op} p50 at {against['commit']}" for op in OPS] + ["p50 ratio, median over the changes"]
    rows = []
    for key, cell in d["cells"].items():
        n, kind = key.split("/")
        row = [f"{int(n):,}", kind, *[f"{cell['this'][op]['ms_p50']:.3f} / {cell['this'][op]['ms_p99']:.3f}"
                                      for op in OPS]]
        if against:
            theirs = cell["against"]
            ratio = statistics.median(theirs[op]["ms_p50"] / cell["this"][op]["ms_p50"] for op in OPS)
            row += [f"{theirs[op]['ms_p50']:.3f}" for op in OPS] + [f"{ratio:.1f} ×"]
        rows.append(row)
    return render(head, rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="2,000 items, a few changes (seconds)")
    p.add_argument("--ops", type=int, default=200, help="changes of each kind per cell")
    p.add_argument("--against", type=Path, help="another checkout, measured in turn with this one")
    p.add_argument("--change", help="with --against: what this checkout changes, in a sentence")
    p.add_argument("--repeats", type=int, default=3, help="with --against: processes of each checkout per cell")
    p.add_argument("--out", type=Path, help="default results/catalogue_changes[_tiny].json")
    args = p.parse_args()
    if args.against is not None and not args.change:
        p.error("--against needs --change")
    sizes, ops = ((2_000,), 30) if args.tiny else (SIZES, args.ops)
    repeats = args.repeats if args.against else 1
    out = args.out or RESULTS / ("catalogue_changes_tiny.json" if args.tiny else "catalogue_changes.json")
    result: dict[str, Any] = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "ops": ops, "repeats": repeats,
                              "cells": {}}
    if args.against:
        theirs = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.against, capture_output=True,
                                text=True, check=True).stdout.strip()
        result["against"] = {"checkout": str(args.against), "commit": theirs, "change": args.change}
    for n in sizes:
        for kind in ("exact", "ivf", "hnsw"):
            if kind == "hnsw" and n > HNSW_MAX:
                continue
            mine, other = [], []
            for _ in range(repeats):
                mine.append(in_process(ROOT, n, kind, ops))
                if args.against:
                    other.append(in_process(args.against.resolve(), n, kind, ops))
            cell = {"this": median_cells(mine), **({"against": median_cells(other)} if other else {})}
            result["cells"][f"{n}/{kind}"] = cell
            print(f"{n} {kind}: {json.dumps(cell)}", flush=True)
            write_result(out, result)
    print("\n".join(table(result)))


if __name__ == "__main__":
    main()
