"""Deploying a new model into a running service: `seqrec serve runs/current --workers 2` (SASRec, 100k
items, exact top-10) with `current` a link to run A; while /recommend load runs at concurrency 8, the
link is switched to run B and the service sent SIGHUP, on which uvicorn replaces the workers one at a
time, each new one (loading the link's run) answering before the old one stops. Measured: requests
answered with an error; requests whose keep-alive connection a retiring worker closed before it
answered (a client retries those on a new connection, as HTTP clients and proxies do for a connection
closed under them, and so does this one: a request failed only if its retry fails too); the time from
SIGHUP until 10 answers in a row, each on a new connection, come from run B (its version in /health);
and that the service's answers are then run B's (`Recommender.recommend` on the same histories).

With --catalogue, run B was trained again with more items, and the live catalogue must survive the deploy:
both runs are UniSRec served with --catalogue-log; besides the /recommend load, a client adds items by text
one after another throughout (a 503 is retried after its Retry-After). Before the switch, `seqrec carry-log
LOG --to B` carries the log over to run B's catalogue; from then until they are replaced, run A's workers
refuse changes (503). Measured besides: additions refused and how long (seconds from the carry's start),
additions failed, and after the deploy, each item whose addition was answered looked up in the service,
the removals kept, and run B's own texts kept for the items it knows that run A had been given by text.

    python benchmarks/serve_deploy.py            # -> benchmarks/results/serve_deploy.json
    python benchmarks/serve_deploy.py --catalogue   # -> benchmarks/results/serve_deploy_catalogue.json
    python benchmarks/serve_deploy.py --tiny [--catalogue]   # seconds; what the test suite runs
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, WORK, machine, write_result
from benchmarks.loadgen import call, read_response, request_bytes
from benchmarks.serve_load import Server, build_sasrec, build_unisrec, histories, real_titles
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


def _leaked(log: Path) -> int:
    """The semaphores the service's resource tracker found left behind at its end (its warning in the log)."""
    found = re.findall(r"There appear to be (\d+) leaked semaphore", log.read_text(errors="replace"))
    return sum(int(n) for n in found)


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


async def _switch(server: Server, link: Path, run_b: Path, new: str, cap_s: float) -> tuple[float | None, set[int]]:
    """Switch the link to run B and send SIGHUP -> (seconds until every old worker is gone and 10 answers in a
    row, each on a new connection, come from run B, or None past `cap_s`; the old workers)."""
    old_pids = _workers(server.proc.pid)  # the workers serving run A
    tmp = link.with_name(link.name + ".new")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(run_b.name)
    os.replace(tmp, link)  # the link switched in one step
    t_hup = time.perf_counter()
    os.kill(server.proc.pid, signal.SIGHUP)
    streak = 0
    while time.perf_counter() - t_hup < cap_s:
        streak = streak + 1 if (await _health(server.port)).get("version") == new else 0
        now = _workers(server.proc.pid)
        if streak >= 10 and len(now) == len(old_pids) and not now & old_pids:
            return time.perf_counter() - t_hup, old_pids
        await asyncio.sleep(0.05)
    return None, old_pids


async def _deploy(server: Server, link: Path, run_b: Path, old: str, new: str, n_items: int,
                  before_s: float, cap_s: float) -> dict[str, Any]:
    load = Load(server.port, [request_bytes("POST", "/recommend", {"history": h, "k": 10})
                              for h in histories(500, n_items, 2)])
    t_start = time.perf_counter()
    task = asyncio.create_task(load.run(8))
    await asyncio.sleep(before_s)
    assert {(await _health(server.port)).get("version") for _ in range(20)} == {old}
    switched_s, old_pids = await _switch(server, link, run_b, new, cap_s)
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
                "answers_checked": len(checks), "leaked_semaphores": _leaked(work / "deploy.log"),
                "start_s": server.start_s})
    print(out, flush=True)
    return out


class Adder:
    """POST /items one new item at a time, each on a new connection (so to whichever worker takes it), until
    stopped; an item refused with 503 is sent again after its Retry-After, as a client would."""

    def __init__(self, port: int, titles: list[str]) -> None:
        self.port, self.titles = port, titles
        self.added: list[str] = []
        self.refused: list[float] = []  # when each 503 came
        self.failed = 0
        self.stop = False

    async def run(self) -> None:
        j = 0
        while not self.stop:
            item = {"id": f"new{j}", "text": self.titles[j % len(self.titles)]}
            status, _ = await call("127.0.0.1", self.port, "POST", "/items", {"items": [item]})
            if status == 503:
                self.refused.append(time.perf_counter())
                await asyncio.sleep(1.0)  # the Retry-After the service sends
                continue
            if status == 200:
                self.added.append(item["id"])
            else:
                self.failed += 1
            j += 1
            await asyncio.sleep(0.02)


