"""Request accounting for the service: one log line per request, counts and latency percentiles in
Prometheus text format, and a cap on request body size. A plain ASGI middleware (no per-request
task or body copy), so it costs microseconds."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.exceptions import HTTPException

log = logging.getLogger("seqrec.serve")

ROUTES = ("/recommend", "/recommend/batch", "/items", "/health", "/metrics", "/", "/docs", "/openapi.json")
QUANTILES = (0.5, 0.9, 0.99)
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20  # 1 MiB


def route_of(path: str) -> str:
    """A bounded label for a path: ids in the path are replaced by {id}."""
    if path in ROUTES:
        return path
    parts = path.strip("/").split("/")
    if parts[0] in ("items", "similar") and len(parts) == 2:
        return f"/{parts[0]}/{{id}}"
    if parts[0] == "sessions" and len(parts) == 2:
        return "/sessions/{id}"
    if parts[0] == "sessions" and len(parts) == 3 and parts[2] == "events":
        return "/sessions/{id}/events"
    return "other"  # anything a client makes up shares one label


class Metrics:
    def __init__(self, window: int = 10_000) -> None:
        self.counts: defaultdict[tuple[str, str, int], int] = defaultdict(int)
        self.latencies: defaultdict[str, deque[float]] = defaultdict(lambda: deque(maxlen=window))
        self.seconds: defaultdict[str, float] = defaultdict(float)  # route -> the latency of all its requests
        self.window = window
        self._lock = threading.Lock()

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.counts[(method, route, status)] += 1
            self.latencies[route].append(seconds)
            self.seconds[route] += seconds

    def render(self, own: dict[str, float]) -> str:
        """Prometheus text exposition: request counts, latency quantiles (recent requests), and the
        service's own values (a name ending in _total is a counter, any other a gauge)."""
        lines = ["# HELP seqrec_requests_total Requests served, by method, route and status.",
                 "# TYPE seqrec_requests_total counter"]
        with self._lock:
            counts = dict(self.counts)
            lat = {route: np.array(v) for route, v in self.latencies.items()}
            seconds = dict(self.seconds)
        for (method, route, status), n in sorted(counts.items()):
            lines.append(f'seqrec_requests_total{{method="{method}",route="{route}",status="{status}"}} {n}')
        lines += [f"# HELP seqrec_request_latency_seconds Latency per route: quantiles of the last {self.window:,} "
                  "requests, count and sum of all",
                  "# TYPE seqrec_request_latency_seconds summary"]
        for route, values in sorted(lat.items()):
            for q in QUANTILES:
                lines.append(f'seqrec_request_latency_seconds{{route="{route}",quantile="{q}"}} '
                             f"{float(np.quantile(values, q)):.6f}")
            count = sum(n for (_, r, _), n in counts.items() if r == route)
            lines.append(f'seqrec_request_latency_seconds_count{{route="{route}"}} {count}')
            lines.append(f'seqrec_request_latency_seconds_sum{{route="{route}"}} {seconds[route]:.6f}')
        for name, value in own.items():
            kind = "counter" if name.endswith("_total") else "gauge"  # Prometheus: counters end in _total
            lines += [f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"


class RequestMiddleware:
    def __init__(self, app: Any, metrics: Metrics, limits: Limits) -> None:
        self.app, self.metrics, self.limits = app, metrics, limits

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500
        limit = self.limits.max_body_bytes

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        declared = dict(scope.get("headers") or []).get(b"content-length")
        try:
            if declared is not None and declared.isdigit() and int(declared) > limit:
                await _reject(send_status, 413, f"request body over {limit} bytes")
                return
            received = 0

            async def counted() -> dict[str, Any]:
                nonlocal received
                message = await receive()
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
                return dict(message)

            await self.app(scope, counted, send_status)
        except BodyTooLarge:
            await _reject(send_status, 413, f"request body over {limit} bytes")
        finally:
            seconds = time.perf_counter() - t0
            route = route_of(scope["path"])
            method = scope["method"] if scope["method"] in METHODS else "other"  # a bounded label set
            self.metrics.observe(method, route, status, seconds)
            log.info("%s %s %d %.2fms", scope["method"], scope["path"], status, seconds * 1e3)


class BodyTooLarge(HTTPException):
    """Raised while the app reads a body without a Content-Length that outgrows the limit; an
    HTTPException so that FastAPI's body reader passes it on as a 413 instead of a parse error."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over {limit} bytes")


async def _reject(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
