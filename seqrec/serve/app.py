"""The HTTP service: a thin layer of typed requests and responses over one `Recommender`.

    POST   /recommend              top-k for a raw history          POST /recommend/batch   many histories
    POST   /items                  add or replace items by text     DELETE /items/{id}      stop recommending one
    GET    /items/{id}             one item                         GET  /items?q=          search by title
    GET    /similar/{id}?k=        items nearest an item            GET  /health, /metrics  (Prometheus text)
    POST   /sessions/{sid}/events  append an event, get the new top-k (KV cache)
    GET    /sessions/{sid}, DELETE /sessions/{sid}
    GET    /                       the web page

Every error is a 4xx with a JSON body {"error": "..."} that names the problem; the OpenAPI schema
is at /openapi.json and /docs. Requests are logged one line each, with their latency (and the client's
X-Request-ID, which the answer echoes).

With a write token (`seqrec serve --write-token-file`), the requests that change the catalogue (POST
/items, POST /items/remove, DELETE /items/{id}) must carry it as `Authorization: Bearer TOKEN`; the
others stay open, as recommendations are for whoever can reach the service.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
from collections import Counter
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException

from seqrec.errors import SeqrecError
from seqrec.serve.batcher import MAX_QUEUE, Batcher, Overloaded
from seqrec.serve.catalogue import UnknownItem
from seqrec.serve.catalogue_log import CatalogueLogBroken, CatalogueLogCarried
from seqrec.serve.fast_route import FastRoute
from seqrec.serve.metrics import Limits, Metrics
from seqrec.serve.middleware import RequestMiddleware
from seqrec.serve.recommender import Recommendation, Recommender
from seqrec.serve.schemas import (
    BatchRequest,
    BatchResponse,
    EventRequest,
    Health,
    Item,
    ItemInfo,
    ItemsRequest,
    ItemsResponse,
    RecommendRequest,
    RecommendResponse,
    RemoveRequest,
    RemoveResponse,
    SessionResponse,
    SimilarResponse,
)
from seqrec.serve.session_store import SessionEnded, SessionFull, SessionLimit
from seqrec.serve.sessions import Sessions

log = logging.getLogger("seqrec.serve")


class Unauthorized(SeqrecError):
    """A catalogue change without the service's write token (a 401)."""


# how the catalogue-changing routes read the write token (module level: their annotations name it)
_BEARER = HTTPBearer(auto_error=False, description="the service's write token (seqrec serve --write-token-file)")


def _items(recs: list[Recommendation]) -> list[Item]:
    return [Item(item=r.item, score=r.score, title=r.title) for r in recs]


