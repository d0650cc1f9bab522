"""BERT4Rec: Sequential Recommendation with Bidirectional Encoder Representations
from Transformer (Sun et al., CIKM 2019).

    x~ = cloze(s): each real item replaced by [MASK] = N+1 with probability p,
         at least one per sequence, the last item alone in a share of sequences
    H  = Transformer(F(E[x~], features) + P)   bidirectional; F: side features (a masked
                                               position's item features read as unknown)
    score(i | masked position l) = GELU-LN(W_h H_l) · U[i] + b_i   U = E tied (default), items 1..N only

At inference `encode` appends [MASK] after the history and reads its state, the
same task as the last-item cloze of training. The output is scored against rows
0..N of the table only (`item_embeddings`), so neither [MASK] nor padding can be
predicted (padding is excluded by the losses and the ranking).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from seqrec.data.batching import Batch
from seqrec.data.counts import train_item_counts
from seqrec.data.dataset import PreparedDataset
from seqrec.data.features import FeatureInputs
from seqrec.errors import SeqrecError
from seqrec.models.base import REFIT_DEFAULT, SequentialModel
from seqrec.nn.dropout import Dropout
from seqrec.nn.embeddings import make_positions, output_layer, right_aligned_positions
from seqrec.nn.features import FeatureBlock
from seqrec.nn.init import normal_init
from seqrec.nn.objective import Objective, check_loss_config
from seqrec.nn.transformer import Encoder, attention_mask, check_encoder_config


def cloze_mask(seq: torch.Tensor, mask_token: int, p: float, last_share: float,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Vectorised cloze corruption of left-padded (B, L) sequences.

    Returns (inputs, targets): inputs with masked items replaced by `mask_token`;
    targets (B, L) the original item where masked, 0 elsewhere. Padding is never
    masked; every row with an item gets at least one mask; in a `last_share` of rows
    only the last item is masked (the next-item task seen at inference).
    """
    real = seq != 0
    B, L = seq.shape
    u = torch.rand(B, L, device=seq.device, generator=generator)
    masked = (u < p) & real
    # rows with no mask: mask one real position, the one with the largest draw
    pick = torch.nn.functional.one_hot(torch.where(real, u, -1.0).argmax(1), L).bool() & real
    masked = torch.where(masked.any(1, keepdim=True), masked, pick)
    last_only = torch.rand(B, 1, device=seq.device, generator=generator) < last_share
    last = torch.zeros_like(masked)
    last[:, -1] = real[:, -1]
    masked = torch.where(last_only & real[:, -1:], last, masked)
    return seq.masked_fill(masked, mask_token), seq * masked


def with_unknown_last(events: dict[str, torch.Tensor] | None, keep: int) -> dict[str, torch.Tensor] | None:
    """The last `keep` columns of each event feature plus a missing (NaN) column: the appended position
    is scored without its own event values, at training as at inference."""
    if events is None:
        return None
    return {k: torch.cat([v[:, v.shape[1] - keep:], torch.full_like(v[:, :1], torch.nan)], dim=1)
            for k, v in events.items()}


@dataclass
class BERT4RecConfig:
    TRAIN_DEFAULTS: ClassVar[tuple[dict[str, Any], ...]] = (REFIT_DEFAULT,)
    name: str = "bert4rec"
    d: int = 64
    n_layers: int = 2
    n_heads: int = 2
    d_ff: int = 256
    dropout: float = 0.2
    attn_dropout: float = 0.2
    norm_first: bool = False  # the original is post-LN
    positions: Literal["learned", "sinusoidal"] = "learned"
    mask_prob: float = 0.2
    last_mask_share: float = 0.1  # share of training sequences where only the last item is masked
    loss: Literal["auto", "ce", "sampled_softmax", "bce", "gbce"] = "auto"  # auto: seqrec.train.auto
    n_negatives: int = 1
    negatives: Literal["uniform", "popularity"] = "uniform"
    logq: bool = False
    gbce_t: float = 0.75
    init_std: float = 0.02  # standard deviation of the normal initialisation of the weights
    output_bias: bool = True
    tied: bool = True

    def __post_init__(self) -> None:
        check_encoder_config(self)
        if not 0 < self.mask_prob < 1 or not 0 <= self.last_mask_share <= 1:
            raise SeqrecError("model.mask_prob must be in (0, 1) and model.last_mask_share in [0, 1]")
        check_loss_config(self)


