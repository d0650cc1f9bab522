"""The service's request middleware: one log line per request (with the client's X-Request-ID, echoed),
its count and latency in `Metrics`, and a cap on request body size. A plain ASGI middleware (no
per-request task or body copy), so it costs microseconds; it also hands the routes of `fast` their
requests beneath the framework (`seqrec.serve.fast_route`)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from starlette.exceptions import HTTPException

from seqrec.serve.metrics import METHODS, Limits, Metrics, route_of

log = logging.getLogger("seqrec.serve")


class RequestMiddleware:
    """`fast`: routes answered here, beneath the framework, by (method, path) (`seqrec.serve.fast_route`);
    each gets the framework's app to hand on what it does not answer itself."""

    def __init__(self, app: Any, metrics: Metrics, limits: Limits,
                 fast: dict[tuple[str, str], Any] | None = None) -> None:
        self.app, self.metrics, self.limits, self.fast = app, metrics, limits, fast or {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500
        limit = self.limits.max_body_bytes

        headers = dict(scope.get("headers") or [])
        rid = _request_id(headers.get(b"x-request-id"))

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if rid is not None:  # the answer carries the client's id back
                    message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", rid)]}
            await send(message)

        declared = headers.get(b"content-length")
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

            route = self.fast.get((scope["method"], scope["path"]))
            if route is not None:
                await route(scope, counted, send_status, self.app)
            else:
                await self.app(scope, counted, send_status)
        except BodyTooLarge:
            await _reject(send_status, 413, f"request body over {limit} bytes")
        finally:
            seconds = time.perf_counter() - t0
            route = route_of(scope["path"], scope["method"])
            method = scope["method"] if scope["method"] in METHODS else "other"  # a bounded label set
            self.metrics.observe(method, route, status, seconds)
            if rid is None:
                log.info("%s %s %d %.2fms", scope["method"], scope["path"], status, seconds * 1e3)
            else:
                log.info("%s %s %d %.2fms id=%s", scope["method"], scope["path"], status, seconds * 1e3,
                         rid.decode("ascii"))


def _request_id(value: bytes | None) -> bytes | None:
    """A client's X-Request-ID, if it is one to log and echo: 1 to 128 visible ASCII characters."""
    if value is None or not 0 < len(value) <= 128 or not all(0x21 <= c <= 0x7E for c in value):
        return None
    return value


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
