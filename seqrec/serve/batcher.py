"""Dynamic batching of concurrent requests: one model thread, one forward pass per batch.

The event loop parses and checks requests while the model thread computes; whatever requests
arrived during one batch form the next (up to `max_batch`). At concurrency 1 a request waits for
nothing; at concurrency C the encoder and the top-k search run once for up to C histories, which
costs little more than one, so throughput grows with load instead of latency growing with it.
All model work of the service (batches, sessions, similar items) runs on the same thread, so it
never competes with itself for the cores.

Bounded: beyond `max_queue` waiting requests a new one is refused at once (`Overloaded`, a 503 with
Retry-After) instead of joining a queue whose wait only grows; a request whose client has gone
(its future cancelled) is dropped from a batch before the model runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from seqrec.errors import SeqrecError
from seqrec.serve.recommender import Recommendation, Recommender

T = TypeVar("T")


@dataclass
class Job:
    history: list[int]
    events: dict[str, np.ndarray]
    k: int
    exclude_seen: bool
    future: asyncio.Future[list[Recommendation]]


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
        if len(self._pending) >= self.max_queue:
            self.refused += 1
            raise Overloaded(f"{len(self._pending)} requests are waiting for the model (at most {self.max_queue}); "
                             "retry shortly")
        future: asyncio.Future[list[Recommendation]] = asyncio.get_running_loop().create_future()
        self._pending.append(Job(history, events, k, exclude_seen, future))
        if not self._draining:
            self._draining = True
            self._task = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                jobs, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                jobs = [j for j in jobs if not j.future.done()]  # a client that went away cancels its future
                if not jobs:
                    continue
                self.batches, self.batched = self.batches + 1, self.batched + len(jobs)
                try:
                    results = await self.run(self.rec.recommend_indices, [j.history for j in jobs],
                                             [j.events for j in jobs], [j.k for j in jobs],
                                             [j.exclude_seen for j in jobs])
                except asyncio.CancelledError:  # shutting down: no request is left waiting forever
                    for job in [*jobs, *self._pending]:
                        if not job.future.done():
                            job.future.set_exception(RuntimeError("the service is shutting down"))
                    self._pending = []
                    raise
                except Exception:
                    results = None
                if results is None:  # one job's error must not fail the others: each alone tells its own
                    for job in jobs:
                        await self._one(job)
                    continue
                for job, recs in zip(jobs, results, strict=True):
                    if not job.future.done():
                        job.future.set_result(recs)
        finally:
            self._draining = False

    async def _one(self, job: Job) -> None:
        try:
            recs = await self.run(self.rec.recommend_indices, [job.history], [job.events], [job.k],
                                  [job.exclude_seen])
            job.future.set_result(recs[0])
        except Exception as exc:  # handed to the request that caused it
            if not job.future.done():
                job.future.set_exception(exc)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
