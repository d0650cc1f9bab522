"""GRU4Rec: Session-based Recommendations with Recurrent Neural Networks
(Hidasi et al., ICLR 2016; Hidasi & Karatzoglou, CIKM 2018; Hidasi & Czapp, RecSys 2023).

    h_l = GRU(F(E[s_l], features_l), h_{l-1}),  h_0 = 0   one state per position; F: side features
    score(i | s_1..s_l) = h_l · U[i] + b_i        constrained embeddings (default): U = E, the input
                                                  table is the output table, plus a bias (both options)

Trained on every position of a sequence at once (next-item targets), with any
loss of `seqrec.nn.objective`. The official code's default is cross-entropy over
in-batch + sampled negatives; `loss="sampled_softmax"` with popularity
negatives is the closest setting here.

Feeding. By default every row of a batch is one user's (or session's) window,
left-padded; the rows are turned right-padded and packed so that the GRU starts
from h_0 = 0 at each row's first real item and padding never enters the state.
`session_parallel = true` is GRU4Rec's session-parallel layout: each row is a
lane of consecutive sequences glued end to end (see `SessionParallelBatches`);
a target of 0 ends a sequence, and the state is reset to 0 before the next one
starts. Unlike the original, the state is not carried from one mini-batch to
the next: each lane chunk of `max_len` steps starts from h_0 = 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seqrec.data.batching import Batch
from seqrec.data.counts import train_item_counts
from seqrec.data.dataset import PreparedDataset
from seqrec.data.features import FeatureInputs
from seqrec.errors import SeqrecError
from seqrec.models.base import REFIT_DEFAULT, SequentialModel
from seqrec.nn.dropout import Dropout
from seqrec.nn.embeddings import output_layer
from seqrec.nn.features import FeatureBlock
from seqrec.nn.history import HistoryBias
from seqrec.nn.objective import Objective, check_loss_config


def roll_rows(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Row b of (B, L, ...) x rolled left by shift[b]: left-padded <-> right-padded."""
    L = x.shape[1]
    idx = (torch.arange(L, device=x.device)[None, :] + shift[:, None]) % L  # (B, L)
    return x.gather(1, idx.view(*idx.shape, *([1] * (x.dim() - 2))).expand_as(x))


