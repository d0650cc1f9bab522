"""Request accounting for the service: counts and latencies in Prometheus text format (the request
middleware that feeds them, logs each request and caps body sizes is `seqrec.serve.middleware`).

With several worker processes (`seqrec serve --workers N`) each counts the requests it answers and
writes what it has counted to a folder they share (`share`), once a second and when it stops; a
scrape of /metrics, whichever worker answers it, adds its own live counts to the others' last
writes, so the numbers are the service's: counters and histogram buckets summed over the workers
(a worker that has exited still counts, so totals never fall), latency quantiles over the recent
requests of the running workers, gauges the largest over them.
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import fcntl
import json
import logging
import os
import secrets
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("seqrec.serve")

ROUTES = ("/recommend", "/recommend/batch", "/items", "/health", "/metrics", "/", "/docs", "/openapi.json")
QUANTILES = (0.5, 0.9, 0.99)
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # seconds; + Inf
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})
HEARTBEAT_S = 10.0  # a worker with nothing new still rewrites its file this often (its gauges move)


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20  # 1 MiB


def route_of(path: str, method: str = "GET") -> str:
    """A bounded label for a path: ids in the path are replaced by {id}."""
    if path in ROUTES or (path == "/items/remove" and method == "POST"):  # (DELETE /items/remove: an item's id)
        return path
    parts = path.strip("/").split("/")
    if parts[0] in ("items", "similar") and len(parts) == 2:
        return f"/{parts[0]}/{{id}}"
    if parts[0] == "sessions" and len(parts) == 2:
        return "/sessions/{id}"
    if parts[0] == "sessions" and len(parts) == 3 and parts[2] == "events":
        return "/sessions/{id}/events"
    return "other"  # anything a client makes up shares one label


@dataclass
class Counted:
    """What one process has counted: requests by (method, route, status); per route the latency sum,
    the histogram's (non-cumulative) bucket counts and the recent latencies; the service's own values
    (a name ending in _total is a counter, any other a gauge). `running`: the process is alive."""

    counts: dict[tuple[str, str, int], int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, list[int]] = field(default_factory=dict)
    recent: dict[str, np.ndarray] = field(default_factory=dict)
    own: dict[str, float] = field(default_factory=dict)
    running: bool = True
    folded: list[str] = field(default_factory=list)  # (the exited workers' sum) files added, not yet removed

    def to_json(self, pid: int | None) -> str:
        return json.dumps({"pid": pid, "counts": [[*key, n] for key, n in self.counts.items()],
                           "seconds": self.seconds, "buckets": self.buckets, "own": self.own,
                           "recent": {r: base64.b64encode(v.astype("<f4").tobytes()).decode()
                                      for r, v in self.recent.items()}, "folded": self.folded})

    @classmethod
    def from_json(cls, text: str) -> Counted:
        raw = json.loads(text)
        return cls(counts={(m, r, int(s)): int(n) for m, r, s, n in raw["counts"]},
                   seconds={r: float(v) for r, v in raw["seconds"].items()},
                   buckets={r: _buckets(v) for r, v in raw["buckets"].items()},
                   recent={r: np.frombuffer(base64.b64decode(v), dtype="<f4").astype(np.float64)
                           for r, v in raw["recent"].items()},
                   own={k: float(v) for k, v in raw["own"].items()},
                   running=raw["pid"] is not None and _running(int(raw["pid"])), folded=list(raw.get("folded", [])))

    def add(self, other: Counted) -> None:
        """Fold an exited worker's counts in: its counters and histogram (not its latencies or gauges)."""
        for key, n in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        for route, sec in other.seconds.items():
            self.seconds[route] = self.seconds.get(route, 0.0) + sec
        for route, b in other.buckets.items():
            self.buckets[route] = [x + y for x, y in zip(self.buckets.get(route, [0] * len(b)), b, strict=True)]
        for name, value in other.own.items():
            if name.endswith("_total"):
                self.own[name] = self.own.get(name, 0.0) + value