def _recommendations(recs: list[Recommendation], skipped: list[str] | None = None) -> Response:
    """A `RecommendResponse` body written straight to JSON: the hot path skips building and then
    re-validating pydantic models (a measurable share of a request's CPU under load)."""
    body = {"items": [{"item": r.item, "score": r.score, "title": r.title} for r in recs], "skipped": skipped or []}
    return Response(json.dumps(body, allow_nan=False, separators=(",", ":")).encode(), media_type="application/json")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        if err.get("type") == "json_invalid":  # loc is ("body", character position)
            at, why = err.get("loc", ("", "?"))[-1], err.get("ctx", {}).get("error", "")
            parts.append(f"body: malformed JSON at character {at}" + (f" ({why})" if why else ""))
            continue
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        if err.get("type") in ("too_short", "string_too_short") and err.get("input") == "":
            parts.append(f"{where or 'body'}: empty; give at least one character")  # not pydantic's "1 item"
            continue
        parts.append(f"{where or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def _unparsed(cause: BaseException | None) -> str:
    """Why a body the framework could not parse was refused (the parser's error is the HTTPException's cause):
    JSON nested deeper than the parser goes, an integer too long to convert, or not UTF-8 JSON text."""
    if isinstance(cause, RecursionError):
        return "the body's JSON is nested too deeply to read"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        return "the body holds an integer with too many digits to read (more than 4300)"
    return "the body could not be read as JSON text: it must be UTF-8 encoded JSON"


def _framework_message(request: Request, exc: HTTPException) -> str | None:
    """What the framework's own bare errors mean here: a route's 404 / 405, a body it could not decode
    (None for the endpoints' own errors)."""
    path = request.url.path
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        return _unparsed(exc.__cause__)
    if exc.status_code == 405 and exc.detail == "Method Not Allowed":
        return f"{request.method} is not an operation on {path} (the API is listed at /docs)"
    if exc.status_code != 404 or exc.detail != "Not Found":
        return None
    message = f"no endpoint {request.method} {path} (the API is listed at /docs)"
    if path.startswith("/sessions/"):
        message += "; a session id is one path segment: it cannot hold '/'"
    return message


def create_app(rec: Recommender, *, max_sessions: int = 10_000, session_events: int = 1_000,
               session_ttl_s: float = 1800.0, limits: Limits | None = None, session_store: str | None = None,
               catalogue_writable: bool = True, max_queue: int = MAX_QUEUE,
               metrics_folder: str | None = None, fast_path: bool = True,
               write_token: str | None = None) -> FastAPI:
    """The service over `rec`. `max_queue`: /recommend requests that may wait for the model; more are
    answered 503 with Retry-After. `session_store`: the sessions' database file, which the worker
    processes serving one port share (None: in this process's memory). `catalogue_writable` is off when
    they share no catalogue log (each would hold its own catalogue). `metrics_folder`: where those
    workers pool their request counts, so that /metrics is the service's (None: this process's).
    `fast_path`: POST /recommend answered beneath the framework (`seqrec.serve.fast_route`; off: by
    FastAPI's routing alone, which answers the same). `write_token`: what the catalogue changes must carry
    as a bearer token (None: they need none)."""
    # /docs from the Swagger UI files packaged with fastapi-offline: FastAPI's own page loads them from a CDN,
    # which a service on a network without internet access cannot reach (a blank page)
    app = FastAPIOffline(title="seqrec", version=_version(),
                         description="Sequential recommendation: top-k next items for a history of raw item ids.")
    sessions = Sessions(rec, max_sessions, session_events, session_ttl_s, store=session_store)
    batcher = Batcher(rec, max_queue=max_queue)  # all model work on its one thread; /recommend requests batched

    def own() -> dict[str, float]:  # the service's values in /metrics (a name ending in _total: a counter)
        return {"seqrec_catalogue_items": rec.catalogue.n_active, "seqrec_sessions": len(sessions),
                "seqrec_index_rebuilding": int(rec.catalogue.retriever.rebuilding),
                "seqrec_recommend_batches_total": batcher.batches,
                "seqrec_recommend_batched_requests_total": batcher.batched,
                "seqrec_recommend_refused_total": batcher.refused}

    metrics = Metrics(own=own, share=metrics_folder)
    app.state.recommender, app.state.sessions, app.state.metrics, app.state.batcher = rec, sessions, metrics, batcher
    app.router.on_startup.append(metrics.start)
    app.router.on_shutdown.append(metrics.close)
    app.router.on_shutdown.append(batcher.close)
    app.router.on_shutdown.append(rec.close_log)
    fast: dict[tuple[str, str], FastRoute] = {}
    app.add_middleware(RequestMiddleware, metrics=metrics, limits=limits or Limits(), fast=fast)

    writer = [Depends(_writer_check(write_token))] if write_token else []  # the routes that change the catalogue

    @app.exception_handler(Unauthorized)
    async def unauthorized(_: Request, exc: Unauthorized) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=401, headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(UnknownItem)
    async def unknown(_: Request, exc: UnknownItem) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(Overloaded)
    async def overloaded(_: Request, exc: Overloaded) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(CatalogueLogBroken)
    async def log_broken(_: Request, exc: CatalogueLogBroken) -> JSONResponse:
        return _error(503, str(exc))

    @app.exception_handler(CatalogueLogCarried)
    async def log_carried(_: Request, exc: CatalogueLogCarried) -> JSONResponse:  # a deploy: workers on the
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "1"})  # new run next

    @app.exception_handler(SessionLimit)
    async def too_many(_: Request, exc: SessionLimit) -> JSONResponse:
        wait = exc.retry_after_s  # when the oldest idle session expires (never, with an infinite ttl)
        retry = {"Retry-After": str(max(1, math.ceil(wait)))} if math.isfinite(wait) else None
        return JSONResponse({"error": str(exc)}, status_code=429, headers=retry)

    @app.exception_handler(SessionFull)
    @app.exception_handler(SessionEnded)
    async def conflict(_: Request, exc: SeqrecError) -> JSONResponse:
        return _error(409, str(exc))

    @app.exception_handler(SeqrecError)
    async def bad_input(_: Request, exc: SeqrecError) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message = _validation_message(exc)
        kind = request.headers.get("content-type", "")
        if request.method in ("POST", "PUT") and "json" not in kind:  # curl -d sends a form unless told
            message += f" (the body must be JSON, sent with content-type: application/json; got {kind or 'none'!r})"
        detail = [{k: v for k, v in err.items() if k != "input"}  # not the whole (perhaps huge) input again
                  for err in exc.errors()[:5]]
        return JSONResponse({"error": message, "detail": jsonable_encoder(detail)}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _error(exc.status_code, _framework_message(request, exc) or str(exc.detail))

    async def recommend_one(req: RecommendRequest) -> Response:  # the route's work, framework or fast path
        rec.check_k(req.k)
        rec.check_event_names(list(req.events or {}))
        history, times, given, skipped = req.history, req.times, req.events, list[str]()
        if req.unknown == "skip":
            history, times, given, skipped = rec.drop_unknown(history, times, given)
        idx = rec.to_indices(history)
        events = rec.history_events(len(idx), times, given)
        if req.candidates is not None:  # exact scores of those items only: not a search, so not batched
            candidates = req.candidates
            if req.unknown == "skip":
                candidates, unknown = rec.catalogue.split_known(candidates)
                skipped += unknown
                if not candidates:
                    raise UnknownItem(f"no candidate is in the catalogue (skipped: {', '.join(map(repr, skipped))})")
            return _recommendations(await batcher.run(rec.recommend, history, req.k, req.exclude_seen,
                                                      candidates, times, given), skipped)
        return _recommendations(await batcher.recommend(idx, events, req.k, req.exclude_seen), skipped)

    @app.post("/recommend", response_model=RecommendResponse)
    async def recommend(req: RecommendRequest) -> Response:
        """Top-k items for one history of raw item ids (most recent last)."""
        return await recommend_one(req)

    if fast_path:
        fast["POST", "/recommend"] = FastRoute(RecommendRequest, recommend_one, app.exception_handlers)

    @app.post("/recommend/batch", response_model=BatchResponse)
    async def recommend_batch(req: BatchRequest) -> BatchResponse:
        """Top-k for many histories in one forward pass."""
        n = len(req.histories)
        histories, skipped, errors = list(req.histories), [list[str]() for _ in range(n)], list[str | None]([None] * n)
        if req.unknown == "skip":  # a history with no known id is answered by an error of its own
            for i, history in enumerate(req.histories):
                try:
                    histories[i], _, _, skipped[i] = rec.drop_unknown(history)
                except UnknownItem as exc:
                    histories[i], skipped[i], errors[i] = [], list(history), str(exc)
            if all(errors):
                raise UnknownItem(f"no history has a known item; histories.0: {errors[0]}")
        known = [h for h, e in zip(histories, errors, strict=True) if not e]
        answered = iter(await batcher.run(rec.recommend_many, known, req.k, req.exclude_seen))
        return BatchResponse(results=[[] if e else _items(next(answered)) for e in errors], skipped=skipped,
                             errors=errors)

    @app.post("/items", response_model=ItemsResponse, dependencies=writer)
    def add_items(req: ItemsRequest) -> ItemsResponse:
        """Add items by text, or replace the text of known ones (text models only). They are
        recommendable by the next request."""
        _writable(catalogue_writable)
        texts = {it.id: it.text for it in req.items}
        if len(texts) != len(req.items):
            twice = next(i for i, n in Counter(it.id for it in req.items).items() if n > 1)
            raise SeqrecError(f"item id {twice!r} is given more than once")
        added, replaced = rec.add_items(texts, {it.id: it.title for it in req.items if it.title is not None})
        return ItemsResponse(added=added, replaced=replaced, **rec.catalogue.counts())

    @app.post("/items/remove", response_model=RemoveResponse, dependencies=writer)
    def remove_items(req: RemoveRequest) -> RemoveResponse:
        """Stop recommending many items at once (they stay usable in histories): all of them, or none
        if an id is unknown (a 404 naming it)."""
        _writable(catalogue_writable)
        rec.remove_items(req.ids)
        return RemoveResponse(removed=req.ids, **rec.catalogue.counts())

    @app.delete("/items/{item_id:path}", response_model=ItemInfo, dependencies=writer)
    def remove_item(item_id: Annotated[str, Path(max_length=256)]) -> ItemInfo:
        """Stop recommending an item (it stays usable in histories)."""
        _writable(catalogue_writable)
        rec.remove_items([item_id])
        return _info(rec, item_id)

    @app.get("/items/{item_id:path}", response_model=ItemInfo)
    async def get_item(item_id: Annotated[str, Path(max_length=256)]) -> ItemInfo:
        return _info(rec, item_id)

    @app.get("/items", response_model=list[ItemInfo])
    def search_items(q: Annotated[str, Query(max_length=200)] = "",
                           limit: Annotated[int, Query(ge=1, le=100)] = 20) -> list[ItemInfo]:
        """Items whose id or title contains `q` (case-insensitive), for pickers. A scan of the catalogue:
        a plain `def`, so FastAPI runs it in its threadpool and it never holds up the event loop."""
        return [_info(rec, raw) for raw in _find(rec, q, limit)]

    @app.get("/similar/{item_id:path}", response_model=SimilarResponse)
    async def similar(item_id: Annotated[str, Path(max_length=256)],
                      k: Annotated[int, Query(ge=1, le=1000)] = 10) -> SimilarResponse:
        """The items the model scores highest for a state equal to this item's vector."""
        return SimilarResponse(items=_items(await batcher.run(rec.similar, item_id, k)))

    @app.post("/sessions/{session_id}/events", response_model=SessionResponse)
    async def add_event(session_id: Annotated[str, Path(min_length=1, max_length=128, pattern="^[^/]+$")],
                        req: EventRequest) -> SessionResponse:
        """Append one event to a server-side session (created on its first event); returns the new top-k."""
        return _session(await batcher.session_event(sessions, session_id, req.item, req.k, req.exclude_seen,
                                                     req.time, req.values))

    @app.get("/sessions/{session_id}", response_model=SessionResponse)
    async def get_session(session_id: Annotated[str, Path(min_length=1, max_length=128)],
                          k: Annotated[int, Query(ge=1, le=1000)] = 10) -> SessionResponse:
        try:
            return _session(await batcher.run(sessions.view, session_id, k))
        except KeyError:
            raise HTTPException(404, f"no session {session_id!r} (it may have expired)") from None

    @app.delete("/sessions/{session_id}")
    async def end_session(session_id: Annotated[str, Path(min_length=1, max_length=128)]) -> dict[str, Any]:
        if not await batcher.run(sessions.end, session_id):  # on the model thread, between two events
            raise HTTPException(404, f"no session {session_id!r}")
        return {"ended": session_id}

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        journal = rec.catalogue_log
        status = "ok" if journal is None or journal.error is None else "degraded"
        return Health(status=status, model=rec.model.name, **rec.catalogue.counts(),
                      index=rec.catalogue.retriever.kind, index_rebuilding=rec.catalogue.retriever.rebuilding,
                      sessions=len(sessions), takes_text=rec.takes_text,
                      catalogue_changes=None if journal is None else journal.changes,
                      catalogue_log_error=None if journal is None else journal.error,
                      run=rec.run, version=rec.version, pid=os.getpid(), writes_need_token=bool(write_token))

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> str:
        return metrics.render()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> str:
        return resources.files("seqrec.serve").joinpath("static/index.html").read_text()

    return app


def _writer_check(token: str) -> Any:
    """The dependency of the catalogue-changing routes: the request's bearer token must be `token`."""
    expected = token.encode()

    def check(request: Request,
              credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]) -> None:
        if credentials is None:
            raise Unauthorized(f"{request.method} {request.url.path} changes the catalogue: this service takes such "
                               "changes with its write token only, sent as the header 'Authorization: Bearer TOKEN'")
        if not hmac.compare_digest(credentials.credentials.encode(), expected):
            raise Unauthorized("the bearer token is not this service's write token")

    return check


def _writable(on: bool) -> None:
    if not on:
        raise HTTPException(409, "worker processes without a catalogue log cannot change the catalogue: start the "
                                 "service with --catalogue-log FILE (or --workers 1) to add or remove items")


def _info(rec: Recommender, raw: str) -> ItemInfo:
    (idx,) = rec.catalogue.lookup([raw])
    return ItemInfo(item=raw, title=rec.catalogue.title(idx), recommendable=rec.catalogue.is_active(idx))


def _find(rec: Recommender, q: str, limit: int) -> list[str]:
    q = q.casefold().strip()
    cat = rec.catalogue
    out = []
    for i in range(cat.n_items):
        raw, title = cat.raw_ids[i], cat.titles[i]
        if not q or q in raw.casefold() or (title is not None and q in title.casefold()):
            out.append(raw)
            if len(out) == limit:
                break
    return out


def _session(view: Any) -> SessionResponse:
    return SessionResponse(session_id=view.session_id, n_events=view.n_events, items=view.items,
                           recommendations=_items(view.recommendations), cached=view.cached)


def _version() -> str:
    from seqrec import __version__

    return __version__