class BERT4Rec(SequentialModel):
    name = "bert4rec"
    may_leave_parameters_unused = False  # every parameter is in every loss: DDP need not look for unused ones

    def __init__(self, config: BERT4RecConfig, n_items: int, max_len: int,
                 features: FeatureInputs | None = None) -> None:
        super().__init__()
        self.config, self.n_items, self.max_len = config, n_items, max_len
        self.mask_token = n_items + 1
        d = config.d
        self.item_emb = nn.Embedding(n_items + 2, d, padding_idx=0)  # rows: PAD, items 1..N, MASK
        self.pos_emb = make_positions(config.positions, max_len, d)
        self.emb_ln, self.emb_drop = nn.LayerNorm(d), Dropout(config.dropout)
        self.encoder = Encoder(d, config.n_layers, config.n_heads, config.d_ff, config.dropout,
                               config.attn_dropout, config.norm_first)
        self.head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))  # BERT's output transform
        self.out_emb, self.bias = output_layer(n_items, d, config.tied, config.output_bias)
        self.objective = Objective(config, n_items)
        self.apply(normal_init(config.init_std))
        self.feature_block = FeatureBlock(features, n_items, d) if features is not None else None

    def hidden(self, items: torch.Tensor, events: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """(B, L) left-padded items (may hold MASK) -> (B, L, D) output states; L <= max_len."""
        x = self.item_emb(items)
        if self.feature_block is not None:  # row N+1 (MASK) of the item feature tables is "unknown"
            x = self.feature_block(x, items, events)
        x = x * math.sqrt(self.config.d)  # as SASRec: items not drowned by positions
        x = x + self.pos_emb(right_aligned_positions(items.shape[1], self.max_len, items.device))
        x = self.emb_drop(self.emb_ln(x)) * (items != 0).unsqueeze(-1)
        return self.head(self.encoder(x, attention_mask(items, causal=False)))

    def encode(self, batch: Batch) -> torch.Tensor:
        items = batch.items[:, -(self.max_len - 1):] if self.max_len > 1 else batch.items[:, :0]
        masked = torch.full((items.shape[0], 1), self.mask_token, dtype=items.dtype, device=items.device)
        events = with_unknown_last(batch.events, items.shape[1])
        return self.hidden(torch.cat([items, masked], dim=1), events)[:, -1]  # (B, D): the appended [MASK]

    def item_embeddings(self) -> torch.Tensor:
        table = self.item_emb if self.out_emb is None else self.out_emb
        return table.weight[: self.n_items + 1]  # tied by default; the MASK row is never scored

    def item_bias(self) -> torch.Tensor | None:
        return self.bias

    def fit_data(self, data: PreparedDataset) -> None:
        self.objective.set_counts(train_item_counts(data))

    def loss(self, batch: Batch) -> torch.Tensor:
        assert batch.targets is not None, "training batches carry targets"
        seq = torch.cat([batch.items, batch.targets[:, -1:]], dim=1)[:, -self.max_len:]  # (B, L'): the window
        inputs, targets = cloze_mask(seq, self.mask_token, self.config.mask_prob, self.config.last_mask_share)
        keep = targets != 0
        events = with_unknown_last(batch.events, seq.shape[1] - 1)  # the last target's event: unknown
        h = self.hidden(inputs, events)[keep]  # (M, D): masked positions only
        return self.objective(h, self.item_embeddings(), self.item_bias(), targets[keep])