class SessionParallelBatches:
    """GRU4Rec's session-parallel mini-batches over training sequences.

    The training events of all users, in a shuffled user order, are cut into
    `batch_size` lanes of consecutive sequences; each batch is the next `max_len`
    steps of every lane. Within a lane the target of the last event of a sequence
    is 0 (no next item), which is where the model resets its state.
    """

    def __init__(self, data: PreparedDataset, max_len: int, batch_size: int, seed: int) -> None:
        lengths, train_end = data.lengths, data.train_end()
        position = np.arange(len(data.items)) - np.repeat(data.offsets[:-1], lengths)
        self.keep = position < np.repeat(train_end, lengths)
        self.user = np.repeat(np.arange(len(lengths)), lengths)[self.keep]
        self.items = data.items.astype(np.int64)[self.keep]
        self.n_users, self.max_len, self.batch_size = len(lengths), max_len, batch_size
        self.rng = np.random.default_rng(seed)

    @property
    def n_targets(self) -> int:
        return int(len(self.items) - len(np.unique(self.user)))

    def __len__(self) -> int:
        per_lane = -(-len(self.items) // self.batch_size)
        return -(-per_lane // self.max_len)

    def __iter__(self) -> Iterator[Batch]:
        order = self.rng.permutation(self.n_users)
        rank = np.empty_like(order)
        rank[order] = np.arange(self.n_users)
        perm = np.argsort(rank[self.user], kind="stable")  # events grouped by shuffled user, time order kept
        items, user = self.items[perm], self.user[perm]
        nxt = np.append(items[1:], 0)
        target = np.where(np.append(user[1:] == user[:-1], False), nxt, 0)  # 0 at each sequence's end
        per_lane = -(-len(items) // self.batch_size)
        width = -(-per_lane // self.max_len) * self.max_len
        grid = np.zeros((self.batch_size, width), dtype=np.int64)
        tgrid = np.zeros_like(grid)
        grid.reshape(-1)[: len(items)] = items
        tgrid.reshape(-1)[: len(items)] = target
        for lo in range(0, width, self.max_len):
            x, t = grid[:, lo : lo + self.max_len], tgrid[:, lo : lo + self.max_len]
            live = (x != 0).any(1)
            yield Batch(items=torch.from_numpy(x[live]), targets=torch.from_numpy(t[live]))


@dataclass
class GRU4RecConfig:
    TRAIN_DEFAULTS: ClassVar[tuple[dict[str, Any], ...]] = (REFIT_DEFAULT,)
    name: str = "gru4rec"
    d: int = 64  # embedding size = hidden size (constrained embeddings)
    n_layers: int = 1
    dropout: float = 0.1  # on embeddings and on the GRU output
    session_parallel: bool = False
    loss: Literal["auto", "ce", "sampled_softmax", "bce", "gbce"] = "auto"  # auto: seqrec.train.auto
    n_negatives: int = 1
    negatives: Literal["uniform", "popularity"] = "uniform"
    logq: bool = False
    gbce_t: float = 0.75
    init_std: float = 0.02  # standard deviation of the normal initialisation of the item tables
    output_bias: bool = True
    tied: bool = True
    # learned offset for items already in the history (seqrec.nn.history); "auto": on with a full-softmax loss
    # (seqrec.train.auto)
    history_bias: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        if self.n_layers < 1 or not 0 <= self.dropout < 1:
            raise SeqrecError("model.n_layers must be >= 1 and model.dropout in [0, 1)")
        if self.history_bias is True and self.session_parallel:
            raise SeqrecError("model.history_bias is not supported with model.session_parallel=true "
                              "(a lane's history would cross sessions)")
        check_loss_config(self)


class GRU4Rec(SequentialModel):
    name = "gru4rec"
    may_leave_parameters_unused = False  # every parameter is in every loss: DDP need not look for unused ones

    def __init__(self, config: GRU4RecConfig, n_items: int, max_len: int,
                 features: FeatureInputs | None = None) -> None:
        super().__init__()
        self.config, self.n_items, self.max_len = config, n_items, max_len
        d = config.d
        self.item_emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        nn.init.normal_(self.item_emb.weight, std=config.init_std)
        with torch.no_grad():
            self.item_emb.weight[0].zero_()
        self.drop = Dropout(config.dropout)
        self.gru = nn.GRU(d, d, config.n_layers, batch_first=True)
        self.out_emb, self.bias = output_layer(n_items, d, config.tied, config.output_bias, config.init_std)
        self.objective = Objective(config, n_items)
        if features is not None and config.session_parallel:
            raise SeqrecError("side features are not supported with model.session_parallel=true")
        self.feature_block = FeatureBlock(features, n_items, d) if features is not None else None
        self.history = HistoryBias(max_len) if config.history_bias is True else None

    def embed(self, items: torch.Tensor, events: dict[str, torch.Tensor] | None) -> torch.Tensor:
        x = self.item_emb(items)
        return x if self.feature_block is None else self.feature_block(x, items, events)

    def hidden(self, items: torch.Tensor, events: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """(B, L) left-padded items -> (B, L, D); state l has seen items[:, :l+1], pads give 0."""
        n_real = (items != 0).sum(1)
        pad = items.shape[1] - n_real
        x = roll_rows(self.drop(self.embed(items, events)), pad)  # (B, L, D) right-padded
        packed = pack_padded_sequence(x, n_real.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.gru(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=items.shape[1])
        return self.drop(roll_rows(out, -pad % items.shape[1]))  # back to left-padded

    def can_extend(self) -> bool:
        return self.feature_block is None

    @torch.no_grad()
    def extend(self, items: torch.Tensor, cache: Any | None) -> tuple[torch.Tensor, Any]:
        """The GRU's own state is the cache: one step per new item, exactly as `hidden` runs it
        (`hidden` reads the last max_len items only; the caller re-encodes beyond that)."""
        h, n = cache if cache is not None else (None, 0)
        if n + items.shape[1] > self.max_len:
            raise SeqrecError(f"a cached history holds at most max_len={self.max_len} items")
        out, h = self.gru(self.drop(self.item_emb(items)), h)
        return self.drop(out[:, -1]), (h, n + items.shape[1])

    def hidden_with_resets(self, items: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Session-parallel lanes: the state is zeroed after every step whose target is 0."""
        x = self.drop(self.item_emb(items))  # (B, L, D)
        h = x.new_zeros(self.config.n_layers, items.shape[0], self.config.d)
        outs = []
        for step in range(items.shape[1]):
            out, h = self.gru(x[:, step : step + 1], h)
            outs.append(out)
            h = h * (targets[:, step] != 0).to(h.dtype)[None, :, None]  # a sequence ended: reset
        return self.drop(torch.cat(outs, dim=1))

    def encode(self, batch: Batch) -> torch.Tensor:
        return self.hidden(batch.items, batch.events)[:, -1]

    def item_embeddings(self) -> torch.Tensor:
        return (self.item_emb if self.out_emb is None else self.out_emb).weight  # constrained: input = output

    def item_bias(self) -> torch.Tensor | None:
        return self.bias

    def fit_data(self, data: PreparedDataset) -> None:
        self.objective.set_counts(train_item_counts(data))

    def train_batches(self, data: PreparedDataset, max_len: int, batch_size: int,
                      seed: int) -> SessionParallelBatches | None:
        """The session-parallel feeder when configured; None = the default `TrainBatches`."""
        return SessionParallelBatches(data, max_len, batch_size, seed) if self.config.session_parallel else None

    def loss(self, batch: Batch) -> torch.Tensor:
        assert batch.targets is not None, "training batches carry targets"
        if self.config.session_parallel:  # also right for left-padded rows: pads end in target 0
            return self.next_item_loss(self.objective, self.hidden_with_resets(batch.items, batch.targets), batch)
        return self.next_item_loss(self.objective, self.hidden(batch.items, batch.events), batch)
