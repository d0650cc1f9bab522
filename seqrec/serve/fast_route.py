"""A JSON route answered beneath the framework: the request path that carries a service's load.

FastAPI gives every request a stack of middleware, routing, dependency solving, a JSON parse into
Python objects and a validation of those objects; under load on two cores that is as much of a
`/recommend` request's CPU as the model's work. A `FastRoute` serves one route from the request
middleware instead: it reads the body, validates it straight from its bytes against the route's
pydantic model (`model_validate_json`), runs the same handler the framework route runs, and sends the
handler's response. Errors are the framework's, byte for byte: a body the model does not accept is
replayed to the framework route, which answers it as it always has, and an error the handler raises
goes to the exception handler the app registered for it. So the route, its OpenAPI entry and its
error answers stay FastAPI's; only the successful path is shorter.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

ASGI = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
Handler = Callable[[Request, Any], Response | Awaitable[Response]]


class FastRoute:
    """`handle(model.model_validate_json(body))` for requests with a JSON body; `handlers`: the app's
    exception handlers by class (a live mapping: handlers registered later count)."""

    def __init__(self, model: type[BaseModel], handle: Callable[[Any], Awaitable[Response]],
                 handlers: Mapping[Any, Handler]) -> None:
        self.model, self.handle, self.handlers = model, handle, handlers

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any, framework: ASGI) -> None:
        body, end = await _body(receive)
        try:
            if end is not None or not _json(scope):
                raise ValueError("not a JSON body")  # the framework says what it makes of it
            request = self.model.model_validate_json(body)
        except (ValueError, ValidationError):  # a ValidationError is a ValueError; named for the reader
            await framework(scope, _replay(body, end, receive), send)
            return
        try:
            response = await self.handle(request)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            answer = handler(Request(scope), exc)  # the app's handlers are coroutines; a plain one answers at once
            response = await answer if inspect.isawaitable(answer) else answer
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Handler | None:
        """The handler Starlette's exception middleware would pick: the first class of the error's MRO."""
        for cls in type(exc).__mro__:
            if cls in self.handlers:
                return self.handlers[cls]
        return None


def _json(scope: dict[str, Any]) -> bool:
    """Whether the request declares a JSON body (application/json or a +json type), as FastAPI reads it."""
    for name, value in scope.get("headers") or ():
        if name == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            return kind == b"application/json" or (kind.startswith(b"application/") and kind.endswith(b"+json"))
    return False


async def _body(receive: Any) -> tuple[bytes, dict[str, Any] | None]:
    """The request's body, and the message that cut it short (the client went away) or None."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _replay(body: bytes, end: dict[str, Any] | None, receive: Any) -> Callable[[], Awaitable[dict[str, Any]]]:
    """A `receive` that hands the framework the messages already read, then the request's own `receive`."""
    queued = [{"type": "http.request", "body": body, "more_body": end is not None}, *([end] if end else [])]

    async def replayed() -> dict[str, Any]:
        return queued.pop(0) if queued else await receive()

    return replayed
