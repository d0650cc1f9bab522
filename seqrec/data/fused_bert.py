"""A fused forward pass of a BERT-architecture text encoder for bf16 on a CPU with native bf16.

The Hugging Face BertModel runs, per layer, three query/key/value products, attention, an output
product, an add and a layer norm, an FFN product, a GELU pass over its (B, T, 4D) output, a second
product, an add and a layer norm. On a CPU with AMX, the products are fast enough that the GELU pass,
the adds and `addmm`'s bias copies take a large share of the time (torch.profiler shows it). Here
the three projections are one product, the
GELU and the residual adds are oneDNN post-ops of the products they follow (the fused kernels
torch.compile's CPU backend calls, `torch.ops.mkldnn._linear_pointwise`), and the layers' weights
are the model's own tensors (nothing copied but the concatenated QKV). The products, adds and norms
run on a batch's real tokens packed together, not on its padding; attention alone takes the padded
(B, T) layout. Same function, fewer passes over memory and no work on padding:
benchmarks/text_encode.py measures it against the model's own forward.

`fused_forward(model)` returns the pass for models it reproduces (BERT with absolute positions,
exact GELU, an encoder, bf16 weights on the CPU), after checking it against the model's own forward
on a probe batch; otherwise None, and TextEncoder calls the model. Shapes: B texts, T tokens, D
hidden, H heads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (input_ids, attention_mask) -> (B, T, D)
PROBE_COSINE = 1e-3  # the probe batch's largest cosine distance from the model's own forward
PACK_TOKENS = True  # the products and norms run on the real tokens alone (benchmarks/text_encode.py: without)
PREPACK_WEIGHTS = True  # the products' weights in oneDNN's blocked layout once (benchmarks/text_encode.py: without)


class _Layer:
    """One BERT layer's weights, QKV concatenated (3D, D); with PREPACK_WEIGHTS, each product's weight
    reordered once into the blocked layout oneDNN computes with, which a plain weight is reordered into
    at every call (a pass over every weight per call: a third of the time of one short text)."""

    def __init__(self, layer: Any) -> None:
        att = layer.attention
        parts = (att.self.query, att.self.key, att.self.value)
        self.w_qkv = _packed(torch.cat([p.weight for p in parts]).contiguous())
        self.b_qkv = torch.cat([p.bias for p in parts]).contiguous()
        out, ffn1, ffn2 = att.output.dense, layer.intermediate.dense, layer.output.dense
        self.w_out, self.w_ffn1, self.w_ffn2 = _packed(out.weight), _packed(ffn1.weight), _packed(ffn2.weight)
        self.b_out, self.b_ffn1, self.b_ffn2 = out.bias, ffn1.bias, ffn2.bias
        self.norm1, self.norm2 = att.output.LayerNorm, layer.output.LayerNorm


def _packed(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach()) if PREPACK_WEIGHTS else weight


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, act: str = "none") -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, act, [], "none")  # "none": the exact (erf) GELU


def _linear_add(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise.binary(x, residual, weight, bias, "add")


def kernels_available() -> bool:
    """Whether this torch has oneDNN and its fused linear kernels."""
    return (hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and torch.backends.mkldnn.is_available())


def reproducible(model: Any) -> bool:
    """Whether the fused pass computes what `model` computes, and this torch has the fused kernels."""
    cfg = model.config
    first = next(model.parameters())
    return (getattr(cfg, "model_type", "") == "bert" and cfg.hidden_act == "gelu"
            and getattr(cfg, "position_embedding_type", "absolute") == "absolute"
            and not getattr(cfg, "is_decoder", False) and first.device.type == "cpu"
            and first.dtype == torch.bfloat16 and kernels_available())


def fused_forward(model: Any, probe: Callable[[], dict[str, torch.Tensor]]) -> Forward | None:
    """The fused pass of `model` (the last hidden states, as the model's `last_hidden_state` at the real
    tokens; zero at padded positions), or None
    where it does not apply or where it differs from the model's own forward on the batch `probe()`
    makes (made only where the pass applies)."""
    if not reproducible(model):
        return None
    batch = probe()
    layers: list[_Layer] = []  # made in the probe's try: a torch may lack the reorder
    heads = int(model.config.num_attention_heads)

    @torch.no_grad()
    def forward(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = model.embeddings(input_ids=input_ids)  # (B, T, D), the model's own embeddings and layer norm
        b, t, d = x.shape
        mask = torch.zeros((b, 1, 1, t), dtype=x.dtype, device=x.device)  # (B, 1, 1, T) additive, over keys
        mask.masked_fill_(attention_mask[:, None, None, :] == 0, torch.finfo(x.dtype).min)
        x = x.reshape(b * t, d)
        tokens = attention_mask.reshape(-1).nonzero().squeeze(1)  # (M,) the real tokens
        # nothing padded (or packing off): the (B, T) layout throughout
        real = tokens if PACK_TOKENS and len(tokens) < b * t else None
        if real is not None:
            x = x.index_select(0, real)  # (M, D): the products and norms see no padding
        for layer in layers:
            qkv = _linear(x, layer.w_qkv, layer.b_qkv)
            if real is not None:  # attention on the (B, T) layout, padded positions zero and masked
                qkv = qkv.new_zeros((b * t, 3 * d)).index_copy_(0, real, qkv)
            qkv = qkv.view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            att = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask)  # (B, H, T, D/H)
            att = att.transpose(1, 2).reshape(b * t, d)
            if real is not None:
                att = att.index_select(0, real)
            x = layer.norm1(_linear_add(att, x, layer.w_out, layer.b_out))
            x = layer.norm2(_linear_add(_linear(x, layer.w_ffn1, layer.b_ffn1, "gelu"), x, layer.w_ffn2, layer.b_ffn2))
        if real is not None:  # padded positions: zero (pooling reads the real ones)
            x = x.new_zeros((b * t, d)).index_copy_(0, real, x)
        return x.view(b, t, d)

    try:
        with torch.no_grad():
            layers.extend(_Layer(layer) for layer in model.encoder.layer)
            mine, theirs = forward(**batch).float(), model(**batch).last_hidden_state.float()
    except (RuntimeError, AttributeError, TypeError) as exc:  # a kernel (or its overload) this torch lacks
        log.info("text encoder: the fused bf16 pass cannot run here (%s); using the model's own", exc)
        return None
    keep = batch["attention_mask"].bool()
    distance = float((1 - F.cosine_similarity(mine[keep], theirs[keep], dim=-1)).max())
    if distance > PROBE_COSINE:
        log.info("text encoder: the fused bf16 pass is %.1e from the model's own; using the model's", distance)
        return None
    return forward
