"""Dynamic batching of concurrent requests: one model thread, one forward pass per batch.

The event loop parses and checks requests while the model thread computes; whatever requests
arrived during one batch form the next (up to `max_batch`). At concurrency 1 a request waits for
nothing; at concurrency C the encoder and the top-k search run once for up to C histories, which
costs little more than one, so throughput grows with load instead of latency growing with it.
Session events join the same batches: each session takes its own step from its cache, then one
search serves the histories and the events together (the search over the catalogue is most of an
event's time). All model work of the service (batches, sessions, similar items) runs on the same
thread, so it never competes with itself for the cores.

Bounded: beyond `max_queue` waiting requests a new one is refused at once (`Overloaded`, a 503 with
Retry-After) instead of joining a queue whose wait only grows; a request whose client has gone
(its future cancelled) is dropped from a batch before the model runs.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from seqrec.errors import SeqrecError
from seqrec.serve.recommender import NOTHING_LEFT, Recommendation, Recommender
from seqrec.serve.sessions import Sessions, SessionView, Step

T = TypeVar("T")


@dataclass
class Job:
    """A checked history (/recommend), or an event of `sessions`: `step` takes it up to the search."""

    history: list[int]
    events: dict[str, np.ndarray]
    k: int
    exclude_seen: bool
    future: asyncio.Future[Any]
    sessions: Sessions | None = None
    step: Callable[[], Step] | None = None


MAX_QUEUE = 1024  # /recommend requests that may wait for the model by default


class Overloaded(SeqrecError):
    """More requests are waiting for the model than the service queues."""


class Batcher:
    def __init__(self, rec: Recommender, max_batch: int = 64, max_queue: int = MAX_QUEUE) -> None:
        self.rec, self.max_batch, self.max_queue = rec, max_batch, max_queue
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="seqrec-model")
        self._pending: list[Job] = []
        self._draining = False
        self._task: asyncio.Task[None] | None = None  # held: the loop keeps only a weak reference
        self.batches = self.batched = 0  # forward passes run, and requests answered by them
        self.refused = 0  # requests refused because the queue was full

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run other model work (sessions, batch requests) on the model thread."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def recommend(self, history: list[int], events: dict[str, np.ndarray], k: int,
                        exclude_seen: bool) -> list[Recommendation]:
        """Top-k for one checked history, computed in a batch with the requests around it."""
        future: asyncio.Future[list[Recommendation]] = asyncio.get_running_loop().create_future()
        return await self._submit(Job(history, events, k, exclude_seen, future))

    async def session_event(self, sessions: Sessions, sid: str, item: str, k: int, exclude_seen: bool,
                            time_s: float | None, values: dict[str, float] | None) -> SessionView:
        """`Sessions.add_event`, its search run in a batch with the requests around it."""
        future: asyncio.Future[SessionView] = asyncio.get_running_loop().create_future()
        step = functools.partial(sessions.step, sid, item, k, exclude_seen, time_s, values)
        return await self._submit(Job([], {}, k, exclude_seen, future, sessions, step))

    async def _submit(self, job: Job) -> Any:
        if len(self._pending) >= self.max_queue:
            self.refused += 1
            raise Overloaded(f"{len(self._pending)} requests are waiting for the model (at most {self.max_queue}); "
                             "retry shortly")
        self._pending.append(job)
        if not self._draining:
            self._draining = True
            self._task = asyncio.create_task(self._drain())
        return await job.future

    async def _drain(self) -> None:
        try:
            while self._pending:
                jobs, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                jobs = [j for j in jobs if not j.future.done()]  # a client that went away cancels its future
                if not jobs:
                    continue
                self.batches, self.batched = self.batches + 1, self.batched + len(jobs)
                try:
                    results = await self.run(self._batch, jobs)
                except asyncio.CancelledError:  # shutting down: no request is left waiting forever
                    for job in [*jobs, *self._pending]:
                        if not job.future.done():
                            job.future.set_exception(RuntimeError("the service is shutting down"))
                    self._pending = []
                    raise
                except Exception as exc:  # the model thread is gone (shut down): every request is told
                    results = [exc] * len(jobs)
                for job, result in zip(jobs, results, strict=True):
                    if job.future.done():
                        continue
                    if isinstance(result, Exception):  # handed to the request that caused it
                        job.future.set_exception(result)
                    else:
                        job.future.set_result(result)
        finally:
            self._draining = False

    @torch.no_grad()
    def _batch(self, jobs: list[Job]) -> list[Any]:
        """On the model thread: every job's state (one encoder pass for the histories, each session event's
        own step), then one search for all. A job's error is its result; it fails no other job."""
        out: list[Any] = [None] * len(jobs)
        rows = self._history_steps(jobs, [i for i, j in enumerate(jobs) if j.step is None], out)
        for i, job in enumerate(jobs):
            if job.step is not None:
                try:
                    rows.append((i, job.step()))
                except Exception as exc:
                    out[i] = exc
        for (i, step), recs in zip(rows, self._search([s for _, s in rows]), strict=True):
            sessions = jobs[i].sessions
            try:
                if isinstance(recs, Exception):
                    raise recs
                if sessions is not None:
                    out[i] = sessions.finish(step, recs)
                elif not recs:
                    raise SeqrecError(NOTHING_LEFT)
                else:
                    out[i] = recs
            except Exception as exc:
                out[i] = exc
                if sessions is not None:  # an event whose answer failed is taken back
                    sessions.retract(step.sid, step.token, step.pos)
        return out

    def _history_steps(self, jobs: list[Job], which: list[int], out: list[Any]) -> list[tuple[int, Step]]:
        """The histories of jobs `which` in one encoder pass (one at a time if the pass fails)."""
        if not which:
            return []
        try:
            events = [jobs[i].events for i in which]
            states, batch = self.rec.encode([jobs[i].history for i in which], events if events[0] else None)
        except Exception as exc:
            if len(which) == 1:
                out[which[0]] = exc
                return []
            return [row for i in which for row in self._history_steps(jobs, [i], out)]
        return [(i, Step("", jobs[i].history, states[r], batch.items[r], jobs[i].k, jobs[i].exclude_seen, False))
                for r, i in enumerate(which)]

    def _search(self, steps: list[Step]) -> list[list[Recommendation] | Exception]:
        """Top-k for every step in one search (each alone if it fails); windows left-padded to one width."""
        if not steps:
            return []
        try:
            width = max(len(s.window) for s in steps)
            device = steps[0].state.device
            windows = torch.stack([F.pad(s.window.to(device), (width - len(s.window), 0)) for s in steps])
            return list(self.rec.top_k(torch.stack([s.state for s in steps]), windows, [s.k for s in steps],
                                       [s.excluded for s in steps]))
        except Exception as exc:
            if len(steps) == 1:
                return [exc]
            return [r for s in steps for r in self._search([s])]

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
