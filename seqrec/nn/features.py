"""The feature block: side features -> vectors fused into the sequence input.

Continuous encoders (Transformers4Rec, "soft one-hot", Li et al. 2021; Gorishniy et al. 2022):

    n = (t(x) - μ) / σ                  t = identity or log1p; μ, σ from the training split
    soft one-hot   p = nW + b,  g = softmax(p) E      W, b: (1, P); E: (P, D)
    linear         g = n w                            w: (D,), no bias, so n = 0 adds nothing
    bucket         g = E[bucket(t(x))]                edges: training quantiles

Missing values (NaN) take a learned vector `missing` (zero at start) instead of g.
Categorical features: an embedding table over 0 = padding, 1 = unknown/missing,
2.. = the training vocabulary; multi-valued ones are mean-pooled over their values.

Fusion with the item embedding x (B, L, D):  sum  x + Σ_f g_f,  or  concat  [x, g_1..g_k] W_o.
Item-level values are per-item buffers (rows 0..N+1, N+1 = unknown, e.g. BERT4Rec's
mask), saved in the checkpoint, so candidates and history items carry the same
features in training, evaluation and serving; event values come with the batch.
Shapes: B batch, L length, D hidden, P soft one-hot size, W values per item.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from seqrec.data.features import FeatureInputs, FittedFeature
from seqrec.errors import SeqrecError

Z_LIMIT = 1e4  # standardised continuous values are clipped here (training values lie far inside)


class SoftOneHot(nn.Module):
    """g = softmax(nW + b) E: a scalar as a convex combination of P learned embeddings."""

    def __init__(self, d: int, size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(1, size)  # W (P, 1), b (P,): PyTorch's default uniform init spreads the logits
        self.table = nn.Parameter(torch.randn(size, d) * 0.02)  # E (P, D)

    def weights(self, n: torch.Tensor) -> torch.Tensor:
        """(...) normalised values -> (..., P) softmax weights."""
        return torch.softmax(self.proj(n.unsqueeze(-1)), dim=-1)

    def forward(self, n: torch.Tensor) -> torch.Tensor:
        return self.weights(n) @ self.table  # (..., D)


class LinearEncoder(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(d) * 0.02)

    def forward(self, n: torch.Tensor) -> torch.Tensor:
        return n.unsqueeze(-1) * self.w


class ContinuousInput(nn.Module):
    """Raw values (...) with NaN = missing -> (..., D); normalisation statistics are buffers."""

    def __init__(self, fitted: FittedFeature, d: int) -> None:
        super().__init__()
        spec = fitted.spec
        self.log1p, self.encoding = spec.transform == "log1p", spec.encoding
        self.mean: torch.Tensor
        self.std: torch.Tensor
        self.edges: torch.Tensor
        self.register_buffer("mean", torch.tensor(fitted.mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(fitted.std, dtype=torch.float32))
        self.register_buffer("edges", torch.tensor(fitted.edges, dtype=torch.float32))
        self.encoder: nn.Module
        if spec.encoding == "soft_one_hot":
            self.encoder = SoftOneHot(d, spec.size)
        elif spec.encoding == "linear":
            self.encoder = LinearEncoder(d)
        else:
            self.encoder = nn.Embedding(len(fitted.edges) + 1, d)
            nn.init.normal_(self.encoder.weight, std=0.02)
        self.missing = nn.Parameter(torch.zeros(d))

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """Transformed, standardised values, within +-Z_LIMIT (a finite value far outside the training
        range, e.g. 1e25 in a request, would overflow the layers after it); missing ones are 0 (the
        training mean)."""
        missing = ~torch.isfinite(x)
        x = torch.where(missing, torch.zeros_like(x), x.float())
        t = torch.log1p(x.clamp(min=0)) if self.log1p else x
        z = ((t - self.mean) / self.std).clamp(-Z_LIMIT, Z_LIMIT)
        return torch.where(missing | ~torch.isfinite(z), torch.zeros_like(t), z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        missing = ~torch.isfinite(x)
        if self.encoding == "bucket":
            t = torch.where(missing, torch.zeros_like(x), x.float())
            t = torch.log1p(t.clamp(min=0)) if self.log1p else t
            g = self.encoder((self.edges < t.unsqueeze(-1)).sum(-1))  # = torch.bucketize(t, edges), in ONNX too
        else:
            g = self.encoder(self.normalise(x))
        return torch.where(missing.unsqueeze(-1), self.missing.to(g.dtype), g)


def _exporting() -> bool:
    """Whether the module is being traced for ONNX (either exporter)."""
    return bool(torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting())


class CategoricalInput(nn.Module):
    """Indices (..., W) (0 = pad, 1 = unknown) -> (..., D), mean-pooled over the real values.

    Event-level categorical features arrive as raw numbers; `keys` maps them to indices."""

    def __init__(self, fitted: FittedFeature, d: int) -> None:
        super().__init__()
        self.table = nn.Embedding(len(fitted.vocab) + 2, d, padding_idx=0)
        nn.init.normal_(self.table.weight, std=0.02)
        with torch.no_grad():
            self.table.weight[0].zero_()
        keys = torch.tensor([float(v) for v in fitted.vocab] if fitted.spec.level == "event" else [],
                            dtype=torch.float64)
        self.keys: torch.Tensor
        self.register_buffer("keys", keys)

    def codes(self, x: torch.Tensor) -> torch.Tensor:
        """(...) raw numeric values -> (..., 1) indices; NaN and values unseen in training -> 1."""
        x = x.to(torch.float64)
        if len(self.keys) == 0:
            return torch.ones_like(x, dtype=torch.long).unsqueeze(-1)
        if _exporting():  # ONNX has no searchsorted: compare with every key, (..., V) (the export checks it)
            equal = x.unsqueeze(-1) == self.keys
            code = torch.where(equal.any(-1), equal.float().argmax(-1) + 2, torch.ones_like(x, dtype=torch.long))
            return code.unsqueeze(-1)
        sorted_keys, order = torch.sort(self.keys)
        pos = torch.searchsorted(sorted_keys, x).clamp(max=len(sorted_keys) - 1)
        hit = torch.isfinite(x) & (sorted_keys[pos] == x)
        return torch.where(hit, order[pos] + 2, torch.ones_like(pos)).unsqueeze(-1)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        count = (idx != 0).sum(-1, keepdim=True).clamp(min=1)
        return self.table(idx).sum(-2) / count  # (..., D): mean of the values' vectors


class FeatureBlock(nn.Module):
    """Fuses item-level and event-level feature vectors into the item embeddings of a sequence."""

    def __init__(self, inputs: FeatureInputs, n_items: int, d: int) -> None:
        super().__init__()
        self.fitted, self.fusion = inputs.fields, inputs.fusion
        self.event_names = [f.spec.name for f in self.fitted if f.spec.level == "event"]
        self.encoders = nn.ModuleDict()
        for f in self.fitted:
            self.encoders[f.spec.name] = (ContinuousInput(f, d) if f.spec.kind == "continuous"
                                          else CategoricalInput(f, d))
            if f.spec.level == "item":  # rows 0..N+1; zeros here are replaced by the checkpoint's values
                values = inputs.tables.get(f.spec.name) if inputs.tables else None
                shape = (n_items + 2,) if f.spec.kind == "continuous" else (n_items + 2, f.width)
                table = torch.as_tensor(values) if values is not None else torch.zeros(shape)
                if tuple(table.shape) != shape:
                    raise SeqrecError(f"item feature {f.spec.name!r}: table shape {tuple(table.shape)} != {shape}")
                kind = torch.float32 if f.spec.kind == "continuous" else torch.long
                self.register_buffer(f"item_{f.spec.name}", table.to(kind))
        self.proj = nn.Linear(d * (1 + len(self.fitted)), d) if self.fusion == "concat" else None

    def item_values(self, name: str, items: torch.Tensor) -> torch.Tensor:
        table: torch.Tensor = getattr(self, f"item_{name}")
        return table[items.clamp(max=table.shape[0] - 1)]  # ids past the table (new items): unknown

    def forward(self, x: torch.Tensor, items: torch.Tensor,
                events: Mapping[str, torch.Tensor] | None) -> torch.Tensor:
        """x (B, L, D) item embeddings, items (B, L), events name -> (B, L) raw values -> (B, L, D)."""
        parts = []
        for f in self.fitted:
            name, enc = f.spec.name, self.encoders[f.spec.name]
            if f.spec.level == "item":
                parts.append(enc(self.item_values(name, items)))
                continue
            if events is None or name not in events:
                raise SeqrecError(f"the batch lacks event feature {name!r}")
            value = events[name]
            parts.append(enc(enc.codes(value)) if isinstance(enc, CategoricalInput) else enc(value))
        if self.proj is not None:
            return self.proj(torch.cat([x, *[p.to(x.dtype) for p in parts]], dim=-1))
        return x + torch.stack(parts).sum(0).to(x.dtype)
