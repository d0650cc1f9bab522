"""The service under load on this machine: `seqrec serve` with a 100k-item catalogue, driven over
loopback by a bounded load generator (benchmarks/loadgen.py: a fixed number of requests, a time cap).

    recommend   p50/p99 latency and requests/s of POST /recommend at concurrency 1, 8 and 32
                (SASRec, d 64, 2 blocks, histories of 5-50 items, top-10 over 100k items, exact
                and from the FAISS IVF index; histories encoded by PyTorch or, `--engine onnx`,
                by ONNX Runtime)
    live        1,000 items added by text (POST /items, one each, encoded by the packaged MiniLM)
                to a UniSRec service while /recommend load runs at concurrency 8: failed requests,
                and the time from each POST until the item is returned by the index (GET /similar of
                the catalogue item whose text it copies: the same text is the same vector); exact
                top-k with PyTorch, and the IVF index with the onnx engine
    deletes     30,000 items removed one at a time (DELETE /items/{id}) from a SASRec service on an
                HNSW and an IVF index while /recommend load runs at concurrency 8: the latency of the
                DELETEs (past a quarter of the index's rows dead, the index is rebuilt over the live
                items) and of /recommend meanwhile, and how many rebuilds the service logged
    workers     the live part's adds through a catalogue log (`--catalogue-log`) with 1 and 2 worker
                processes (ivf, onnx engine; with 2, an item counts as visible once 5 answers in a row,
                each on a new connection, return it), then the time until a restarted service answers:
                with no log, with that log, and with the log stripped of its encoder vectors
    shared_sessions
                sessions spread over 1 and 2 worker processes (one session store file; every event on
                a new connection, so the kernel picks the worker): 200 sessions of 30 events, 8 at a
                time (SASRec, exact top-10 over 100k items); per-event latency, events/s, failures, how
                many events were one cached step, and every answer against POST /recommend on the
                same history
    start       seconds from starting `seqrec serve` (SASRec, onnx engine) until it answers /health, with
                no exported graph kept (a new $SEQREC_HOME each start) and with the graph the first start
                kept, 3 starts each, alternating
    fast_path   POST /recommend at concurrency 8 (ivf index, onnx engine) answered beneath FastAPI
                (seqrec.serve.fast_route) and by FastAPI's routing (`--no-fast-path`), 5 services each,
                alternating: requests/s, latency and the server's CPU per request
    floor       GET /health (no model, no search: the HTTP stack alone) at concurrency 1, 8 and 32 on the
                service of the "ivf, onnx engine" row: what no model or index could go below on this machine
    sessions    time per session event with the KV cache against re-encoding the history, at
                history length 10, 50 and 200 (in process, 1 thread, exact top-10 over 100k items),
                and the model's part alone (one cached step against encoding the whole history)

The models have random weights: latency does not depend on what they learned. The server runs
with 1 torch thread so that the load generator has the other core.

    python benchmarks/serve_load.py            # -> benchmarks/results/serve_load.json
    python benchmarks/serve_load.py --tiny     # seconds; what the test suite runs
    python benchmarks/serve_load.py --parts live   # one part again, the others kept from the file
    python benchmarks/serve_load.py --parts recommend --against ../old-checkout --change "..." --out ...
                # each row's services of this checkout and of that one in turn, 3 times: a change's effect
                # measured on the machine as it is at the same moments (timings here drift by the day)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    RESULTS,
    ROOT,
    SHARED_DATA,
    WORK,
    checkout_env,
    machine,
    median_run,
    write_result,
)
from benchmarks.loadgen import call, read_response, request_bytes, run_load
from seqrec.models.sasrec import SASRec, SASRecConfig
from seqrec.models.unisrec import UniSRec, UniSRecConfig
from seqrec.serve import Recommender
from seqrec.serve.sessions import Sessions
from seqrec.train.checkpoint import save_checkpoint

# the served SASRec: pre-LN blocks, as the reported runs measured (the default layout is post-LN since)
SERVED_SASREC = SASRecConfig(d=64, n_layers=2, n_heads=2, norm_first=True, positions_from="start")


def item_table(n: int, titles: list[str]) -> pl.DataFrame:
    named = titles + [f"catalogue item {i}" for i in range(len(titles), n)]
    return pl.DataFrame({"idx": np.arange(1, n + 1), "item": [f"i{i}" for i in range(1, n + 1)], "title": named[:n]})


def real_titles(n: int) -> list[str]:
    """Up to n real item titles (Amazon Games 2018), or generated ones when the data is absent."""
    path = SHARED_DATA / "amazon-games-2018" / "Games.item"
    if path.is_file():
        frame = pl.read_csv(path, separator="\t", quote_char=None)
        return [t for t in frame[frame.columns[1]].cast(pl.Utf8).to_list() if t][:n]
    return [f"generated title number {i} blue red tool" for i in range(n)]


def build_sasrec(dest: Path, n_items: int, max_len: int, seed: int = 0) -> None:
    torch.manual_seed(seed)
    model = SASRec(SERVED_SASREC, n_items, max_len).eval()
    save_checkpoint(model, dest, max_len=max_len, item_table=item_table(n_items, []))


def build_unisrec(dest: Path, n_items: int, titles: list[str]) -> None:
    """A UniSRec whose first items carry real titles encoded by the packaged MiniLM; the rest random text vectors."""
    from seqrec.data.text import encode_texts

    cfg = UniSRecConfig(d=64, n_layers=2, n_heads=2, positions_from="start")
    torch.manual_seed(0)
    text = torch.randn(n_items + 1, cfg.text_dim) * 0.05
    text[1 : len(titles) + 1] = encode_texts(titles, cfg.text_options())
    text[0] = 0
    model = UniSRec(cfg, n_items, 50, text).eval()
    save_checkpoint(model, dest, max_len=50, item_table=item_table(n_items, titles))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`seqrec serve RUN` in a subprocess on a free loopback port, logging to a file."""

    def __init__(self, run: Path, log: Path, threads: int = 1, index: str = "exact", engine: str = "torch",
                 workers: int = 1, catalogue_log: Path | None = None, ready_timeout: int | None = None,
                 home: Path | None = None, extra: tuple[str, ...] = (), root: Path = ROOT) -> None:
        self.port = free_port()
        variables = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}
        variables.update({"SEQREC_HOME": str(home)} if home else {})
        # another checkout's seqrec (`--against`): its folder first, as its working folder
        env = checkout_env(root, **variables) if root != ROOT else {**os.environ, **variables}
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log.open("w")
        cmd = [sys.executable, "-m", "seqrec.cli", "serve", str(run), "--port", str(self.port),
               "--threads", str(threads), "--index", index, "--engine", engine, "--workers", str(workers)]
        cmd += ["--catalogue-log", str(catalogue_log)] if catalogue_log else []
        cmd += ["--ready-timeout", str(ready_timeout)] if ready_timeout else []
        cmd += list(extra)
        started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=root)
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                if asyncio.run(call("127.0.0.1", self.port, "GET", "/health"))[0] == 200:
                    self.start_s = time.perf_counter() - started  # until the service answers
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise SystemExit(f"the service did not start; see {log}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


# /recommend rows: (label, --index, --engine)
ROWS = (("exact", "exact", "torch"), ("ivf", "ivf", "torch"), ("ivf, onnx engine", "ivf", "onnx"))
# live-catalogue rows (UniSRec): results key, --index, --engine
LIVE_ROWS = (("live", "exact", "torch"), ("live_ivf_onnx", "ivf", "onnx"))
# deletion rows: (results key, --index)
DELETE_ROWS = (("deletes_hnsw", "hnsw"), ("deletes_ivf", "ivf"))
# fast-path rows: (label, extra `seqrec serve` arguments)
FAST_ROWS = (("fast path", ()), ("FastAPI routing", ("--no-fast-path",)))
PARTS = ("recommend", "fast_path", "floor", "start", "live", "workers", "deletes", "shared_sessions", "sessions")


def histories(n: int, n_items: int, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 51, n)
    items = np.minimum(rng.zipf(1.2, lengths.sum()), n_items)  # popular items recur, as in real logs
    cuts = np.split(items, np.cumsum(lengths)[:-1])
    return [[f"i{i}" for i in h] for h in cuts]


def recommend_bodies(n_items: int, seed: int = 0) -> list[bytes]:
    """500 POST /recommend requests (top-10) for generated histories over an `n_items` catalogue."""
    return [request_bytes("POST", "/recommend", {"history": h, "k": 10}) for h in histories(500, n_items, seed)]


def bench_recommend(run: Path, n_items: int, n_requests: int, cap: float, index: str,
                    engine: str = "torch", recommend: bool = True, floor: bool = False,
                    root: Path = ROOT) -> dict[str, Any]:
    """POST /recommend at concurrency 1, 8, 32 (`recommend`), then, `floor`, GET /health on the same service
    (the HTTP stack alone): {"recommend": rows, "floor": rows}, the parts asked for; `root`: the checkout
    whose seqrec serves."""
    server = Server(run, WORK / "serve" / f"recommend-{index}-{engine}.log", index=index, engine=engine, root=root)
    try:
        out: dict[str, Any] = {}
        bodies = recommend_bodies(n_items)
        asyncio.run(run_load("127.0.0.1", server.port, bodies, 4, min(300, n_requests), cap))  # warm-up
        for part, wanted in (("recommend", recommend), ("floor", floor)):
            if not wanted:
                continue
            if part == "floor":
                bodies = [request_bytes("GET", "/health", None)]
                asyncio.run(run_load("127.0.0.1", server.port, bodies, 4, min(300, n_requests), cap))  # warm-up
            rows = out[part] = {}
            for c in (1, 8, 32):
                rows[str(c)] = asyncio.run(run_load("127.0.0.1", server.port, bodies, c, n_requests, cap)).summary()
                print(f"{'/health' if part == 'floor' else '/recommend'} ({index}, {engine}) concurrency {c}: "
                      f"{rows[str(c)]}", flush=True)
        return out
    finally:
        server.stop()


def bench_recommend_against(run: Path, n_items: int, n_requests: int, cap: float, theirs: Path,
                            repeats: int, change: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recommend part for this checkout and for `theirs`, a service of each in turn for every row (which
    goes first alternates), `repeats` times: (ours, theirs), each row's run of median time per concurrency,
    every run kept; `change`: what this checkout changes, as the report says it."""
    check = subprocess.run([sys.executable, "-c", "import seqrec; print(seqrec.__file__)"], cwd=theirs, text=True,
                           capture_output=True, check=True, env=checkout_env(theirs))
    if not Path(check.stdout.strip()).resolve().is_relative_to(theirs):  # (an installed seqrec found first)
        raise SystemExit(f"--against {theirs}: its services would import seqrec from {check.stdout.strip()}")
    runs: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {"ours": {}, "theirs": {}}
    for repeat in range(repeats):
        for name, index, engine in ROWS:
            sides = (("ours", ROOT), ("theirs", theirs))
            for side, root in sides if repeat % 2 == 0 else sides[::-1]:
                rows = bench_recommend(run, n_items, n_requests, cap, index, engine, root=root)["recommend"]
                for c, r in rows.items():
                    runs[side].setdefault(name, {}).setdefault(c, []).append(r)
    medians = {side: {name: {c: {**median_run({"runs": rs}), "runs": rs} for c, rs in by_c.items()}
                      for name, by_c in rows.items()} for side, rows in runs.items()}
    done = subprocess.run(["git", "-C", str(theirs), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return medians["ours"], {"checkout": str(theirs), "commit": done.stdout.strip() or None, "repeats": repeats,
                             "change": change, "recommend": medians["theirs"]}


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds a process has used, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_fast_path(run: Path, n_items: int, n_requests: int, cap: float, repeats: int) -> dict[str, Any]:
    """POST /recommend at concurrency 8 (ivf index, onnx engine) answered by the fast path and by FastAPI's
    routing (`--no-fast-path`), a new service each time, alternating: requests/s, latency, and the server's
    CPU per request."""
    bodies = recommend_bodies(n_items)
    out: dict[str, Any] = {label: {"runs": []} for label, _ in FAST_ROWS}
    for _ in range(repeats):
        for label, extra in FAST_ROWS:
            server = Server(run, WORK / "serve" / "fast-path.log", index="ivf", engine="onnx", extra=extra)
            try:
                asyncio.run(run_load("127.0.0.1", server.port, bodies, 4, min(300, n_requests), cap))  # warm-up
                before = cpu_seconds(server.proc.pid)
                r = asyncio.run(run_load("127.0.0.1", server.port, bodies, 8, n_requests, cap)).summary()
                r["server_cpu_ms_per_request"] = (cpu_seconds(server.proc.pid) - before) / max(r["requests"], 1) * 1e3
            finally:
                server.stop()
            out[label]["runs"].append(r)
            print(f"/recommend (ivf, onnx, {label}) concurrency 8: {r}", flush=True)
    for label, _ in FAST_ROWS:
        out[label]["median"] = median_run(out[label])
    fast, framework = (out[label]["median"] for label, _ in FAST_ROWS)
    out["throughput_ratio"] = fast["requests_per_s"] / framework["requests_per_s"]
    out["cpu_ratio"] = fast["server_cpu_ms_per_request"] / framework["server_cpu_ms_per_request"]
    return out


def bench_start(run: Path, starts: int) -> dict[str, Any]:
    """Seconds until the service answers, its exported ONNX graph not kept (a fresh $SEQREC_HOME) or kept."""
    import tempfile

    times: dict[str, list[float]] = {"export": [], "kept": []}
    with tempfile.TemporaryDirectory(prefix="seqrec-start-") as scratch:
        kept = Path(scratch) / "kept"  # the first start exports into it; the "kept" starts load that graph
        for i in range(starts):
            for key, home in (("export", kept if i == 0 else Path(scratch) / f"fresh{i}"), ("kept", kept)):
                server = Server(run, WORK / "serve" / "start.log", engine="onnx", home=home)
                times[key].append(server.start_s)
                server.stop()
                print(f"start ({key}): {server.start_s:.1f} s", flush=True)
    return {"engine": "onnx", "index": "exact", "start_s": times,
            "median_s": {k: float(np.median(v)) for k, v in times.items()}}


async def live_adds(port: int, n_items: int, titles: list[str], n_add: int, n_requests: int, cap: float,
                confirm: int = 1) -> dict[str, Any]:
    """`confirm`: answers in a row (each on a new connection) that must return the new item; with several
    worker processes, each answer comes from whichever worker takes the connection."""
    bodies = recommend_bodies(n_items, 1)
    done = False
    load = asyncio.create_task(run_load("127.0.0.1", port, bodies, 8, n_requests, cap, stop=lambda: done))
    visible, post_ms, failures, history_failures = [], [], 0, 0
    for j in range(n_add):
        twin = j % len(titles) + 1  # the catalogue item whose text the new item copies
        t_sent = time.perf_counter()
        status, _ = await call("127.0.0.1", port, "POST", "/items",
                               {"items": [{"id": f"new{j}", "text": titles[twin - 1]}]})
        t0 = time.perf_counter()  # visibility is timed from the POST's answer
        post_ms.append((t0 - t_sent) * 1e3)
        failures += status != 200
        streak, first_seen = 0, float("inf")
        while time.perf_counter() - t0 < 5 and streak < confirm:
            status, found = await call("127.0.0.1", port, "GET", f"/similar/i{twin}?k=5")
            if status == 200 and f"new{j}" in [r["item"] for r in found["items"]]:  # type: ignore[index]
                first_seen = time.perf_counter() - t0 if streak == 0 else first_seen
                streak += 1
            else:
                streak = 0
        visible.append(first_seen if streak == confirm else float("inf"))
        # a history holding the new item: the encoder reads its input vector (the onnx engine's table)
        status, _ = await call("127.0.0.1", port, "POST", "/recommend", {"history": [f"i{twin}", f"new{j}"], "k": 10})
        history_failures += status != 200
    done = True
    result = (await load).summary()
    v = np.array(visible)
    return {"added": n_add, "add_failures": failures, "new_in_history_failures": history_failures,
            "post_ms_p50": float(np.median(post_ms)),
            "post_ms_p99": float(np.percentile(post_ms, 99)), "visible_s_p50": float(np.median(v)),
            "visible_s_max": float(v.max()), "visible_within_1s": int((v <= 1.0).sum()),
            "load_during_adds": result}


def bench_live(run: Path, n_items: int, titles: list[str], n_add: int, n_requests: int, cap: float,
               index: str = "exact", engine: str = "torch") -> dict[str, Any]:
    server = Server(run, WORK / "serve" / f"live-{index}-{engine}.log", index=index, engine=engine)
    try:
        out = {"index": index, "engine": engine, **asyncio.run(live_adds(server.port, n_items, titles, n_add,
                                                                     n_requests, cap))}
        print(f"live catalogue ({index}, {engine}): {out}", flush=True)
        return out
    finally:
        server.stop()


def bench_workers(run: Path, n_items: int, titles: list[str], n_add: int, repeats: int,
                  counts: tuple[int, ...] = (1, 2), baseline: bool = True) -> dict[str, Any]:
    """The live catalogue shared through a catalogue log by 1 and 2 worker processes (`counts`; ivf, onnx engine),
    then the restart: the time until a service answers with no log (`baseline`), with the log the adds wrote
    (their encoder vectors in it) and with the same log stripped of its vectors (its texts encoded again)."""
    work = WORK / "serve"
    out: dict[str, Any] = {}
    for workers in counts:
        journal = work / f"catalogue-workers{workers}.jsonl"
        journal.unlink(missing_ok=True)
        server = Server(run, work / f"workers{workers}.log", index="ivf", engine="onnx", workers=workers,
                        catalogue_log=journal)
        try:
            out[str(workers)] = {"workers": workers, "index": "ivf", "engine": "onnx", **asyncio.run(
                live_adds(server.port, n_items, titles, n_add, 1_000_000, 600.0, confirm=1 if workers == 1 else 5))}
            print(f"live catalogue, {workers} worker(s): {out[str(workers)]}", flush=True)
        finally:
            server.stop()
    full = work / "catalogue-workers2.jsonl"
    bare = work / "catalogue-no-vectors.jsonl"
    bare.write_text("".join(json.dumps({k: v for k, v in json.loads(line).items() if k not in ("vectors", "encoder")})
                            + "\n" for line in full.read_text().splitlines()))
    journals: list[tuple[str, Path | None]] = [("no log", None)] if baseline else []
    journals += [("log with vectors", full), ("log without vectors", bare)]
    starts: dict[str, list[float]] = {label: [] for label, _ in journals}
    for _ in range(repeats):
        for label, journal in journals:
            copy = None
            if journal is not None:  # a copy: a start settles the file it is given
                copy = work / "catalogue-restart.jsonl"
                copy.write_bytes(journal.read_bytes())
            server = Server(run, work / "restart.log", catalogue_log=copy)
            starts[label].append(server.start_s)
            server.stop()
    out["restart"] = {"changes": n_add, "log_bytes": full.stat().st_size,
                      "log_without_vectors_bytes": bare.stat().st_size, "start_s": starts,
                      "start_s_median": {k: float(np.median(v)) for k, v in starts.items()}}
    print(f"restart: {out['restart']}", flush=True)
    return out


async def _deletes(port: int, n_items: int, n_delete: int, cap: float) -> dict[str, Any]:
    bodies = recommend_bodies(n_items, 2)
    done = False
    load = asyncio.create_task(run_load("127.0.0.1", port, bodies, 8, 10_000_000, cap, stop=lambda: done))
    gone = np.random.default_rng(0).permutation(np.arange(1, n_items + 1))[:n_delete]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)  # one keep-alive connection for them all
    delete_ms, failures, t0 = [], 0, time.perf_counter()
    try:
        for i in gone:
            t = time.perf_counter()
            writer.write(request_bytes("DELETE", f"/items/i{i}", None))
            status, _ = await read_response(reader)
            delete_ms.append((time.perf_counter() - t) * 1e3)
            failures += status != 200
            if time.perf_counter() - t0 > cap:
                break
    finally:
        writer.close()
    done = True
    d = np.array(delete_ms)
    return {"deleted": len(d), "delete_failures": failures, "delete_ms_p50": float(np.median(d)),
            "delete_ms_p99": float(np.percentile(d, 99)), "delete_ms_max": float(d.max()),
            "delete_ms_over_100": int((d > 100).sum()), "load_during_deletes": (await load).summary()}


def bench_deletes(run: Path, n_items: int, n_delete: int, cap: float, index: str) -> dict[str, Any]:
    log = WORK / "serve" / f"deletes-{index}.log"
    server = Server(run, log, index=index)
    try:
        out = {"index": index, **asyncio.run(_deletes(server.port, n_items, n_delete, cap))}
    finally:
        server.stop()
    out["rebuilds_logged"] = sum("rebuilding" in line for line in log.read_text().splitlines())
    print(f"deletions ({index}): {out}", flush=True)
    return out


async def _session_events(port: int, plans: list[list[str]], concurrency: int) -> dict[str, Any]:
    """Each session's events in order, `concurrency` sessions at a time, then each answer checked against
    /recommend on the same history (items in the same order; scores within 1e-4)."""
    answers: dict[tuple[int, int], list[dict[str, Any]]] = {}
    latencies: list[float] = []
    failures = cached = 0
    waiting = list(range(len(plans)))

    async def one_at_a_time() -> None:
        nonlocal failures, cached
        while waiting:
            s = waiting.pop()
            for n, item in enumerate(plans[s], start=1):
                t0 = time.perf_counter()
                status, body = await call("127.0.0.1", port, "POST", f"/sessions/load{s}/events", {"item": item})
                latencies.append(time.perf_counter() - t0)
                if status != 200:
                    failures += 1
                    break
                answers[s, n] = body["recommendations"]  # type: ignore[index]
                cached += bool(body["cached"])  # type: ignore[index]

    t0 = time.perf_counter()
    await asyncio.gather(*(one_at_a_time() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    differ = 0
    for (s, n), got in answers.items():
        status, want = await call("127.0.0.1", port, "POST", "/recommend", {"history": plans[s][:n]})
        same = status == 200 and [r["item"] for r in got] == [r["item"] for r in want["items"]]  # type: ignore[index]
        differ += not (same and np.allclose([r["score"] for r in got], [r["score"] for r in want["items"]],  # type: ignore[index]
                                            atol=1e-4, rtol=0))
    ms = np.array(latencies) * 1e3
    return {"sessions": len(plans), "events": len(latencies), "concurrency": concurrency, "failures": failures,
            "cached_events": cached, "differ_from_recommend": differ, "events_per_s": len(latencies) / wall,
            "event_ms_p50": float(np.median(ms)), "event_ms_p99": float(np.percentile(ms, 99)),
            "recommend_checks": len(answers), "metrics": await _counted(port)}


async def _counted(port: int) -> dict[str, int]:
    """What the service's /metrics counts of the answered events and /recommend calls, once every worker
    has written its counts (each does once a second): with several workers, those of all of them."""
    await asyncio.sleep(2.0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request_bytes("GET", "/metrics", None, "127.0.0.1"))
        text = (await read_response(reader))[1].decode()
    finally:
        writer.close()
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    requests = 'seqrec_requests_total{{method="POST",route="{}",status="200"}}'
    return {"events": int(samples.get(requests.format("/sessions/{id}/events"), 0)),
            "recommend": int(samples.get(requests.format("/recommend"), 0)), "workers": int(samples["seqrec_workers"])}


def bench_shared_sessions(run: Path, n_items: int, n_sessions: int, length: int,
                          counts: tuple[int, ...] = (1, 2)) -> dict[str, Any]:
    """Sessions through 1 and 2 worker processes (`counts`) that share one session store (exact top-10, torch)."""
    rng = np.random.default_rng(3)
    plans = [[f"i{i}" for i in np.minimum(rng.zipf(1.2, length), n_items)] for _ in range(n_sessions)]
    out: dict[str, Any] = {}
    for workers in counts:
        server = Server(run, WORK / "serve" / f"sessions-workers{workers}.log", workers=workers)
        try:
            out[str(workers)] = {"workers": workers, **asyncio.run(_session_events(server.port, plans, 8))}
            print(f"sessions, {workers} worker(s): {out[str(workers)]}", flush=True)
        finally:
            server.stop()
    return out


def bench_sessions(n_items: int, lengths: tuple[int, ...], repeats: int) -> dict[str, Any]:
    """Per event at history length L: the cached step against re-encoding the L items (both + top-10)."""
    torch.set_num_threads(1)
    max_len = max(lengths)
    torch.manual_seed(0)
    model = SASRec(SERVED_SASREC, n_items, max_len).eval()
    rec = Recommender(model, item_table(n_items, []), max_len)
    stores = {"kv_cache": Sessions(rec), "re_encode": Sessions(rec, kv_cache=False)}
    rng = np.random.default_rng(0)
    out = {}
    for L in lengths:
        times: dict[str, list[float]] = {m: [] for m in ("kv_cache", "re_encode", "encoder_kv_cache",
                                                          "encoder_re_encode")}
        for r in range(repeats):
            events = [f"i{i}" for i in rng.integers(1, n_items + 1, L)]
            idx = rec.to_indices(events)
            with torch.no_grad():  # the model alone: one cached step against the whole history
                _, cache = model.extend(torch.tensor([idx[:-1]]), None)
                t0 = time.perf_counter()
                model.extend(torch.tensor([idx[-1:]]), cache)
                times["encoder_kv_cache"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                rec.encode([idx])
                times["encoder_re_encode"].append(time.perf_counter() - t0)
            for mode in stores:
                sessions, sid = stores[mode], f"{L}-{r}"
                for item in events[:-1]:
                    sessions.add_event(sid, item)
                t0 = time.perf_counter()
                view = sessions.add_event(sid, events[-1])
                times[mode].append(time.perf_counter() - t0)
                assert view.cached == (mode == "kv_cache")
                sessions.end(sid)
        row = {m: float(np.median(v)) * 1e3 for m, v in times.items()}
        row["speedup"] = row["re_encode"] / row["kv_cache"]
        row["encoder_speedup"] = row["encoder_re_encode"] / row["encoder_kv_cache"]
        out[str(L)] = row
        print(f"session event at length {L}: {row}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a 2,000-item catalogue and a few requests (seconds)")
    p.add_argument("--out", type=Path, help="results file (default benchmarks/results/serve_load[_tiny].json)")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                   help="what to measure; the others are kept from the results file")
    p.add_argument("--against", type=Path, help="recommend part: another checkout's service measured in turn with "
                                                "this one's (each row's median of --repeats runs)")
    p.add_argument("--repeats", type=int, default=3, help="with --against: services of each checkout per row")
    p.add_argument("--change", help="with --against: what this checkout changes, in a sentence (the report's)")
    args = p.parse_args()
    if args.against is not None and ("recommend" not in args.parts or not args.change):
        p.error("--against measures the recommend part (--parts recommend ...) and needs --change")
    n_items = 2_000 if args.tiny else 100_000
    n_requests, cap = (200, 20.0) if args.tiny else (4_000, 60.0)
    n_add = 20 if args.tiny else 1_000
    # worker counts of the shared-catalogue and shared-session parts: tiny runs the 2 workers only (what one
    # process does is in the live and sessions parts, and in tests/test_serve.py)
    counts = (2,) if args.tiny else (1, 2)
    work = WORK / "serve"
    titles = real_titles(50 if args.tiny else 1_000)
    sasrec_run, unisrec_run = work / f"sasrec-{n_items}", work / f"unisrec-{n_items}"
    out = args.out or RESULTS / ("serve_load_tiny.json" if args.tiny else "serve_load.json")
    results = json.loads(out.read_text()) if out.is_file() else {}
    results.update({"machine": machine(), "n_items": n_items, "tiny": args.tiny,
                    "setup": "seqrec serve, 1 torch thread, top-10 from the index named in each row; loopback "
                             "load generator (benchmarks/loadgen.py)"})
    if "recommend" in args.parts or "floor" in args.parts:  # the floor on the service of the last row
        build_sasrec(sasrec_run, n_items, 50)
        against = args.against is not None and "recommend" in args.parts
        rows = ROWS if "recommend" in args.parts and not against else ROWS[-1:]
        served = [(name, bench_recommend(sasrec_run, n_items, n_requests, cap, index, engine,
                                         recommend="recommend" in args.parts and not against,
                                         floor="floor" in args.parts and (name, index, engine) == ROWS[-1]))
                  for name, index, engine in rows] if not against or "floor" in args.parts else []
        if "recommend" in args.parts and not against:
            results["recommend"] = {name: r["recommend"] for name, r in served}
            results.pop("recommend_against", None)  # (measured apart from these rows)
        if against:
            results["recommend"], results["recommend_against"] = bench_recommend_against(
                sasrec_run, n_items, n_requests, cap, args.against.resolve(), args.repeats, args.change)
        if "floor" in args.parts:
            results["floor"] = served[-1][1]["floor"]
    if "fast_path" in args.parts:
        build_sasrec(sasrec_run, n_items, 50)
        results["fast_path"] = bench_fast_path(sasrec_run, n_items, n_requests, cap, 1 if args.tiny else 5)
    if "start" in args.parts:
        build_sasrec(sasrec_run, n_items, 50)
        results["start"] = bench_start(sasrec_run, 1 if args.tiny else 3)
    if "live" in args.parts:
        build_unisrec(unisrec_run, n_items, titles)
        for key, index, engine in LIVE_ROWS:
            results[key] = bench_live(unisrec_run, n_items, titles, n_add, 1_000_000, 600.0, index, engine)
    if "workers" in args.parts:
        build_unisrec(unisrec_run, n_items, titles)
        # tiny: the restarts that replay the log only (a start with no log is every other part's)
        results["workers"] = bench_workers(unisrec_run, n_items, titles, n_add, 1 if args.tiny else 3, counts,
                                           baseline=not args.tiny)
    if "deletes" in args.parts:
        build_sasrec(sasrec_run, n_items, 50)
        for key, index in DELETE_ROWS:
            results[key] = bench_deletes(sasrec_run, n_items, 600 if args.tiny else 30_000, 600.0, index)
    if "shared_sessions" in args.parts:
        build_sasrec(sasrec_run, n_items, 50)
        results["shared_sessions"] = bench_shared_sessions(sasrec_run, n_items, 16 if args.tiny else 200,
                                                           10 if args.tiny else 30, counts)
    if "sessions" in args.parts:
        results["sessions"] = bench_sessions(n_items, (10, 50) if args.tiny else (10, 50, 200),
                                             3 if args.tiny else 20)
    measured = results.setdefault("measured_at", {})  # parts run apart ran on different days: say which
    measured.update({part: {"commit": results["machine"]["commit"], "date": time.strftime("%Y-%m-%d"),
                            "cpu_model": results["machine"]["cpu_model"]} for part in args.parts})
    write_result(out, results)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
