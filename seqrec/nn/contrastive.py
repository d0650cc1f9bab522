"""InfoNCE for UniSRec pre-training, with in-batch or MoCo-queue negatives.

    in-batch   L = -1/M Σ_i log softmax_j(q_i · k_j / τ)[i]           keys of the other rows are negatives
    queue      L = -1/M Σ_i log softmax([q_i · k_i, q_i · Q_1..K] / τ)[0]

Negatives that are the same item as the positive (`ids`) are removed from the
softmax (logit -inf): a user who buys the same item as another user is not a
negative for them. With item ids, the in-batch loss is computed over the batch's
distinct items, each key once with its count (`info_nce_items`), the same loss
at a fraction of the (M, M) cost when M positions hold few distinct items.
Written with `cross_entropy` (a log-sum-exp), never exp then log.
q, k (M, D) are expected L2-normalised; Q (K, D) the queued keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from seqrec.nn.history import distinct_offsets


def info_nce_in_batch(q: torch.Tensor, k: torch.Tensor, temperature: float,
                      ids: torch.Tensor | None = None,
                      history: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Row i's positive is k_i; every k_j (j != i) is a negative unless ids[j] == ids[i].

    With `ids`, the keys of one item are taken to be one vector (the first row's stands for it): see
    `info_nce_items`, which this calls, and which `history` needs."""
    if ids is None:
        logits = (q @ k.T).float() / temperature  # (M, M)
        return F.cross_entropy(logits, torch.arange(len(q), device=q.device))
    items, column = torch.unique(ids, return_inverse=True)
    first = torch.full((len(items),), len(ids), dtype=torch.long, device=ids.device)
    first.scatter_reduce_(0, column, torch.arange(len(ids), device=ids.device), "amin")
    return info_nce_items(q, k[first], items, column, temperature, history)


def info_nce_items(q: torch.Tensor, keys: torch.Tensor, items: torch.Tensor, column: torch.Tensor,
                   temperature: float,
                   history: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """In-batch InfoNCE over the batch's distinct items: row i's positive is item items[column[i]], whose key
    is keys[column[i]] ((U, D), one per distinct item); every other item of the batch is a negative, as many
    times as it is a row's positive (its log count is added to its logit), so the loss is the (M, M) one with
    each row's own key as positive and the rows of the same item left out, at (M, U) cost: a batch of long
    histories has many positions (M) but few distinct items (U).

    `history` = (x, v, z) (seqrec.nn.history): each row's own history items x (M, L; 0 = none) are
    candidates too, each distinct item once with its logit z / τ plus the offsets v of its occurrences;
    an in-batch key of one of them is dropped (the history candidate stands for it), and a positive that
    is in the history gets its offsets. So the offsets learn how often users come back."""
    rows = torch.arange(len(q), device=q.device)
    log_counts = torch.bincount(column, minlength=len(items)).float().log()
    logits = (q @ keys.T).float() / temperature + log_counts  # (M, U): each item as often as it occurs
    own = -log_counts[column]  # ... but a row's own item once (its other rows are the same item)
    candidates = None
    if history is not None:
        logits, candidates, positive = _with_history_candidates(logits, items, column, *history, temperature)
        own = own + positive
    logits = logits.index_put((rows, column), own, accumulate=True)
    if candidates is not None:
        logits = torch.cat([logits, candidates], dim=1)
    return F.cross_entropy(logits, column)


def _with_history_candidates(logits: torch.Tensor, items: torch.Tensor, column: torch.Tensor, x: torch.Tensor,
                             v: torch.Tensor, z: torch.Tensor, temperature: float
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(in-batch logits (M, U) with each row's history items dropped, its (M, L) history candidates, and the
    (M,) offsets of its positive where the user had it before)."""
    valid = x != 0
    total, first = distinct_offsets(x, v)  # one candidate per distinct history item, all its offsets
    is_target = x == items[column][:, None]
    candidates = (z.float() / temperature + total.float()).masked_fill(~first | is_target, -torch.inf)
    uniq, inverse = torch.unique(torch.cat([items, x.flatten()]), return_inverse=True)
    key_column, row_items = inverse[: len(items)], inverse[len(items):].view_as(x)
    member = torch.zeros(len(x), len(uniq), dtype=torch.bool, device=x.device)
    member.scatter_(1, row_items, valid)  # padding has a column of its own, never set
    in_history = member[:, key_column]  # (M, U): row i's history holds item u ...
    in_history[torch.arange(len(x), device=x.device), column] = False  # ... other than its positive
    positive = (v * is_target).sum(1).float()
    return logits.masked_fill(in_history, -torch.inf), candidates, positive


def info_nce_queue(q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, temperature: float,
                   ids: torch.Tensor | None = None, queue_ids: torch.Tensor | None = None,
                   queue_valid: torch.Tensor | None = None) -> torch.Tensor:
    """Row i's positive is k_i, its negatives the queued keys (minus empty slots and same-item keys)."""
    pos = (q * k).sum(-1, keepdim=True)  # (M, 1)
    neg = q @ queue.T  # (M, K)
    drop = torch.zeros_like(neg, dtype=torch.bool)
    if queue_valid is not None:
        drop |= ~queue_valid[None, :]
    if ids is not None and queue_ids is not None:
        drop |= ids[:, None] == queue_ids[None, :]
    logits = torch.cat([pos, neg.masked_fill(drop, -torch.inf)], dim=1).float() / temperature
    return F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long, device=q.device))


class KeyQueue(nn.Module):
    """A ring buffer of the K most recent keys (and their item ids): the MoCo dictionary."""

    def __init__(self, size: int, d: int) -> None:
        super().__init__()
        self.keys: torch.Tensor
        self.ids: torch.Tensor
        self.valid: torch.Tensor
        self.register_buffer("keys", torch.zeros(size, d))
        self.register_buffer("ids", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("valid", torch.zeros(size, dtype=torch.bool))
        self.ptr = 0

    @property
    def size(self) -> int:
        return self.keys.shape[0]

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, ids: torch.Tensor | None = None) -> None:
        """Write keys over the oldest slots (the newest `size` of them when more are given)."""
        keys = keys.detach()[-self.size :]
        ids = None if ids is None else ids[-self.size :]
        slots = (self.ptr + torch.arange(len(keys), device=keys.device)) % self.size
        self.keys[slots] = keys.to(self.keys)
        self.ids[slots] = -1 if ids is None else ids.to(self.ids)
        self.valid[slots] = True
        self.ptr = int((self.ptr + len(keys)) % self.size)


@torch.no_grad()
def momentum_update(online: nn.Module, target: nn.Module, m: float) -> None:
    """θ_target <- m θ_target + (1 - m) θ_online, parameter by parameter."""
    for p_o, p_t in zip(online.parameters(), target.parameters(), strict=True):
        p_t.mul_(m).add_(p_o.detach(), alpha=1 - m)
