"""SASRec: Self-Attentive Sequential Recommendation (Kang & McAuley, ICDM 2018).

    x_l = F(E[s_l], features_l) * sqrt(D) + P[l]   item (+ side features, seqrec.nn.features) + position
    H   = CausalTransformer(dropout(LN(x)))         position l sees s_1..s_l only; LN only with input_norm
    score(i | s_1..s_l) = H_l · U[i] + b_i          U = E (tied, default) or its own table; b optional
                          (+ beta[l - j] for each s_j = i with model.history_bias, seqrec.nn.history)

Trained on every position of a sequence in one pass, with any loss of
`seqrec.nn.objective` (model.loss): full-softmax cross-entropy (chunked over
items for large catalogues), sampled softmax (uniform or popularity negatives,
optional logQ correction), the original binary cross-entropy with sampled
negatives, or gSASRec's gBCE.
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
from seqrec.models.base import REFIT_DEFAULT, SequentialModel
from seqrec.nn.dropout import Dropout
from seqrec.nn.embeddings import make_positions, output_layer, position_ids
from seqrec.nn.features import FeatureBlock
from seqrec.nn.history import HistoryBias
from seqrec.nn.init import normal_init
from seqrec.nn.objective import Objective, check_loss_config
from seqrec.nn.transformer import Encoder, attention_mask, check_encoder_config, extend_causal


@dataclass
class SASRecConfig:
    # AdamW with decay and a running average of the weights validated best on the Amazon builds
    # (benchmarks/defaults.py; results/sasrec_quality_*.json hold the runs that chose them)
    TRAIN_DEFAULTS: ClassVar[tuple[dict[str, Any], ...]] = (
        {"optimizer": "adamw", "weight_decay": 0.1}, {"ema": 0.997}, REFIT_DEFAULT)
    name: str = "sasrec"
    d: int = 64
    n_layers: int = 2
    # 2 heads and post-LN blocks (RecBole's SASRec; the paper's are pre-LN, 1 head): validated better than
    # 1 head pre-LN on ml-100k, level elsewhere (benchmarks/defaults.py --candidate; defaults_candidate_*)
    n_heads: int = 2
    d_ff: int = 256
    dropout: float = 0.2
    attn_dropout: float = 0.2
    norm_first: bool = False  # True: pre-LN (x + f(LN(x))); False: post-LN (LN(x + f(x))), the Transformer's
    positions: Literal["learned", "sinusoidal"] = "learned"
    # "end": the newest item is always the last position; "start": positions count from the first item,
    # so earlier positions never move and sessions can keep a KV cache (seqrec.nn.transformer)
    positions_from: Literal["end", "start"] = "end"
    output_bias: bool = True  # l = hUᵀ + b
    tied: bool = True  # U = the input item table E; False: a separate output table
    loss: Literal["auto", "ce", "sampled_softmax", "bce", "gbce"] = "auto"  # auto: seqrec.train.auto
    n_negatives: int = 1  # per positive (bce, gbce) or per batch (sampled_softmax)
    negatives: Literal["uniform", "popularity"] = "uniform"
    logq: bool = False  # logQ correction of sampled_softmax
    gbce_t: float = 0.75  # gSASRec calibration
    init_std: float = 0.02  # standard deviation of the normal initialisation of the weights
    emb_scale: bool = True  # multiply item embeddings by sqrt(d) at the input, as the SASRec paper does
    input_norm: bool = False  # LayerNorm(item + position) before the dropout, as BERT and RecBole's SASRec do
    # learned offset for items already in the history (seqrec.nn.history); "auto": on with a full-softmax loss
    # (seqrec.train.auto)
    history_bias: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        check_encoder_config(self)
        check_loss_config(self)


class SASRec(SequentialModel):
    name = "sasrec"
    may_leave_parameters_unused = False  # every parameter is in every loss: DDP need not look for unused ones

    def __init__(self, config: SASRecConfig, n_items: int, max_len: int,
                 features: FeatureInputs | None = None) -> None:
        super().__init__()
        self.config, self.n_items, self.max_len = config, n_items, max_len
        d = config.d
        self.item_emb = nn.Embedding(n_items + 1, d, padding_idx=0)
        self.pos_emb = make_positions(config.positions, max_len, d)
        self.emb_ln = nn.LayerNorm(d) if config.input_norm else nn.Identity()
        self.emb_drop = Dropout(config.dropout)
        self.encoder = Encoder(d, config.n_layers, config.n_heads, config.d_ff, config.dropout,
                               config.attn_dropout, config.norm_first)
        self.out_emb, self.bias = output_layer(n_items, d, config.tied, config.output_bias)
        self.objective = Objective(config, n_items)
        self.apply(normal_init(config.init_std))
        self.feature_block = FeatureBlock(features, n_items, d) if features is not None else None  # own init
        self.history = HistoryBias(max_len) if config.history_bias is True else None  # starts at 0: plain SASRec

    def inputs(self, items: torch.Tensor, positions: torch.Tensor,
               events: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """(B, L) items at the given positions -> (B, L, D) Transformer inputs (0 at padding)."""
        x = self.item_emb(items)
        if self.feature_block is not None:
            x = self.feature_block(x, items, events)
        x = x * (math.sqrt(self.config.d) if self.config.emb_scale else 1.0)
        x = x + self.pos_emb(positions)
        return self.emb_drop(self.emb_ln(x)) * (items != 0).unsqueeze(-1)

    def hidden(self, items: torch.Tensor, events: dict[str, torch.Tensor] | None = None,
               last_only: bool = False) -> torch.Tensor:
        """(B, L) left-padded items (+ event features) -> (B, L, D) states; state l has seen items[:, :l+1]
        (`last_only`: (B, 1, D), the last state alone)."""
        positions = position_ids(items, self.max_len, align=self.config.positions_from)
        return self.encoder(self.inputs(items, positions, events), attention_mask(items, causal=True), last_only)

    def can_extend(self) -> bool:
        return self.config.positions_from == "start" and self.feature_block is None

    def extend(self, items: torch.Tensor, cache: Any | None) -> tuple[torch.Tensor, Any]:
        return extend_causal(self, items, cache)

    def encode(self, batch: Batch) -> torch.Tensor:
        return self.hidden(batch.items, batch.events, last_only=True)[:, -1]  # (B, D): the most recent position

    def item_embeddings(self) -> torch.Tensor:
        return (self.item_emb if self.out_emb is None else self.out_emb).weight  # tied: the input table

    def item_bias(self) -> torch.Tensor | None:
        return self.bias

    def fit_data(self, data: PreparedDataset) -> None:
        self.objective.set_counts(train_item_counts(data))

    def loss(self, batch: Batch) -> torch.Tensor:
        return self.next_item_loss(self.objective, self.hidden(batch.items, batch.events), batch)
