"""Batches as array slicing: no Python loop per interaction.

Sequences are left-padded (0 = PAD) so the most recent item is always the last
column; a batch is trimmed to its longest row, and position ids count from the
right (`max_len - Lb + arange(Lb)`), so trimming never changes what a model sees.

Training learns from every position at once: a user's training events
`s_0..s_{t-1}` give inputs `s_0..s_{t-2}` and next-item targets `s_1..s_{t-1}`.
Histories longer than `max_len` are cut into windows from the most recent end,
so every training event is a target once per epoch. With `stride = max_len`
(the default) the windows are consecutive, and the first targets of a window see
little history; with a smaller stride each window still reads `max_len` inputs
but takes the loss only on its last `stride` targets, so every target but a
user's first `max_len - stride` sees at least `max_len - stride` earlier events,
at `max_len / stride` times the compute.

Event-level side features (`events`: name -> (E,) raw values over the flat event
array, see `seqrec.data.features`) are sliced exactly like the input items and
travel in `Batch.events`, aligned with `Batch.items`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from seqrec.data.dataset import PreparedDataset


@dataclass(frozen=True)
class Batch:
    """items (B, L) inputs; targets (B, L) next items, 0 where none (training);
    target (B,) the held-out item (evaluation); users (B,) user indices;
    events name -> (B, L) raw event feature values of the input positions (NaN = missing);
    seen (2, M) (row, item) pairs of every item of each user before the target, not only the last L
    (evaluation that filters seen items; a list, so one long history costs its length only)."""

    items: torch.Tensor
    targets: torch.Tensor | None = None
    target: torch.Tensor | None = None
    users: torch.Tensor | None = None
    events: dict[str, torch.Tensor] | None = None
    seen: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> Batch:
        """This batch on `device`. To CUDA through pinned memory, so that the copy queues behind the
        running step instead of waiting for it (a copy from pageable memory synchronises the stream)."""
        pin = torch.device(device).type == "cuda"

        def moved(t: torch.Tensor) -> torch.Tensor:
            return (t.pin_memory() if pin and t.device.type == "cpu" else t).to(device, non_blocking=True)

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else moved(t)

        events = None if self.events is None else {k: moved(v) for k, v in self.events.items()}
        return replace(self, items=moved(self.items), targets=move(self.targets), target=move(self.target),
                       users=move(self.users), events=events, seen=move(self.seen))


def training_windows(
    offsets: np.ndarray, train_end: np.ndarray, max_len: int, stride: int = 0, shift: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(context, start, end, user) of every window, as flat indices into the item array.

    A window's targets are events [start, end), at most `stride` of them (0 = max_len);
    its inputs are [context - 1, end - 1), at most `max_len` of them. `shift` (per user, in
    [0, stride)) moves the window boundaries: a user's `shift` most recent targets get a window
    of their own (with full context) and the others are cut from there, so a jittered epoch
    still makes every training event a target exactly once.
    """
    stride = stride or max_len
    if not 1 <= stride <= max_len:
        raise ValueError(f"stride must be in [1, max_len={max_len}], got {stride}")
    first_target = offsets[:-1] + 1
    last = offsets[:-1] + train_end  # one past the last training event
    n_targets = np.maximum(last - first_target, 0)
    lead = np.zeros_like(n_targets) if shift is None else np.minimum(shift, n_targets)
    has_lead = (lead > 0).astype(n_targets.dtype)
    n_windows = has_lead - (-(n_targets - lead) // stride)  # the lead window + ceil(rest / stride)
    user = np.repeat(np.arange(len(n_targets)), n_windows)
    # window j of a user (j = 0 most recent) ends at last, then at last - lead - (j - has_lead) * stride
    j = np.arange(n_windows.sum()) - np.repeat(np.cumsum(n_windows) - n_windows, n_windows)
    is_lead = (j == 0) & (has_lead[user] == 1)
    end = np.where(is_lead, last[user], last[user] - lead[user] - (j - has_lead[user]) * stride)
    start = np.where(is_lead, end - lead[user], np.maximum(end - stride, first_target[user]))
    context = np.maximum(end - max_len, first_target[user])
    return context, start, end, user


def _gather_events(events: Mapping[str, np.ndarray] | None, start: np.ndarray, end: np.ndarray,
                   shift: int = 0) -> dict[str, torch.Tensor] | None:
    """Each event feature sliced like the items: name -> (B, Lb) float32."""
    if not events:
        return None
    return {k: torch.from_numpy(_gather(v, start, end, shift).astype(np.float32)) for k, v in events.items()}


def _gather(
    flat: np.ndarray, start: np.ndarray, end: np.ndarray, shift: int = 0, width: int | None = None
) -> np.ndarray:
    """Left-padded (B, width) matrix of flat[start+shift : end+shift] per row; 0 = PAD (width: the longest row)."""
    if width is None:
        width = int((end - start).max()) if len(start) else 0
    idx = end[:, None] - width + np.arange(width)[None, :]
    keep = idx >= start[:, None]
    return np.where(keep, flat[np.where(keep, idx + shift, 0)], 0)


def bucketed_order(lengths: np.ndarray, batch_size: int, rng: np.random.Generator, pool: int = 50) -> list[np.ndarray]:
    """Shuffle, then sort by length inside pools of `pool` batches, then shuffle the batches.

    Rows of similar length share a batch, so trimming removes most padding.
    """
    order = rng.permutation(len(lengths))
    batches: list[np.ndarray] = []
    span = batch_size * pool
    for lo in range(0, len(order), span):
        chunk = order[lo : lo + span]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


class TrainBatches:
    """Iterable over one epoch of next-item training batches.

    `jitter`: each epoch draws every user's window boundaries afresh (`training_windows`'s
    `shift`), so a target is not always at the same place of the same window and sees a
    different amount of history from one epoch to the next; the cost per epoch is unchanged.
    """

    def __init__(self, data: PreparedDataset, max_len: int, batch_size: int, seed: int, stride: int = 0,
                 events: Mapping[str, np.ndarray] | None = None, jitter: bool = False) -> None:
        self.items = data.items.astype(np.int64)
        self.events = events
        self._windows = (data.offsets, data.train_end(), max_len, stride)
        self.stride, self.jitter = stride or max_len, jitter
        self.context, self.start, self.end, self.user = training_windows(*self._windows)
        self.batch_size = batch_size
        self.rng = np.random.default_rng(seed)

    @property
    def n_targets(self) -> int:
        return int((self.end - self.start).sum())

    def __len__(self) -> int:
        """Batches in the coming epoch (with jitter, read off a copy of the generator)."""
        start = self.start
        if self.jitter:
            peek = np.random.Generator(type(self.rng.bit_generator)())
            peek.bit_generator.state = self.rng.bit_generator.state
            start = self._jittered(peek)[1]
        return -(-len(start) // self.batch_size)

    def _jittered(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        shift = rng.integers(0, self.stride, size=len(self._windows[1]))
        return training_windows(*self._windows, shift=shift)

    def __iter__(self) -> Iterator[Batch]:
        if self.jitter:
            self.context, self.start, self.end, self.user = self._jittered(self.rng)
        for rows in bucketed_order(self.end - self.context, self.batch_size, self.rng):
            c, s, e = self.context[rows], self.start[rows], self.end[rows]
            inputs = _gather(self.items, c, e, shift=-1)
            yield Batch(
                items=torch.from_numpy(inputs),
                targets=torch.from_numpy(_gather(self.items, s, e, width=inputs.shape[1])),
                users=torch.from_numpy(self.user[rows]),
                events=_gather_events(self.events, c, e, shift=-1),  # aligned with the inputs
            )


def eval_batches(data: PreparedDataset, which: str, max_len: int, batch_size: int,
                 events: Mapping[str, np.ndarray] | None = None, seen: bool = False) -> Iterator[Batch]:
    """Batches of (last `max_len` events before the target, target) for "valid" or "test"; with `seen`,
    every item before the target as well (`Batch.seen`)."""
    users, pos = data.eval_positions(which)
    flat = data.items.astype(np.int64)
    tpos = data.offsets[users] + pos
    start = np.maximum(tpos - max_len, data.offsets[users])
    for lo in range(0, len(users), batch_size):
        sl = slice(lo, lo + batch_size)
        yield Batch(
            items=torch.from_numpy(_gather(flat, start[sl], tpos[sl])),
            target=torch.from_numpy(flat[tpos[sl]]),
            users=torch.from_numpy(users[sl]),
            events=_gather_events(events, start[sl], tpos[sl]),
            seen=_pairs(flat, data.offsets[users[sl]], tpos[sl]) if seen else None,
        )


def ragged_index(start: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices start[r], ..., start[r] + lengths[r] - 1 of every row r, one after the other."""
    return np.repeat(start - (np.cumsum(lengths) - lengths), lengths) + np.arange(int(lengths.sum()))


def _pairs(flat: np.ndarray, start: np.ndarray, end: np.ndarray) -> torch.Tensor:
    """(2, M) (row, item) for the items flat[start[r]:end[r]] of each row r, rows ascending."""
    lengths = end - start
    rows = np.repeat(np.arange(len(lengths)), lengths)
    return torch.from_numpy(np.stack([rows, flat[ragged_index(start, lengths)]]).astype(np.int64))


def history_batch(histories: list[list[int]], max_len: int,
                  events: Sequence[Mapping[str, np.ndarray]] | None = None) -> Batch:
    """Left-padded batch from lists of item indices (most recent last); `events[i]` holds row i's
    event feature values, one per history item."""
    lengths = np.array([min(len(h), max_len) for h in histories], dtype=np.int64)
    if lengths.max(initial=0) == 0:  # only empty histories: one padding column
        return Batch(items=torch.zeros((len(histories), 1), dtype=torch.long))
    end = np.cumsum(lengths)
    rows = zip(histories, lengths, strict=True)
    flat = np.concatenate([np.asarray(h[len(h) - n :], dtype=np.int64) for h, n in rows])
    flat_events = None
    if events:
        flat_events = {k: np.concatenate([np.asarray(ev[k], dtype=np.float64)[len(h) - n :]
                                          for h, n, ev in zip(histories, lengths, events, strict=True)])
                       for k in events[0]}
    start = end - lengths
    return Batch(items=torch.from_numpy(_gather(flat, start, end)), events=_gather_events(flat_events, start, end))
