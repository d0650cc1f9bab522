"""Compacting a live catalogue log under load: `seqrec serve --workers 2 --catalogue-log FILE` (UniSRec,
100k items, IVF index, onnx engine) takes 1,000 items added by text (POST /items, one each) while
/recommend runs at concurrency 8, as serve_load.py's `workers` part does, and meanwhile the log is
compacted every few seconds (`seqrec.serve.catalogue_compact.compact`, what `seqrec compact-log` runs)
from this process: failed requests, how soon each new item is returned (5 answers in a row, each on a
new connection, so from either worker), how many compactions ran and how long each held the file (the
changes wait for it). Afterwards the compacted log is replayed into a fresh model: it must hold every
item added, and the same catalogue as the log's changes folded.

    python benchmarks/serve_compaction.py            # -> benchmarks/results/serve_compaction.json
    python benchmarks/serve_compaction.py --tiny     # seconds; what the test suite runs
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, WORK, machine, write_result
from benchmarks.serve_load import Server, build_unisrec, live_adds, real_titles
from seqrec.serve import Recommender
from seqrec.serve.catalogue_compact import compact


async def _live_with_compactions(port: int, journal: Path, n_items: int, titles: list[str], n_add: int,
                                 every_s: float) -> dict[str, Any]:
    live = asyncio.create_task(live_adds(port, n_items, titles, n_add, 1_000_000, 600.0, confirm=5))
    runs: list[dict[str, Any]] = []
    while not live.done():
        await asyncio.wait([live], timeout=every_s)
        if live.done():
            break
        t0 = time.perf_counter()
        counts = await asyncio.to_thread(compact, journal)
        runs.append({**counts, "seconds": time.perf_counter() - t0})
    held = np.array([r["seconds"] for r in runs]) * 1e3 if runs else np.zeros(1)
    return {**live.result(), "compactions": len(runs), "compaction_ms_p50": float(np.median(held)),
            "compaction_ms_max": float(held.max()), "compaction_runs": runs}


def bench(run: Path, n_items: int, titles: list[str], n_add: int, every_s: float) -> dict[str, Any]:
    work = WORK / "serve"
    journal = work / "catalogue-compacting.jsonl"
    journal.unlink(missing_ok=True)
    server = Server(run, work / "compacting.log", index="ivf", engine="onnx", workers=2, catalogue_log=journal)
    try:
        out = {"workers": 2, "index": "ivf", "engine": "onnx", "every_s": every_s,
               **asyncio.run(_live_with_compactions(server.port, journal, n_items, titles, n_add, every_s))}
    finally:
        server.stop()
    replayed = Recommender.from_run(run)
    changes, dropped = replayed.keep_log(journal, write=False)
    added = [f"new{j}" for j in range(n_add)]
    out["replay"] = {"changes": changes, "dropped": dropped, "log_bytes": journal.stat().st_size,
                     "items_added_found": sum(raw in replayed.catalogue.index for raw in added),
                     "items_active": replayed.catalogue.n_active, "items_expected": n_items + n_add}
    print({k: v for k, v in out.items() if k != "compaction_runs"}, flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a 2,000-item catalogue and 20 additions (seconds)")
    p.add_argument("--every", type=float, default=None, help="seconds between compactions (default 5; tiny 0.5)")
    p.add_argument("--out", type=Path, help="results file (default benchmarks/results/serve_compaction[_tiny].json)")
    args = p.parse_args()
    n_items, n_add = (2_000, 20) if args.tiny else (100_000, 1_000)
    every = args.every or (0.5 if args.tiny else 5.0)
    titles = real_titles(50 if args.tiny else 1_000)
    run = WORK / "serve" / f"unisrec-{n_items}"
    build_unisrec(run, n_items, titles)
    out = args.out or RESULTS / ("serve_compaction_tiny.json" if args.tiny else "serve_compaction.json")
    write_result(out, {"machine": machine(), "n_items": n_items, "tiny": args.tiny,
                       "result": bench(run, n_items, titles, n_add, every)})
    print(f"-> {out}")


if __name__ == "__main__":
    main()
