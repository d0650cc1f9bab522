"""UniSRec: Towards Universal Sequence Representation Learning for Recommender Systems
(Hou et al., KDD 2022).

    x_i   = LM(text_i)                                   frozen, a (N+1, D_text) buffer saved in the checkpoint
    v_i   = MoE(x_i) [+ E_id[i] when transductive]       parametric whitening experts + noisy gate (adaptors.py)
    H     = CausalTransformer(dropout(LN(F(v_{s_l}, features_l) + P[l])))   F: optional side features
    score(i | s_1..s_l) = cos(H_l, v_i) / τ              (+ a learned offset for history items, model.history_bias)

Item ids never reach the shared parts: a model pre-trained on some domains is
moved to a new one by swapping the text buffer (and, transductively, adding an
ID table). Items added after training need only their text (`add_items`); so do
catalogue items without a training event, whose ID vectors are held at zero.
Shapes: B batch, L length, D hidden, N items, D_text text width.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from seqrec.data.batching import Batch
from seqrec.data.counts import train_item_counts
from seqrec.data.dataset import PreparedDataset
from seqrec.data.features import FeatureInputs
from seqrec.data.text import TextOptions, check_precision, text_embeddings
from seqrec.errors import SeqrecError
from seqrec.models.base import REFIT_DEFAULT, SequentialModel
from seqrec.nn.adaptors import MoEAdaptor, Whitening
from seqrec.nn.dropout import Dropout
from seqrec.nn.embeddings import position_ids
from seqrec.nn.features import FeatureBlock
from seqrec.nn.history import HistoryBias
from seqrec.nn.init import normal_init
from seqrec.nn.losses import full_ce, sampled_softmax
from seqrec.nn.objective import Objective
from seqrec.nn.rows import append_rows
from seqrec.nn.transformer import Encoder, attention_mask, check_encoder_config, extend_causal


@dataclass
class UniSRecConfig:
    TRAIN_DEFAULTS: ClassVar[tuple[dict[str, Any], ...]] = (REFIT_DEFAULT,)
    name: str = "unisrec"
    d: int = 64
    n_layers: int = 2
    n_heads: int = 2
    d_ff: int = 256
    dropout: float = 0.5
    attn_dropout: float = 0.5
    norm_first: bool = True
    temperature: float = 0.07
    adaptor: Literal["moe", "whitening"] = "moe"  # whitening = classic, not learned
    n_experts: int = 8
    adaptor_dropout: float = 0.2
    gate_noise: bool = True
    whitening_init: bool = False  # start each MoE expert as an SVD whitening of the text table
    # subtract the catalogue's mean text vector before the adaptor: in pre-training each domain its own mean, a
    # new catalogue its own from its item text alone
    text_centre: bool = False
    positions_from: Literal["end", "start"] = "end"  # "start": sessions can keep a KV cache (see SASRec)
    item_ids: bool = False  # transductive: add a learned item ID embedding to the text vector
    freeze_encoder: bool = False  # inductive fine-tuning: Transformer, positions and input LN frozen
    # the training softmax: "trained" = over the items with a training event only, so that items with none
    # (in the catalogue without interactions, cold) are not taught to score low and are ranked from their
    # text like items added later; "all" = every catalogue item is a negative (training and fine-tuning;
    # pre-training's negatives are the other items of its batch)
    softmax_items: Literal["trained", "all"] = "all"
    # "ce": the softmax over the catalogue, every item's vector made by the adaptor at every step;
    # "sampled_softmax": over the batch's targets and n_negatives items drawn for the batch by training-split
    # popularity, with the logQ correction: the adaptor runs over those items only (large catalogues)
    loss: Literal["ce", "sampled_softmax"] = "ce"
    n_negatives: int = 1024  # items drawn per batch (sampled_softmax)
    # learned offset for items already in the history (seqrec.nn.history); "auto": on with a full-softmax loss
    # (seqrec.train.auto)
    history_bias: bool | Literal["auto"] = "auto"
    init_std: float = 0.02  # standard deviation of the normal initialisation of the weights
    text_dim: int = 384  # the width of the frozen encoder's vectors (it and the text_* below key the text cache)
    text_encoder: str = "default"  # "default" (the packaged all-MiniLM-L6-v2), a local folder or a model name
    text_revision: str = ""  # "": a fingerprint of a local folder's files ("main" for a model name)
    text_pooling: Literal["mean", "cls"] = "mean"  # the text vector: the tokens' mean or the CLS token
    text_max_length: int = 128  # tokens read of each text
    text_template: str = ""  # e.g. "{title}. {brand}"; "": the item's text field, else its known fields
    text_missing: Literal["auto", "error", "id", "mean"] = "auto"  # auto: the mean vector for <= 1% of items
    text_word_drop: float = 0.15
    text_precision: Literal["auto", "fp32", "bf16"] = "auto"  # how the encoder computes (not part of the key)

    def __post_init__(self) -> None:
        check_encoder_config(self)
        if self.temperature <= 0 or self.n_experts < 1:
            raise SeqrecError("model.temperature must be > 0 and model.n_experts >= 1")
        check_precision(self.text_precision)
        if self.softmax_items not in ("trained", "all"):
            raise SeqrecError(f"model.softmax_items must be 'trained' or 'all', got {self.softmax_items!r}")
        if self.loss not in ("ce", "sampled_softmax") or self.n_negatives < 1:
            raise SeqrecError(f"model.loss must be 'ce' or 'sampled_softmax' (got {self.loss!r}) and "
                              f"model.n_negatives >= 1 (got {self.n_negatives})")
        if self.loss != "ce" and self.history_bias is True:
            raise SeqrecError("model.history_bias needs model.loss='ce' (its offsets enter the full softmax)")

    def text_options(self) -> TextOptions:
        return TextOptions(encoder=self.text_encoder, revision=self.text_revision, pooling=self.text_pooling,
                           max_length=self.text_max_length, template=self.text_template,
                           missing=self.text_missing, word_drop=self.text_word_drop,
                           precision=self.text_precision)


LEFT_OUT = -1e4  # a logit offset that takes an item out of a softmax (cos / τ is at most 1 / τ)


class UniSRec(SequentialModel):
    name = "unisrec"

    def __init__(self, config: UniSRecConfig, n_items: int, max_len: int,
                 text_emb: torch.Tensor | None = None, features: FeatureInputs | None = None) -> None:
        super().__init__()
        self.config, self.n_items, self.max_len = config, n_items, max_len
        if text_emb is None:  # filled by load_checkpoint; `from_dataset` passes the real vectors
            text_emb = torch.zeros(n_items + 1, config.text_dim)
        if tuple(text_emb.shape) != (n_items + 1, config.text_dim):
            raise SeqrecError(f"text vectors have shape {tuple(text_emb.shape)}, expected "
                              f"({n_items + 1}, {config.text_dim}); set model.text_dim to the encoder width")
        self.text_emb: torch.Tensor
        self.register_buffer("text_emb", text_emb.float().clone())
        self._text_store: torch.Tensor | None = None  # what text_emb grows in when items are added
        self.text_mean: torch.Tensor | None  # the catalogue's mean text vector (model.text_centre)
        self.register_buffer("text_mean", torch.zeros(config.text_dim) if config.text_centre else None)
        d = config.d
        self.adaptor: nn.Module = (MoEAdaptor(config.text_dim, d, config.n_experts, config.adaptor_dropout,
                                              config.gate_noise)
                                   if config.adaptor == "moe" else Whitening(config.text_dim, d))
        self.item_emb = nn.Embedding(n_items + 1, d, padding_idx=0) if config.item_ids else None
        self.pos_emb = nn.Embedding(max_len, d)
        self.in_ln, self.drop = nn.LayerNorm(d), Dropout(config.dropout)
        self.encoder = Encoder(d, config.n_layers, config.n_heads, config.d_ff, config.dropout,
                               config.attn_dropout, config.norm_first)
        for module in (self.pos_emb, self.encoder, *([self.item_emb] if self.item_emb is not None else [])):
            module.apply(normal_init(config.init_std))
        if config.freeze_encoder:
            for module in self.sequence_encoder():
                module.requires_grad_(False)
        self.feature_block = FeatureBlock(features, n_items, d) if features is not None else None
        self.history = HistoryBias(max_len) if config.history_bias is True else None  # transfer: seqrec.train.transfer
        self.sampler = (Objective(SimpleNamespace(loss="sampled_softmax", n_negatives=config.n_negatives, logq=True,
                                                  negatives="popularity", gbce_t=0.0), n_items)
                        if config.loss == "sampled_softmax" else None)  # its counts: training-split popularity
        self.untrained: torch.Tensor | None = None  # (N+1,) bool, items with no training event (`fit_data`)

    def sequence_encoder(self) -> list[nn.Module]:
        """The parts shared across domains that inductive fine-tuning keeps frozen."""
        return [self.pos_emb, self.in_ln, self.encoder]

    @classmethod
    def from_dataset(cls, config: UniSRecConfig, data: PreparedDataset, max_len: int,
                     progress: bool = False, features: FeatureInputs | None = None) -> UniSRec:
        """Build with `data`'s item text vectors (from the text cache, encoded once if absent)."""
        text = text_embeddings(data, config.text_options(), progress=progress, word_drop_view=False).emb
        if text.shape[1] != config.text_dim:
            raise SeqrecError(f"the text encoder gives {text.shape[1]}-d vectors; set model.text_dim={text.shape[1]}")
        model = cls(config, data.n_items, max_len, text, features)
        if model.text_mean is not None:
            model.text_mean.copy_(text[1:].mean(0))
        if config.whitening_init or config.adaptor == "whitening":
            model.adaptor.init_whitening(model.centred(text[1:]), torch.Generator().manual_seed(0))  # type: ignore[operator]
        return model

    def centred(self, text: torch.Tensor) -> torch.Tensor:
        """Text vectors as the adaptor sees them: less the catalogue's mean with model.text_centre."""
        return text if self.text_mean is None else text - self.text_mean

    def text_inputs(self, text_emb: torch.Tensor) -> torch.Tensor:
        """(n, D_text) text vectors -> (n, D) what the adaptor makes of them: the whole input vector of an
        item known only by its text (an added item has no ID vector)."""
        return self.adaptor(self.centred(text_emb))

    def scored(self, inputs: torch.Tensor) -> torch.Tensor:
        """Input vectors (..., D) -> the output vectors states are scored against: cos / τ."""
        return F.normalize(inputs, dim=-1) / self.config.temperature

    def embed_items(self, ids: torch.Tensor, text: torch.Tensor | None = None,
                    table: torch.Tensor | None = None) -> torch.Tensor:
        """(...) item ids -> (..., D) adapted vectors; the adaptor runs once per distinct item.
        `table` (N+1, D): rows of `input_table()` computed before, gathered instead."""
        if table is not None:
            return table[ids]
        uniq, inverse = torch.unique(ids, return_inverse=True)
        v = self.text_inputs((self.text_emb if text is None else text)[uniq])
        if self.item_emb is not None:
            v = v + self.item_emb(uniq)
        v = v * (uniq != 0).unsqueeze(-1)  # padding is the zero vector
        return v[inverse]

    def hidden(self, items: torch.Tensor, text: torch.Tensor | None = None,
               events: dict[str, torch.Tensor] | None = None, last_only: bool = False,
               table: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L) left-padded items -> (B, L, D) causal states (`last_only`: (B, 1, D), the last alone);
        `text` swaps in another view of the text, `table` the item vectors of `input_table()`."""
        positions = position_ids(items, self.max_len, align=self.config.positions_from)
        return self.encoder(self.inputs(items, positions, text, events, table), attention_mask(items, causal=True),
                            last_only)

    def inputs(self, items: torch.Tensor, positions: torch.Tensor, text: torch.Tensor | None = None,
               events: dict[str, torch.Tensor] | None = None, table: torch.Tensor | None = None) -> torch.Tensor:
        """(B, L) items at the given positions -> (B, L, D) Transformer inputs (0 at padding)."""
        x = self.embed_items(items, text, table)
        if self.feature_block is not None:
            x = self.feature_block(x, items, events)
        x = x + self.pos_emb(positions)
        return self.drop(self.in_ln(x)) * (items != 0).unsqueeze(-1)

    def encode(self, batch: Batch, table: torch.Tensor | None = None) -> torch.Tensor:
        """(B, D) states; `table`: every item's input vector computed before (`input_table`), which an
        exported encoder takes as an input so that items added by text reach it."""
        hidden = self.hidden(batch.items, events=batch.events, last_only=True, table=table)
        return F.normalize(hidden[:, -1], dim=-1)  # (B, D)

    def input_table(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """(N+1, D) the vector each item enters the sequence encoder with (its adapted text, plus its ID
        vector when transductive; row 0, padding, is zero); `ids`: those rows only."""
        if ids is None:
            ids = torch.arange(self.n_items + 1, device=self.text_emb.device)
        return self.embed_items(ids)

    def can_extend(self) -> bool:
        return self.config.positions_from == "start" and self.feature_block is None

    def extend(self, items: torch.Tensor, cache: Any | None) -> tuple[torch.Tensor, Any]:
        state, cache = extend_causal(self, items, cache)
        return F.normalize(state, dim=-1), cache

    def fit_data(self, data: PreparedDataset) -> None:
        """Items with no training event: left out of the training softmax (`softmax_items = "trained"`);
        transductive, their ID vectors are held at zero (there is nothing to learn them from). Either way
        they are scored from their text alone, as items added later by `add_items` are."""
        counts = train_item_counts(data)
        if self.sampler is not None:
            self.sampler.set_counts(counts)
        untrained = torch.as_tensor(counts == 0, device=self.text_emb.device)
        untrained[0] = False  # padding: never a candidate anyway
        self.untrained = untrained
        if self.item_emb is None or not self.item_emb.weight.requires_grad:
            return
        untrained = untrained.to(self.item_emb.weight.device)
        with torch.no_grad():
            self.item_emb.weight[untrained] = 0.0
        keep = (~untrained).to(self.item_emb.weight.dtype)[:, None]
        self.item_emb.weight.register_hook(lambda grad: grad * keep)  # as negatives they would get gradients

    def softmax_bias(self, n_rows: int, device: torch.device) -> torch.Tensor | None:
        """(N+1,) logit offsets of the training softmax: a large negative for the items it leaves out."""
        if (self.config.softmax_items == "all" or self.untrained is None
                or (n_rows == len(self.untrained) and not bool(self.untrained.any()))):
            return None
        out = torch.zeros(n_rows, device=device)
        out[: len(self.untrained)] = self.untrained.to(device).float() * LEFT_OUT
        out[len(self.untrained) :] = LEFT_OUT  # items added after fit_data have no training event either
        return out

    def item_embeddings(self) -> torch.Tensor:
        return self.scored(self.input_table())

    def item_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        return self.scored(self.input_table(ids))

    def loss(self, batch: Batch) -> torch.Tensor:
        """Softmax cross-entropy of cos(h, v) / τ over the catalogue (`softmax_items`), at every position
        with a target."""
        assert batch.targets is not None, "training batches carry targets"
        keep = batch.targets != 0
        states = F.normalize(self.hidden(batch.items, events=batch.events), dim=-1)  # (B, L, D)
        if self.sampler is not None:
            return self.sampled_loss(states[keep], batch.targets[keep])
        W = self.item_embeddings()
        bias = self.softmax_bias(W.shape[0], W.device)
        history = None if self.history is None else self.history.training_rows(states, batch.items, W, bias, keep)
        return full_ce(states[keep], W, bias, batch.targets[keep], history=history)

    def sampled_loss(self, h: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The sampled softmax of states h (M, D) against their targets (M,) and the batch's negatives: item
        vectors made for those items alone; items the training softmax leaves out are never negatives."""
        assert self.sampler is not None
        neg = self.sampler.sample((self.sampler.k,), h.device)
        ids, at = torch.unique(torch.cat([target, neg]), return_inverse=True)
        bias = self.softmax_bias(self.n_items + 1, h.device)
        log_q = self.sampler.log_q().to(h.device)
        return sampled_softmax(h, self.item_vectors(ids), None if bias is None else bias[ids], at[: len(target)],
                               at[len(target) :], log_q[target], log_q[neg])

    @torch.no_grad()
    def set_item_text(self, ids: torch.Tensor, text_emb: torch.Tensor) -> None:
        """Replace the text vectors (n, D_text) of existing items (their ID vectors are kept)."""
        self.text_emb[ids] = text_emb.to(self.text_emb)

    @torch.no_grad()
    def add_items(self, text_emb: torch.Tensor) -> range:
        """Append items known only by their text vectors (n, D_text); returns their new indices.

        Transductive models give them a zero ID vector: they are scored from text alone."""
        if text_emb.ndim != 2 or text_emb.shape[1] != self.config.text_dim:
            raise SeqrecError(f"new item vectors must be (n, {self.config.text_dim}), got {tuple(text_emb.shape)}")
        first = self.n_items + 1
        # appended after the rows in use, without a copy of the table per call (seqrec.nn.rows)
        self._text_store = append_rows(self.text_emb, text_emb, self._text_store)
        self.text_emb = self._text_store[: first + len(text_emb)]
        if self.item_emb is not None:
            old = self.item_emb.weight
            grown = nn.Embedding(old.shape[0] + len(text_emb), old.shape[1], padding_idx=0).to(old)
            grown.weight.zero_()
            grown.weight[: old.shape[0]] = old
            grown.requires_grad_(old.requires_grad)
            self.item_emb = grown
        self.n_items += len(text_emb)
        return range(first, self.n_items + 1)

    @torch.no_grad()
    def drop_items_from(self, first: int) -> None:
        """Undo `add_items`: keep the items before index `first` only."""
        self.text_emb = self.text_emb[:first].clone()
        self._text_store = None
        if self.item_emb is not None:
            kept = nn.Embedding(first, self.item_emb.weight.shape[1], padding_idx=0).to(self.item_emb.weight)
            kept.weight.copy_(self.item_emb.weight[:first])
            kept.requires_grad_(self.item_emb.weight.requires_grad)
            self.item_emb = kept
        self.n_items = first - 1