def _buckets(counts: list[Any]) -> list[int]:
    if len(counts) != len(BUCKETS) + 1:  # another version's buckets: not added to these
        raise ValueError(f"{len(counts)} histogram buckets, expected {len(BUCKETS) + 1}")
    return [int(n) for n in counts]


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class Metrics:
    """Counts requests; `render` gives the Prometheus text. `own`: the service's own values at the time
    of asking. `share`: the folder the worker processes of one service share (None: one process)."""

    def __init__(self, window: int = 10_000, own: Callable[[], dict[str, float]] | None = None,
                 share: str | Path | None = None, interval_s: float = 1.0) -> None:
        self.counts: defaultdict[tuple[str, str, int], int] = defaultdict(int)
        self.latencies: defaultdict[str, deque[float]] = defaultdict(lambda: deque(maxlen=window))
        self.seconds: defaultdict[str, float] = defaultdict(float)  # route -> the latency of all its requests
        self.buckets: defaultdict[str, list[int]] = defaultdict(lambda: [0] * (len(BUCKETS) + 1))
        self.window, self.own = window, own or dict
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self.share = None if share is None else Path(share)
        self.interval_s = interval_s
        self._file: Path | None = None  # this process's file in `share`, named when it starts (after a fork)
        self._observed = self._written = 0
        self._failing = False  # the last write failed (said once, until one succeeds)
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.counts[(method, route, status)] += 1
            self.latencies[route].append(seconds)
            self.seconds[route] += seconds
            self.buckets[route][bisect.bisect_left(BUCKETS, seconds)] += 1
            self._observed += 1

    def counted(self) -> Counted:
        """This process's counts now."""
        with self._lock:
            mine = Counted(counts=dict(self.counts), seconds=dict(self.seconds),
                           buckets={r: list(b) for r, b in self.buckets.items()},
                           recent={r: np.array(v) for r, v in self.latencies.items()})
        mine.own = dict(self.own())
        return mine

    # -- sharing between the worker processes of one service
    def start(self) -> None:
        """Write this process's counts to the shared folder every `interval_s` (nothing without one)."""
        if self.share is None or self._writer is not None:
            return
        self._file = self.share / f"worker-{os.getpid()}-{secrets.token_hex(4)}.json"
        with contextlib.suppress(OSError):  # a folder that cannot be made is said by the write
            self._file.parent.mkdir(parents=True, exist_ok=True)
        self._try_write()  # a failure is logged, not raised: the worker serves all the same
        self._writer = threading.Thread(target=self._write_loop, name="seqrec-metrics", daemon=True)
        self._writer.start()

    def close(self) -> None:
        """Stop writing, after one last write: a stopped worker's requests still count."""
        self._stop.set()
        if self._writer is not None:
            self._writer.join()
            self._writer = None
            self._try_write()

    def write(self) -> None:
        if self._file is not None:
            self._write(self.counted())

    def _write(self, mine: Counted) -> None:
        assert self._file is not None
        observed = sum(sum(b) for b in mine.buckets.values())  # what `mine` holds, not what came since
        with self._write_lock:  # the writer thread and a scrape
            tmp = self._file.with_suffix(".tmp")
            tmp.write_text(mine.to_json(os.getpid()))
            os.replace(tmp, self._file)  # a reader sees the last whole file, never half of one
            self._written = max(self._written, observed)

    def _try_write(self) -> None:
        """`write`, with any failure logged (once until a write succeeds again), never raised: the writer
        thread goes on, a shutdown runs its other steps."""
        try:
            self.write()
        except Exception as exc:  # a full disk, the folder gone at shutdown, the session store busy, ...
            if not self._failing:
                log.warning("metrics: could not write %s: %s", self._file, exc)
            self._failing = True
            return
        self._failing = False

    def _write_loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.interval_s):
            if self._observed != self._written or time.monotonic() - last >= HEARTBEAT_S:
                self._try_write()
                last = time.monotonic()

    def _others(self) -> list[Counted]:
        """The other workers' last counts; those of workers that have exited are added into one file of
        their sum (so that deploys, each replacing every worker, do not leave a file per worker to read at
        every scrape), under the folder's lock so that no scrape sees a worker both in the sum and apart."""
        if self.share is None:
            return []
        running, exited, leftover = [], [], []
        with self._folder_lock():
            retired_path = self.share / "retired.json"
            retired = Counted(running=False)
            with contextlib.suppress(FileNotFoundError):
                retired = Counted.from_json(retired_path.read_text())
            for path in sorted(self.share.glob("worker-*.json")):
                if path == self._file:
                    continue
                try:
                    part = Counted.from_json(path.read_text())
                except (OSError, ValueError, KeyError, TypeError) as exc:  # removed meanwhile, or not ours
                    log.debug("metrics: skipped %s: %s", path, exc)
                    continue
                if part.running:
                    running.append(part)
                elif path.name in retired.folded:  # in the sum already (a stop came before its removal)
                    leftover.append(path)
                else:
                    exited.append((path, part))
            if exited or retired.folded:
                for _, part in exited:
                    retired.add(part)
                retired.folded = [path.name for path, _ in exited]
                tmp = retired_path.with_suffix(".tmp")
                tmp.write_text(retired.to_json(None))
                os.replace(tmp, retired_path)
                for path in [path for path, _ in exited] + leftover:
                    path.unlink(missing_ok=True)
        return running + ([retired] if retired.counts or retired.own else [])

    @contextlib.contextmanager
    def _folder_lock(self) -> Iterator[None]:
        assert self.share is not None
        fd = os.open(self.share / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def render(self) -> str:
        """Prometheus text exposition of this process's counts, and with a shared folder those of the
        other workers as they last wrote them. What it shows of its own it writes first, so that the next
        scrape, whichever worker answers it, never counts less (Prometheus takes a fall for a reset)."""
        mine = self.counted()
        if self._file is not None:
            try:
                self._write(mine)
            except Exception as exc:  # shown all the same; the writer thread says why it cannot write
                log.debug("metrics: could not write %s: %s", self._file, exc)
        return render([mine, *self._others()], self.window)


def render(parts: list[Counted], window: int) -> str:
    """Request counts, latency quantiles (the recent requests), a latency histogram, and the service's
    own values, over the processes' `parts` (the first is the one answering, always running)."""
    counts: defaultdict[tuple[str, str, int], int] = defaultdict(int)
    seconds: defaultdict[str, float] = defaultdict(float)
    buckets: defaultdict[str, np.ndarray] = defaultdict(lambda: np.zeros(len(BUCKETS) + 1, dtype=np.int64))
    recent: defaultdict[str, list[np.ndarray]] = defaultdict(list)
    for part in parts:
        for key, n in part.counts.items():
            counts[key] += n
        for route, s in part.seconds.items():
            seconds[route] += s
        for route, b in part.buckets.items():
            buckets[route] += np.asarray(b, dtype=np.int64)
        for route, v in part.recent.items() if part.running else ():  # a stopped worker's are not recent
            recent[route].append(v)
    by_route: defaultdict[str, int] = defaultdict(int)
    for (_, route, _), n in counts.items():
        by_route[route] += n
    lines = ["# HELP seqrec_requests_total Requests served, by method, route and status.",
             "# TYPE seqrec_requests_total counter"]
    for (method, route, status), n in sorted(counts.items()):
        lines.append(f'seqrec_requests_total{{method="{method}",route="{route}",status="{status}"}} {n}')
    lines += [f"# HELP seqrec_request_latency_seconds Latency per route: quantiles of the last {window:,} "
              "requests of each running worker, count and sum of all",
              "# TYPE seqrec_request_latency_seconds summary"]
    for route in sorted(by_route):
        values = np.concatenate(recent[route]) if recent[route] else np.zeros(0)
        for q in QUANTILES if len(values) else ():  # none: only workers that have stopped served the route
            lines.append(f'seqrec_request_latency_seconds{{route="{route}",quantile="{q}"}} '
                         f"{float(np.quantile(values, q)):.6f}")
        lines.append(f'seqrec_request_latency_seconds_count{{route="{route}"}} {by_route[route]}')
        lines.append(f'seqrec_request_latency_seconds_sum{{route="{route}"}} {seconds[route]:.6f}')
    lines += ["# HELP seqrec_request_duration_seconds Latency per route, a histogram of all requests.",
              "# TYPE seqrec_request_duration_seconds histogram"]
    for route in sorted(buckets):
        cumulative = np.cumsum(buckets[route])
        for le, n in zip([*map(str, BUCKETS), "+Inf"], cumulative, strict=True):
            lines.append(f'seqrec_request_duration_seconds_bucket{{route="{route}",le="{le}"}} {n}')
        lines.append(f'seqrec_request_duration_seconds_count{{route="{route}"}} {cumulative[-1]}')
        lines.append(f'seqrec_request_duration_seconds_sum{{route="{route}"}} {seconds[route]:.6f}')
    running = [p for p in parts if p.running]
    for name in dict.fromkeys(name for p in parts for name in p.own):  # in the answering worker's order
        if name.endswith("_total"):  # Prometheus: counters end in _total; summed over every worker
            lines += [f"# TYPE {name} counter", f"{name} {_number(sum(p.own.get(name, 0) for p in parts))}"]
        else:  # a gauge: the largest over the running workers (they share the sessions, follow one catalogue)
            lines += [f"# TYPE {name} gauge", f"{name} {_number(max(p.own.get(name, 0) for p in running))}"]
    lines += ["# HELP seqrec_workers Worker processes of this service that are running.",
              "# TYPE seqrec_workers gauge", f"seqrec_workers {len(running)}"]
    return "\n".join(lines) + "\n"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))
