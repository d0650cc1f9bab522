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

The events themselves live in a `SessionStore` (seqrec.serve.session_store), which bounds them: at
most `max_sessions` live sessions, each at most `max_events` events; a session idle for `ttl_s`
seconds is dropped. With a store file that several processes share (`seqrec serve --workers N`), an
event may reach any of them: a process whose cache lacks events another took extends it by those
(one position each), so the answer stays that of the whole history.
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
from seqrec.serve.session_store import Event, SessionEnded, SessionStore, event


@dataclass
class Cached:
    """What this process holds of one session start (`token`): the item indices of its first events
    and the model's cache of exactly those (None: empty, not cacheable, or dropped)."""

    token: str
    items: list[int] = field(default_factory=list)
    cache: Any = None
    generation: int = 0  # the catalogue's generation the cache was computed under
    touched: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class Step:
    """One event up to the search: the state after it and what the search needs."""

    sid: str
    items: list[int]  # the session's item indices up to this event
    state: torch.Tensor  # (D,)
    window: torch.Tensor  # (L,) the items the state has seen (the history bias reads them)
    k: int
    exclude_seen: bool
    cached: bool  # one position of compute
    token: str = ""  # the session start and the event's position in it (an event's step; not a view's)
    pos: int = -1

    @property
    def excluded(self) -> list[int] | None:
        return self.items if self.exclude_seen else None


@dataclass(frozen=True)
class SessionView:
    """A session after an event (or as it stands): its events' raw ids, oldest first, and its top-k."""

    session_id: str
    n_events: int
    items: list[str]
    recommendations: list[Recommendation]
    cached: bool  # whether this event was served from the cache (one position of compute)