async def _deploy_catalogue(server: Server, journal: Path, link: Path, run_b: Path, old: str, new: str,
                            n_items: int, titles: list[str], before_s: float, cap_s: float) -> dict[str, Any]:
    load = Load(server.port, [request_bytes("POST", "/recommend", {"history": h, "k": 10})
                              for h in histories(500, n_items, 2)])
    adder = Adder(server.port, titles)
    t_start = time.perf_counter()
    tasks = [asyncio.create_task(load.run(8)), asyncio.create_task(adder.run())]
    for j in range(1, 6):  # items run B was trained with, added to run A by text; two of both runs' removed
        await call("127.0.0.1", server.port, "POST", "/items", {"items": [{"id": f"i{n_items + j}", "text": "old"}]})
    for raw in ("i7", "i8"):
        await call("127.0.0.1", server.port, "DELETE", f"/items/{raw}")
    await asyncio.sleep(before_s)
    assert {(await _health(server.port)).get("version") for _ in range(20)} == {old}
    t0 = time.perf_counter()
    carried = await asyncio.create_subprocess_exec(sys.executable, "-m", "seqrec.cli", "carry-log", str(journal),
                                                   "--to", str(run_b), stdout=asyncio.subprocess.PIPE)
    said, _ = await carried.communicate()
    carry_s = time.perf_counter() - t0
    switched_s, old_pids = await _switch(server, link, run_b, new, cap_s)
    await asyncio.sleep(before_s)  # the new workers under the same load
    load.stop = adder.stop = True
    await asyncio.gather(*tasks)
    refused = [t - t0 for t in adder.refused]  # from the start of the carry
    found = 0
    for raw in adder.added:  # each item whose POST was answered is in the new run's catalogue
        status, info = await call("127.0.0.1", server.port, "GET", f"/items/{raw}")
        found += status == 200 and bool(info["recommendable"])  # type: ignore[index]
    own = [(await call("127.0.0.1", server.port, "GET", f"/items/i{n_items + j}"))[1] for j in range(1, 6)]
    gone = [(await call("127.0.0.1", server.port, "GET", f"/items/{raw}"))[1] for raw in ("i7", "i8")]
    return {"carry_exit": carried.returncode, "carry_said": said.decode().strip(), "carry_s": carry_s,
            "switched_after_s": switched_s, "old_workers": len(old_pids),
            "items_added": len(adder.added), "items_added_found_after": found, "add_failures": adder.failed,
            "adds_refused_503": len(refused), "refused_from_s": min(refused, default=None),
            "refused_until_s": max(refused, default=None),
            "own_texts_kept": sum(i["title"] != "old" for i in own),  # type: ignore[index]
            "removed_kept": sum(not g["recommendable"] for g in gone),  # type: ignore[index]
            "load": load.summary(time.perf_counter() - t_start)}


def bench_catalogue(n_items: int, n_new: int, before_s: float, cap_s: float) -> dict[str, Any]:
    """Run B trained again with `n_new` more items: the catalogue log carried over to it before the switch."""
    work = WORK / "serve" / "deploy-catalogue"
    titles = real_titles(50 if n_items < 10_000 else 1_000)
    run_a, run_b, link = work / f"run-a-{n_items}", work / f"run-b-{n_items}", work / "current"
    build_unisrec(run_a, n_items, titles)
    build_unisrec(run_b, n_items + n_new, titles)
    link.unlink(missing_ok=True)
    link.symlink_to(run_a.name)
    journal = work / "catalogue.jsonl"
    journal.unlink(missing_ok=True)
    versions = [str(Recommender.from_run(r).version) for r in (run_a, run_b)]
    server = Server(link, work / "deploy.log", index="exact", engine="torch", workers=2, catalogue_log=journal,
                    ready_timeout=int(cap_s))
    try:
        out = asyncio.run(_deploy_catalogue(server, journal, link, run_b, *versions, n_items, titles, before_s,
                                            cap_s))
    finally:
        server.stop()
    out.update({"workers": 2, "n_items_b": n_items + n_new, "start_s": server.start_s,
                "leaked_semaphores": _leaked(work / "deploy.log")})
    print(out, flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a 2,000-item catalogue (seconds)")
    p.add_argument("--catalogue", action="store_true",
                   help="UniSRec with a catalogue log; run B knows 1,000 more items (tiny: 100); items are added "
                        "by text throughout and the log is carried over to run B (seqrec carry-log) before the switch")
    p.add_argument("--out", type=Path, help="results file (default benchmarks/results/serve_deploy[_catalogue]"
                                            "[_tiny].json)")
    args = p.parse_args()
    n_items, before = (2_000, 2.0) if args.tiny else (100_000, 10.0)
    name = "serve_deploy" + ("_catalogue" if args.catalogue else "") + ("_tiny" if args.tiny else "")
    out = args.out or RESULTS / f"{name}.json"
    result = (bench_catalogue(n_items, 100 if args.tiny else 1_000, before, 300.0) if args.catalogue
              else bench(n_items, before, 300.0))
    write_result(out, {"machine": machine(), "n_items": n_items, "tiny": args.tiny, "result": result})
    print(f"-> {out}")


if __name__ == "__main__":
    main()
