"""Deploying a new model into a running service: `seqrec serve runs/current --workers 2` (SASRec, 100k
items, exact top-10) with `current` a link to run A; while /recommend load runs at concurrency 8, the
link is switched to run B and the service sent SIGHUP, on which uvicorn replaces the workers one at a
time, each new one (loading the link's run) answering before the old one stops. Measured: requests
answered with an error; requests whose keep-alive connection a retiring worker closed before it
answered (a client retries those on a new connection, as HTTP clients and proxies do for a connection
closed under them, and so does this one: a request failed only if its retry fails too); the time from
SIGHUP until 10 answers in a row, each on a new connection, come from run B (its version in /health);
and that the service's answers are then run B's (`Recommender.recommend` on the same histories).

    python benchmarks/serve_deploy.py            # -> benchmarks/results/serve_deploy.json
    python benchmarks/serve_deploy.py --tiny     # seconds; what the test suite runs
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, WORK, machine, write_result
from benchmarks.loadgen import call, read_response, request_bytes
from benchmarks.serve_load import Server, build_sasrec, histories
from seqrec.serve import Recommender


class Load:
    """`concurrency` keep-alive connections sending /recommend back to back until stopped; a request whose
    connection closes before its answer is sent again once on a new connection."""

    def __init__(self, port: int, bodies: list[bytes]) -> None:
        self.port, self.bodies = port, bodies
        self.sent = self.errors = self.closed = self.failed = 0
        self.latencies: list[float] = []
        self.stop = False

    async def _one(self, offset: int) -> None:
        i = offset
        conn = await asyncio.open_connection("127.0.0.1", self.port)
        while not self.stop:
            body = self.bodies[i % len(self.bodies)]
            i += 1
            t0 = time.perf_counter()
            self.sent += 1
            for attempt in (0, 1):
                reader, writer = conn
                try:
                    writer.write(body)
                    status, _ = await read_response(reader)
                    break
                except (asyncio.IncompleteReadError, ConnectionError):
                    writer.close()
                    self.closed += attempt == 0
                    self.failed += attempt == 1
                    conn = await asyncio.open_connection("127.0.0.1", self.port)
            else:
                continue
            self.latencies.append(time.perf_counter() - t0)
            self.errors += status >= 400
        conn[1].close()

    async def run(self, concurrency: int) -> None:
        await asyncio.gather(*(self._one(c * 97) for c in range(concurrency)))

    def summary(self, seconds: float) -> dict[str, Any]:
        ms = np.array(self.latencies) * 1e3
        return {"requests": self.sent, "error_answers": self.errors, "closed_before_answer_retried": self.closed,
                "failed_after_retry": self.failed, "requests_per_s": self.sent / seconds,
                "p50_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max())}


async def _health(port: int) -> dict[str, Any]:
    """/health on a new connection (so from whichever worker takes it); {} if it fails."""
    try:
        status, body = await call("127.0.0.1", port, "GET", "/health")
    except (OSError, asyncio.IncompleteReadError):
        return {}
    return body if status == 200 and isinstance(body, dict) else {}


def _workers(pid: int) -> set[int]:
    """The worker processes of the service whose main process is `pid` (uvicorn spawns them; Linux's /proc)."""
    out = set()
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in children.read_text().split():
            try:
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    out.add(int(child))
            except OSError:  # gone meanwhile
                continue
    return out


async def _deploy(server: Server, link: Path, run_b: Path, old: str, new: str, n_items: int,
                  before_s: float, cap_s: float) -> dict[str, Any]:
    load = Load(server.port, [request_bytes("POST", "/recommend", {"history": h, "k": 10})
                              for h in histories(500, n_items, 2)])
    t_start = time.perf_counter()
    task = asyncio.create_task(load.run(8))
    await asyncio.sleep(before_s)
    assert {(await _health(server.port)).get("version") for _ in range(20)} == {old}
    old_pids = _workers(server.proc.pid)  # the workers serving run A
    tmp = link.with_name(link.name + ".new")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_b.name)
    os.replace(tmp, link)  # the link switched in one step
    t_hup = time.perf_counter()
    os.kill(server.proc.pid, signal.SIGHUP)
    streak, switched_s = 0, None
    while time.perf_counter() - t_hup < cap_s:  # every old worker gone, and 10 answers in a row from run B
        streak = streak + 1 if (await _health(server.port)).get("version") == new else 0
        now = _workers(server.proc.pid)
        if streak >= 10 and len(now) == len(old_pids) and not now & old_pids:
            switched_s = time.perf_counter() - t_hup
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(before_s)  # the new workers under the same load
    load.stop = True
    await task
    return {"switched_after_s": switched_s, "old_workers": len(old_pids),
            "load": load.summary(time.perf_counter() - t_start)}


def bench(n_items: int, before_s: float, cap_s: float) -> dict[str, Any]:
    work = WORK / "serve" / "deploy"
    run_a, run_b, link = work / f"run-a-{n_items}", work / f"run-b-{n_items}", work / "current"
    build_sasrec(run_a, n_items, 50, seed=0)
    build_sasrec(run_b, n_items, 50, seed=1)
    link.unlink(missing_ok=True)
    link.symlink_to(run_a.name)
    rec_a, rec_b = Recommender.from_run(run_a), Recommender.from_run(run_b)
    assert rec_a.version != rec_b.version
    server = Server(link, work / "deploy.log", index="exact", engine="torch", workers=2,
                    ready_timeout=int(cap_s))
    try:
        out = asyncio.run(_deploy(server, link, run_b, str(rec_a.version), str(rec_b.version), n_items,
                                  before_s, cap_s))
        checks = histories(20, n_items, 5)
        same = {"a": 0, "b": 0}
        for h in checks:  # the service's answers are run B's now
            _, got = asyncio.run(call("127.0.0.1", server.port, "POST", "/recommend", {"history": h, "k": 10}))
            items = [r["item"] for r in got["items"]]  # type: ignore[index]
            same["a"] += items == [r.item for r in rec_a.recommend(h, 10)]
            same["b"] += items == [r.item for r in rec_b.recommend(h, 10)]
    finally:
        server.stop()
    out.update({"workers": 2, "answers_equal_run_b": same["b"], "answers_equal_run_a": same["a"],
                "answers_checked": len(checks),
                "start_s": server.start_s})
    print(out, flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a 2,000-item catalogue (seconds)")
    p.add_argument("--out", type=Path, help="results file (default benchmarks/results/serve_deploy[_tiny].json)")
    args = p.parse_args()
    n_items, before = (2_000, 2.0) if args.tiny else (100_000, 10.0)
    out = args.out or RESULTS / ("serve_deploy_tiny.json" if args.tiny else "serve_deploy.json")
    write_result(out, {"machine": machine(), "n_items": n_items, "tiny": args.tiny,
                       "result": bench(n_items, before, 300.0)})
    print(f"-> {out}")


if __name__ == "__main__":
    main()
