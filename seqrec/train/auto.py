"""Settings read from the data: `"auto"` values of a model config, decided from the training split.

    model.history_bias = "auto"   on wherever the loss is the full softmax the offset enters: it learns
                                  its sign from the training sequences, pushing seen items down where
                                  users rarely return (the Amazon builds) and up where returns are
                                  common (diginetica: benchmarks/history_bias.py); the decision records
                                  the repeat rate. Off for a sampled loss and GRU4Rec's session-parallel
                                  batches.

    data.stride = "auto"          overlapping training windows (a stride of max_len / 5) when more than
                                  LONG_SHARE of the training targets lie beyond the last max_len items
                                  of their user's training history (MovieLens), else consecutive ones
    data.jitter = "auto"          window boundaries redrawn each epoch when windows overlap

    model.loss = "auto"           the full softmax ("ce") unless its output layer would cost more than
                                  CE_EPOCH_SECONDS per epoch (6 x training targets x items x d FLOPs at
                                  the nominal rate of the training device: NOMINAL_FLOPS a CPU thread, or
                                  a CUDA device's; fixed figures, so one dataset and command always get one
                                  loss, where a rate measured at run time moved with the machine's load):
                                  then a sampled softmax with SAMPLED_NEGATIVES popularity
                                  negatives per batch and the logQ correction. Memory does not decide
                                  it: the full softmax is computed in bounded chunks
                                  (seqrec.nn.losses.full_ce). A history bias asked for keeps "ce".
    train.sparse_items = "auto"   sparse item-table gradients, only the touched rows updated
                                  (seqrec.train.sparse), with a sampled loss over SPARSE_ITEMS items or more
    train.batch_size = "auto"     BATCH_SIZE (the batch every benchmark validated with), halved while
                                  a step's estimated memory (activations, the loss's logits, the item
                                  table with its gradient and Adam moments) exceeds half the memory free
                                  on the training device (down to MIN_BATCH_SIZE)

`resolve_auto` (model settings), `resolve_auto_data` (data settings) and `resolve_auto_train` (the
loss and the batch size, which depend on the machine as well) replace each "auto" by its
decision before the model is built and return the decisions (`log_decisions` logs them with their
reasons: `fit` does once the run's inputs proved usable, so a refused run prints only its error),
which the run records in results.json under `auto`; the saved config holds the decided value, so the
run is reproducible without the data.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import torch

from seqrec.data.dataset import PreparedDataset
from seqrec.nn.losses import CHUNK_ELEMENTS

log = logging.getLogger(__name__)

RETURNS_COMMON = 0.05  # above this repeat rate the history offsets are expected to come out positive (the log says)
LONG_SHARE = 0.10  # overlapping windows when more training targets than this lie beyond one window
CE_EPOCH_SECONDS = 600.0  # the most time per epoch the full softmax's output layer may take
# the output layer's rate the loss rule assumes (FLOP/s): a CPU thread's (its matmul plus the softmax's reading
# and writing of every logit) and a CUDA device's fp32 rate, both below what current hardware measures
NOMINAL_FLOPS = {"cpu": 10e9, "cuda": 10e12}
SAMPLED_NEGATIVES = 1024  # negatives per batch of the sampled softmax "auto" falls back to
BATCH_SIZE, MIN_BATCH_SIZE = 128, 8
SPARSE_ITEMS = 100_000  # sparse item-table gradients from this catalogue size on (with a sampled loss)


def resolve_auto_data(data_cfg: Any, data: PreparedDataset) -> list[dict[str, Any]]:
    """Decide the "auto" settings of `data_cfg` (`[data]`, in place) from `data`'s training split."""
    decisions = []
    if data_cfg.stride == "auto":
        n = np.maximum(data.train_end() - 1, 0)  # targets of each user's training events
        total = int(n.sum())
        share = 1 - int(np.minimum(n, data_cfg.max_len).sum()) / max(total, 1)
        long = share > LONG_SHARE
        data_cfg.stride = max(1, data_cfg.max_len // 5) if long else 0
        reason = (f"{share:.0%} of the training targets lie beyond the last max_len={data_cfg.max_len} items of "
                  f"their user's history ({'>' if long else '<='} {LONG_SHARE:.0%}): "
                  + ("overlapping windows, each target seen with more context" if long else "consecutive windows"))
        decisions.append({"key": "data.stride", "value": data_cfg.stride, "reason": reason,
                          "share_beyond_one_window": share})
    if data_cfg.jitter == "auto":
        data_cfg.jitter = data_cfg.stride > 0
        decisions.append({"key": "data.jitter", "value": data_cfg.jitter,
                          "reason": "windows overlap: boundaries redrawn each epoch" if data_cfg.jitter
                          else "consecutive windows: nothing to redraw"})
    return decisions


def resolve_auto(model_cfg: Any, data: PreparedDataset, built: Any = None) -> list[dict[str, Any]]:
    """Decide every "auto" setting of `model_cfg` (in place) from `data`'s training split. For a model
    already `built` (one given to fine-tune) the decision is what it was built with."""
    decisions = []
    if getattr(model_cfg, "history_bias", None) == "auto":
        if built is not None:
            has = getattr(built, "history", None) is not None
            model_cfg.history_bias = has
            decisions.append({"key": "model.history_bias", "value": has,
                              "reason": f"the given model was built {'with' if has else 'without'} it"})
        else:
            decisions.append(_history_bias(model_cfg, data))
    return decisions


def _history_bias(model_cfg: Any, data: PreparedDataset) -> dict[str, Any]:
    rate = data.repeat_rates()["repeat_rate"]
    if getattr(model_cfg, "loss", "ce") not in ("ce", "auto"):  # "auto" undecided: the full softmax
        value, reason = False, f"model.loss={model_cfg.loss!r}: the offset needs the full softmax ('ce')"
    elif getattr(model_cfg, "session_parallel", False):
        value, reason = False, "GRU4Rec's session-parallel batches mix sessions in a lane"
    else:
        value, reason = True, (f"{rate:.1%} of training events return to an item the user had: the offsets "
                               f"learn to push seen items {'down' if rate < RETURNS_COMMON else 'up'}")
    model_cfg.history_bias = value
    return {"key": "model.history_bias", "value": value, "reason": reason, "repeat_rate": rate}


def resolve_auto_train(model_cfg: Any, train_cfg: Any, max_len: int, data: PreparedDataset,
                       device: torch.device, built: Any = None) -> list[dict[str, Any]]:
    """Decide `model.loss` and `train.batch_size` when "auto" (in place) from the catalogue, the
    training split and `device`. Before `resolve_auto` (the history bias depends on the loss)."""
    decisions = []
    if getattr(model_cfg, "loss", None) == "auto":
        decisions.append(_loss(model_cfg, data, device, built))
    if train_cfg.batch_size == "auto":
        decisions.append(_batch_size(model_cfg, train_cfg, max_len, data, device))
    if getattr(train_cfg, "sparse_items", None) == "auto":
        decisions.append(_sparse_items(model_cfg, train_cfg, data, built))
    return decisions


def _sparse_items(model_cfg: Any, train_cfg: Any, data: PreparedDataset, built: Any) -> dict[str, Any]:
    loss = built.objective.kind if built is not None and hasattr(built, "objective") else getattr(
        model_cfg, "loss", "ce")
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    item2vec = getattr(model_cfg, "name", "") == "item2vec"  # negative sampling: it has no model.loss
    sampled = "item2vec's negative sampling" if item2vec else f"model.loss={loss!r}"
    if loss in ("ce", "auto") and not item2vec:
        value, reason = False, "the full softmax's gradient reaches every row of the table anyway"
    elif getattr(model_cfg, "name", "") == "bert4rec":
        value, reason = False, "BERT4Rec's output reads a slice of its table (its MASK row is not an item)"
    elif distributed:
        value, reason = False, "data-parallel ranks exchange dense gradients"
    elif data.n_items < SPARSE_ITEMS:
        value, reason = False, (f"{data.n_items:,} items (< {SPARSE_ITEMS:,}): the dense gradient of the table "
                                "is a small part of a step")
    else:
        value, reason = True, (f"{sampled} over {data.n_items:,} items (>= {SPARSE_ITEMS:,}): a step "
                               "touches a few thousand rows, so only those get a gradient and an update")
    train_cfg.sparse_items = value
    return {"key": "train.sparse_items", "value": value, "reason": reason}


def log_decisions(decisions: list[dict[str, Any]]) -> None:
    for d in decisions:
        log.info("auto: %s = %s (%s)", d["key"], d["value"], d["reason"])


def apply_decisions(cfg: Any, decisions: list[dict[str, Any]]) -> None:
    """Set what `resolve_auto_train` decided (perhaps on another rank) on the run config `cfg`."""
    for d in decisions:
        for key, value in {d["key"]: d["value"], **d.get("also", {})}.items():
            section, name = key.split(".")
            setattr(getattr(cfg, section), name, value)


def nominal_flops(device: torch.device) -> float:
    """The output layer's FLOP/s the loss rule assumes on `device` (NOMINAL_FLOPS): per CPU thread torch uses,
    or a CUDA device's (other devices: the CPU's)."""
    if device.type == "cuda":
        return NOMINAL_FLOPS["cuda"]
    return NOMINAL_FLOPS["cpu"] * torch.get_num_threads()


def _loss(model_cfg: Any, data: PreparedDataset, device: torch.device, built: Any) -> dict[str, Any]:
    if built is not None:  # a model given to fine-tune keeps its objective
        kind = built.objective.kind
        model_cfg.loss = kind
        return {"key": "model.loss", "value": kind, "reason": "the given model was built with it"}
    if getattr(model_cfg, "history_bias", None) is True:
        model_cfg.loss = "ce"
        return {"key": "model.loss", "value": "ce",
                "reason": "model.history_bias=true: its offsets enter the full softmax"}
    targets = int(np.maximum(data.train_end() - 1, 0).sum())
    d = int(getattr(model_cfg, "d", 64))
    rate = nominal_flops(device)
    seconds = 6.0 * targets * data.n_items * d / rate
    costs = (f"the full softmax's output layer: 6 x {targets:,} targets x {data.n_items:,} items x d={d} FLOPs "
             f"= {seconds:.0f} s per epoch at the nominal {rate / 1e9:.0f} GFLOP/s of {device.type}"
             + (f" with {torch.get_num_threads()} thread(s)" if device.type != "cuda" else ""))
    out = {"key": "model.loss", "epoch_output_seconds": seconds, "nominal_gflops": rate / 1e9}
    if seconds <= CE_EPOCH_SECONDS or data.n_items <= 4 * SAMPLED_NEGATIVES:
        model_cfg.loss = "ce"
        return {**out, "value": "ce", "reason": f"{costs} (<= {CE_EPOCH_SECONDS:.0f} s): the full softmax"}
    # the sampled loss's settings, where the config left them at their defaults (uniform, no logQ, 1 negative)
    also = {"model.negatives": "popularity" if model_cfg.negatives == "uniform" else model_cfg.negatives,
            "model.logq": True, "model.n_negatives": SAMPLED_NEGATIVES if model_cfg.n_negatives == 1
            else model_cfg.n_negatives}
    model_cfg.loss = "sampled_softmax"
    model_cfg.negatives, model_cfg.logq, model_cfg.n_negatives = also.values()
    return {**out, "value": "sampled_softmax", "also": also,
            "reason": f"{costs} (> {CE_EPOCH_SECONDS:.0f} s): a sampled softmax, {SAMPLED_NEGATIVES} popularity "
                      "negatives per batch with the logQ correction"}


def free_memory(device: torch.device) -> int:
    """Bytes free for training on `device`: CUDA's free memory, or the host's available memory."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:  # Linux: MemAvailable counts the page cache the kernel would give back, MemFree does not
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # no sysconf: assume a small machine
        return 4 << 30


def step_bytes(model_cfg: Any, batch: int, max_len: int, n_items: int) -> int:
    """A training step's memory, estimated: activations kept for the backward pass (per position and
    layer: ~16 d + 2 d_ff + 2 heads x L floats in a Transformer, 12 d in a GRU), the loss's logits
    (the full softmax materialises at most CHUNK_ELEMENTS at once, forward and backward) and the item
    table with its gradient and two Adam moments."""
    d = int(getattr(model_cfg, "d", 64))
    layers = int(getattr(model_cfg, "n_layers", 1))
    if hasattr(model_cfg, "d_ff"):
        per_position = layers * (16 * d + 2 * int(model_cfg.d_ff) + 2 * int(getattr(model_cfg, "n_heads", 1)) * max_len)
    else:
        per_position = layers * 12 * d
    activations = batch * max_len * (per_position + 4 * d)
    targets = batch * max_len
    if getattr(model_cfg, "loss", "ce") == "ce":
        logits = 3 * min(targets * n_items, CHUNK_ELEMENTS)
    else:
        logits = 3 * targets * max(int(getattr(model_cfg, "n_negatives", 1)), 1)
    table = 4 * (n_items + 1) * d
    return 4 * (activations + logits + table)


def _batch_size(model_cfg: Any, train_cfg: Any, max_len: int, data: PreparedDataset,
                device: torch.device) -> dict[str, Any]:
    budget = free_memory(device) // 2
    batch = BATCH_SIZE
    while batch > MIN_BATCH_SIZE and step_bytes(model_cfg, batch, max_len, data.n_items) > budget:
        batch //= 2
    need = step_bytes(model_cfg, batch, max_len, data.n_items)
    train_cfg.batch_size = batch
    gib = 1 << 30
    if batch == BATCH_SIZE:
        reason = (f"a step at batch {batch} needs ~{need / gib:.2f} GiB, within half the {2 * budget / gib:.1f} GiB "
                  f"free on {device.type}")
    else:
        full = step_bytes(model_cfg, BATCH_SIZE, max_len, data.n_items)
        reason = (f"a step at batch {BATCH_SIZE} would need ~{full / gib:.2f} GiB, over half the "
                  f"{2 * budget / gib:.1f} GiB free on {device.type}: batch {batch} (~{need / gib:.2f} GiB)")
        if need > budget:
            reason += ", still over: expect to run out of memory (lower model.d, data.max_len or the catalogue)"
    return {"key": "train.batch_size", "value": batch, "reason": reason, "step_gib": need / gib,
            "free_gib": 2 * budget / gib}
