"""Server-side sessions: a history that grows one event at a time, with the model's cache.

For a model that can extend a cached history exactly (`model.can_extend()`: causal Transformers
with positions counted from the start keep each layer's keys and values; GRU4Rec keeps its
recurrent state), an event costs one position of compute. A history longer than max_len has no
exact cache (the window slides, every position moves), nor has a model without one (BERT4Rec,
positions counted from the end): those events re-encode the last max_len items. Either way the
top-k after n events equals `Recommender.recommend` on the same n-item history.

An event may carry its time (seconds) and event feature values (e.g. a rating): a model with event
features encodes the session with them, as `recommend` does with `times` and `events`; what an
event leaves out is missing (NaN) at that position. Such models re-encode at every event (their
inputs are not cached).

Bounded: at most `max_sessions` live sessions, each at most `max_events` events; a session idle
for `ttl_s` seconds is dropped.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from seqrec.errors import SeqrecError
from seqrec.serve.recommender import NOTHING_LEFT, Recommendation, Recommender


class SessionLimit(SeqrecError):
    """Too many live sessions (the service answers 429, Retry-After when the oldest idle one expires)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SessionFull(SeqrecError):
    """A session has reached its length bound (409: it takes no more events; start a new one)."""


@dataclass
class Session:
    items: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # one per item, NaN where the event gave none
    values: dict[str, list[float]] = field(default_factory=dict)  # feature -> one per item, NaN where absent
    cache: Any = None  # the model's cache of `items` (None: empty, not cacheable, or dropped)
    generation: int = 0  # the catalogue's generation the cache was computed under
    touched: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class SessionView:
    session_id: str
    n_events: int
    items: list[str]
    recommendations: list[Recommendation]
    cached: bool  # whether this event was served from the cache (one position of compute)


class Sessions:
    def __init__(self, recommender: Recommender, max_sessions: int = 10_000, max_events: int = 1_000,
                 ttl_s: float = 1800.0, kv_cache: bool = True) -> None:
        """`kv_cache=False` re-encodes the history at every event (what a service without one does)."""
        self.rec, self.kv_cache = recommender, kv_cache
        self.max_sessions, self.max_events, self.ttl_s = max_sessions, max_events, ttl_s
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Live sessions: idle ones are dropped first (so /health and /metrics never count them)."""
        with self._lock:
            self._expire(time.monotonic())
            return len(self._sessions)

    def _expire(self, now: float) -> None:
        while self._sessions:
            sid, oldest = next(iter(self._sessions.items()))
            if now - oldest.touched < self.ttl_s:
                break
            del self._sessions[sid]

    def _get(self, sid: str, create: bool) -> Session:
        with self._lock:
            now = time.monotonic()
            self._expire(now)
            session = self._sessions.get(sid)
            if session is None:
                if not create:
                    raise KeyError(sid)
                if len(self._sessions) >= self.max_sessions:
                    oldest = next(iter(self._sessions.values())).touched if self._sessions else now
                    raise SessionLimit(f"too many live sessions ({self.max_sessions}); "
                                       "end one (DELETE /sessions/{id}) or wait for idle ones to expire",
                                       retry_after_s=oldest + self.ttl_s - now)
                session = self._sessions[sid] = Session()
            session.touched = now
            self._sessions.move_to_end(sid)
            return session

    def end(self, sid: str) -> bool:
        with self._lock:
            return self._sessions.pop(sid, None) is not None

    def view(self, sid: str, k: int = 10, exclude_seen: bool = False) -> SessionView:
        """The session's events and its current top-k (re-encoded; no event is added)."""
        session = self._get(sid, create=False)
        with session.lock:
            if not session.items:
                return SessionView(sid, 0, [], [], False)
            states, batch = self.rec.encode([session.items], self._events(session.times, session.values))
            return self._answer(sid, session, states, batch.items, k, exclude_seen, False)

    def _events(self, times: list[float], values: Mapping[str, list[float]]) -> list[dict[str, Any]] | None:
        """The event features of a session's history, as `Recommender.recommend` builds them (a NaN time
        makes that event's gap and hour missing); None for a model without event features."""
        if not self.rec.model.event_feature_names():
            return None
        return [self.rec.history_events(len(times), times, values)]

    @torch.no_grad()
    def add_event(self, sid: str, item: str, k: int = 10, exclude_seen: bool = False, time_s: float | None = None,
                  values: Mapping[str, float] | None = None) -> SessionView:
        """Append one event (a raw item id; its time in seconds and event feature values, if any) to the
        session (created if new) -> the new top-k."""
        (idx,) = self.rec.to_indices([item])
        self.rec.check_k(k)
        if values:
            self.rec.check_event_names(list(values))
        session = self._get(sid, create=True)
        with session.lock:
            if len(session.items) >= self.max_events:
                raise SessionFull(f"session {sid!r} has reached {self.max_events} events; start a new one")
            # the session changes only once the model has run
            items = [*session.items, idx]
            times = [*session.times, math.nan if time_s is None else float(time_s)]
            n, given = len(session.items), dict(values or {})
            feats = {name: [*session.values.get(name, [math.nan] * n), float(given.get(name, math.nan))]
                     for name in {*session.values, *given}}
            model, cat = self.rec.model, self.rec.catalogue
            device = cat.vectors.device
            if not (self.kv_cache and model.can_extend() and len(items) <= self.rec.max_len):
                # beyond max_len the window slides: every position moves
                states, batch = self.rec.encode([items], self._events(times, feats))
                session.items, session.times, session.values, session.cache = items, times, feats, None
                return self._answer(sid, session, states, batch.items, k, exclude_seen, False)
            # an item's text replaced since the cache was made changes its keys and values: rebuild. The
            # generation is read before the model runs, so a replacement during it forces the next rebuild.
            generation = cat.generation
            fresh = session.cache is not None and session.generation == generation
            states, cache = model.extend(torch.tensor([[idx]] if fresh else [items], device=device),
                                         session.cache if fresh else None)
            session.items, session.times, session.values = items, times, feats
            session.cache, session.generation = cache, generation
            window = torch.tensor([items], device=device)
            return self._answer(sid, session, states, window, k, exclude_seen, fresh or len(items) == 1)

    def _answer(self, sid: str, session: Session, states: torch.Tensor, window: torch.Tensor, k: int,
                exclude_seen: bool, cached: bool) -> SessionView:
        recs = self.rec.top_k(states, window, k, [session.items if exclude_seen else None])[0]
        if not recs:  # as `Recommender.recommend` answers the same history
            raise SeqrecError(NOTHING_LEFT)
        raw = self.rec.catalogue.raw_ids
        return SessionView(sid, len(session.items), [raw[i - 1] for i in session.items], recs, cached)
