"""The weight initialisation shared by the Transformer models (BERT-style truncated-free normal)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import nn


def _normal_init(module: nn.Module, std: float) -> None:
    """Linear and embedding weights ~ N(0, std), biases 0, padding rows 0."""
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.Embedding) and module.padding_idx is not None:
        nn.init.zeros_(module.weight[module.padding_idx])


def normal_init(std: float) -> Callable[[nn.Module], None]:
    """A function for `module.apply(...)`."""
    return partial(_normal_init, std=std)
