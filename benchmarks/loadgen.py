"""A bounded HTTP/1.1 load generator for loopback services: C keep-alive connections, each sending
its requests back to back, until a fixed number of requests is done or a time cap passes.

Raw asyncio streams, one pre-built request per body, so the client costs a few microseconds per
request and leaves the machine to the server. Latency is measured per request, send to last byte.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LoadResult:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, float]:
        lat = np.array(self.latencies) * 1e3
        return {"requests": self.sent, "ok": self.ok, "failed": self.failed, "seconds": self.seconds,
                "requests_per_s": self.sent / self.seconds if self.seconds else 0.0,
                "p50_ms": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
                "p90_ms": float(np.percentile(lat, 90)) if len(lat) else float("nan"),
                "p99_ms": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
                "max_ms": float(lat.max()) if len(lat) else float("nan"),
                "statuses": {str(k): v for k, v in sorted(self.statuses.items())}}


def request_bytes(method: str, path: str, body: object | None, host: str = "127.0.0.1") -> bytes:
    payload = b"" if body is None else json.dumps(body).encode()
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: keep-alive\r\n\r\n")
    return head.encode() + payload


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = next((int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")), 0)
    return status, await reader.readexactly(length)


async def _connection(host: str, port: int, next_request: Callable[[], bytes | None], result: LoadResult,
                      deadline: float) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline:
            req = next_request()
            if req is None:
                return
            t0 = time.perf_counter()
            writer.write(req)
            result.sent += 1
            try:
                status, _ = await read_response(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                result.failed += 1
                return
            result.latencies.append(time.perf_counter() - t0)
            result.statuses[status] = result.statuses.get(status, 0) + 1
            if status < 400:
                result.ok += 1
            else:
                result.failed += 1
    finally:
        writer.close()


async def run_load(host: str, port: int, requests: Sequence[bytes], concurrency: int, n_requests: int,
                   time_cap_s: float, stop: Callable[[], bool] | None = None) -> LoadResult:
    """Send `n_requests` (cycling through `requests`) over `concurrency` connections, stopping at the cap
    (or once `stop()` is true)."""
    result = LoadResult()
    counter = iter(range(n_requests))

    def next_request() -> bytes | None:
        i = next(counter, None)
        return None if i is None or (stop is not None and stop()) else requests[i % len(requests)]

    t0 = time.perf_counter()
    await asyncio.gather(*(_connection(host, port, next_request, result, t0 + time_cap_s)
                           for _ in range(concurrency)))
    result.seconds = time.perf_counter() - t0
    return result


async def call(host: str, port: int, method: str, path: str, body: object | None = None) -> tuple[int, object]:
    """One request on its own connection -> (status, parsed JSON)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request_bytes(method, path, body, host))
        status, payload = await read_response(reader)
        return status, json.loads(payload) if payload else None
    finally:
        writer.close()