class Sessions:
    """Sessions on a `Recommender`, an event at a time (what `POST /sessions/{sid}/events` runs):

        sessions = Sessions(Recommender.from_run("runs/ml"))
        sessions.add_event("alice", "50", k=5).recommendations   # after one event
        sessions.add_event("alice", "172", k=5)                  # after two; .cached: one position of compute
        sessions.view("alice"); sessions.end("alice")

    At most `max_sessions` live sessions of at most `max_events` events each; one idle for `ttl_s` seconds
    is dropped.
    """

    def __init__(self, recommender: Recommender, max_sessions: int = 10_000, max_events: int = 1_000,
                 ttl_s: float = 1800.0, kv_cache: bool = True, store: str | None = None) -> None:
        """`kv_cache=False` re-encodes the history at every event (what a service without one does);
        `store`: the session store file the worker processes share (None: in this process's memory)."""
        self.rec, self.kv_cache, self.ttl_s = recommender, kv_cache, ttl_s
        self.store = SessionStore(store, max_sessions, max_events, ttl_s)
        self._cached: OrderedDict[str, Cached] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Live sessions, in every process that shares the store."""
        return len(self.store)

    def _cached_for(self, sid: str, token: str) -> Cached:
        """This process's cache of the session start `token` (a fresh one for a new start); at most
        `max_sessions` are kept, the least recently used dropped first (they can be rebuilt)."""
        with self._lock:
            now = time.monotonic()
            while self._cached and now - next(iter(self._cached.values())).touched >= self.ttl_s:
                self._cached.popitem(last=False)
            cached = self._cached.get(sid)
            if cached is None or cached.token != token:
                cached = self._cached[sid] = Cached(token)
                if len(self._cached) > self.store.max_sessions:
                    self._cached.popitem(last=False)
            cached.touched = now
            self._cached.move_to_end(sid)
            return cached

    def end(self, sid: str) -> bool:
        """End the session (its events and cache dropped); whether it was there."""
        with self._lock:
            self._cached.pop(sid, None)
        return self.store.end(sid)

    @torch.no_grad()
    def view(self, sid: str, k: int = 10, exclude_seen: bool = False) -> SessionView:
        """The session's events and its current top-k (re-encoded; no event is added)."""
        token, n = self.store.touch(sid)
        events = self._events(sid, token, 0, n)
        items = self.rec.to_indices([e.item for e in events])
        states, batch = self.rec.encode([items], self._features(events))
        return self._answer(Step(sid, items, states[0], batch.items[0], k, exclude_seen, False))

    def _features(self, events: list[Event]) -> list[dict[str, Any]] | None:
        """The event features of a session's history, as `Recommender.recommend` builds them (a NaN time
        makes that event's gap and hour missing); None for a model without event features."""
        if not self.rec.model.event_feature_names():
            return None
        names = {name for e in events for name in e.values}
        values = {name: [e.values.get(name, math.nan) for e in events] for name in names}
        return [self.rec.history_events(len(events), [e.time for e in events], values)]

    def add_event(self, sid: str, item: str, k: int = 10, exclude_seen: bool = False, time_s: float | None = None,
                  values: Mapping[str, float] | None = None) -> SessionView:
        """Append one event (a raw item id; its time in seconds and event feature values, if any) to the
        session (created if new) -> the top-k after it."""
        step = self.step(sid, item, k, exclude_seen, time_s, values)
        try:
            return self._answer(step)
        except BaseException:
            self.retract(sid, step.token, step.pos)
            raise

    @torch.no_grad()
    def step(self, sid: str, item: str, k: int = 10, exclude_seen: bool = False, time_s: float | None = None,
             values: Mapping[str, float] | None = None) -> Step:
        """`add_event` up to the search: the event appended and the state after it (the service's batcher
        searches for several events, and histories, at once). If the state fails, the event is taken back."""
        (idx,) = self.rec.catalogue.lookup([item], " as the event's item")
        self.rec.check_k(k)
        if values:
            self.rec.check_event_names(list(values))
        token, pos = self.store.append(sid, event(item, time_s, values))  # the event counts from here
        try:
            return self._state(sid, token, pos, idx, k, exclude_seen)
        except BaseException:
            self.retract(sid, token, pos)
            raise

    def _state(self, sid: str, token: str, pos: int, idx: int, k: int, exclude_seen: bool) -> Step:
        cached = self._cached_for(sid, token)
        with cached.lock:
            known = cached.items[:pos]  # events before this one that other requests or processes took
            if len(known) < pos:
                known += self.rec.to_indices([e.item for e in self._events(sid, token, len(known), pos)])
            items = [*known, idx]
            model, cat = self.rec.model, self.rec.catalogue
            ahead = len(cached.items) > pos  # a later event of this session was answered first: leave its cache
            if not (self.kv_cache and model.can_extend() and len(items) <= self.rec.max_len):
                # beyond max_len the window slides: every position moves
                features = self._features(self._events(sid, token, 0, pos + 1)) if model.event_feature_names() \
                    else None
                states, batch = self.rec.encode([items], features)
                if not ahead:
                    cached.items, cached.cache = items, None
                return Step(sid, items, states[0], batch.items[0], k, exclude_seen, False, token, pos)
            # an item's text replaced since the cache was made changes its keys and values: rebuild. The
            # generation is read before the model runs, so a replacement during it forces the next rebuild.
            generation = cat.generation
            fresh = cached.cache is not None and cached.generation == generation and not ahead
            new = items[len(cached.items):] if fresh else items
            states, cache = model.extend(torch.tensor([new], device=cat.vectors.device),
                                         cached.cache if fresh else None)
            if not ahead:
                cached.items, cached.cache, cached.generation = items, cache, generation
            window = torch.tensor(items, device=cat.vectors.device)
            return Step(sid, items, states[0], window, k, exclude_seen, len(new) == 1, token, pos)

    def _events(self, sid: str, token: str, start: int, stop: int) -> list[Event]:
        """Events start..stop-1 of a session start, all of them or `SessionEnded`."""
        events = self.store.events(token, start, stop)
        if len(events) != stop - start:
            raise SessionEnded(f"session {sid!r} ended while this event was answered; start it again")
        return events

    def retract(self, sid: str, token: str, pos: int) -> None:
        """Take back event `pos` of the session start `token` (its answer failed): from the store while it is
        still the session's last, and from this process's cache of the session, which holds it."""
        with self._lock:
            cached = self._cached.get(sid)
            if cached is not None and cached.token == token:
                del self._cached[sid]
        self.store.retract(token, pos)

    def _answer(self, step: Step) -> SessionView:
        """One step's search, then its answer (the service's batcher searches for many steps at once)."""
        return self.finish(step, self.rec.top_k(step.state[None], step.window[None], step.k, [step.excluded])[0])

    def finish(self, step: Step, recs: list[Recommendation]) -> SessionView:
        """The answer to an event (or a view) from its step and the search's top-k."""
        if not recs:  # as `Recommender.recommend` answers the same history
            raise SeqrecError(NOTHING_LEFT)
        raw = self.rec.catalogue.raw_ids
        return SessionView(step.sid, len(step.items), [raw[i - 1] for i in step.items], recs, step.cached)
