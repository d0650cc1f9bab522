"""Exact resume: everything a training run needs to go on as if it had never stopped.

After every epoch, `fit` writes `state/` in the run folder (atomically, so a crash while
writing leaves the previous state whole):
    model.safetensors      the current weights (not the best: those are in checkpoint/)
    ema.safetensors        with `train.ema`: the running average of the weights
    optimizer.safetensors  every tensor of the optimizer state, keyed "<param index>.<name>"
    state.json             loop counters (epoch, best, patience, elapsed time, history), the
                           optimizer's param groups and scalar state, and the random states:
                           Python's, torch's (CPU and CUDA, as byte lists) and the batch feeder's
                           NumPy generator
`seqrec train --resume RUN` reads it back; resumed and uninterrupted runs give the same
weights and metrics. No pickle: tensors go through safetensors, the rest is JSON.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from seqrec.data.io import atomic_dir, read_json
from seqrec.errors import SeqrecError
from seqrec.models.base import EpochBatches, SequentialModel
from seqrec.train.checkpoint import load_weights, one_line, save_weights
from seqrec.train.ema import WeightAverage


@dataclass
class LoopState:
    """The early-stopping loop's counters after `epoch` epochs."""

    epoch: int = 0
    best: float = -1.0
    best_epoch: int = 0
    bad: int = 0
    elapsed_s: float = 0.0
    stopped: bool = False  # early stopping or the time budget ended the epochs
    stopped_by: str | None = None  # which of the two did, for results.json
    init_items_from: str | None = None  # the run whose item vectors initialised the model (a refit needs it)
    dataset_fingerprint: str | None = None  # what it trains on: a resume on other data is refused
    auto: list[dict[str, Any]] = field(default_factory=list)  # what the auto settings decided (config.json has the
    # values only), for results.json
    processes: list[int] = field(default_factory=list)  # data-parallel processes, of the first start and each resume
    origin: dict[str, Any] | None = None  # fine-tuning: the pre-trained run it started from (transfer.Origin)
    interpolation: dict[str, Any] | None = None  # fine-tuning: the weight mixes validated and the one kept, once done
    history: list[dict[str, Any]] = field(default_factory=list)


def _rng_state(batches: EpochBatches) -> dict[str, Any] | None:
    rng = getattr(batches, "rng", None)
    return dict(rng.bit_generator.state) if isinstance(rng, np.random.Generator) else None


def save_state(dest: Path, loop: LoopState, model: SequentialModel, opt: torch.optim.Optimizer,
               batches: EpochBatches, ema: WeightAverage | None = None) -> None:
    opt_state = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, slots in opt_state["state"].items():
        for name, value in slots.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[name] = value
    meta = {
        "loop": loop.__dict__,
        "optimizer": {"param_groups": opt_state["param_groups"], "scalars": scalars},
        "random": {
            "python": _jsonable(random.getstate()),
            "torch": torch.get_rng_state().tolist(),
            "cuda": [s.tolist() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
            "batches": _rng_state(batches),
        },
        "ema_updates": None if ema is None else ema.updates,
    }
    with atomic_dir(dest) as tmp:
        save_weights(model, tmp / "model.safetensors")
        if ema is not None:
            save_weights(ema.model, tmp / "ema.safetensors")
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "state.json").write_text(json.dumps(meta) + "\n")


def load_state(src: Path, model: SequentialModel, opt: torch.optim.Optimizer,
               batches: EpochBatches, ema: WeightAverage | None = None) -> LoopState:
    """Restore weights (and their running average), optimizer, random states and the feeder's generator;
    return the loop counters."""
    if not (src / "state.json").is_file():
        raise SeqrecError(f"{src.parent}: nothing to resume (no {src.name}/state.json)")
    meta = read_json(src / "state.json")
    if (ema is None) != (meta.get("ema_updates") is None):
        raise SeqrecError(f"{src.parent}: train.ema differs from the run being resumed; resume with its config")
    files = ("model.safetensors", *(["ema.safetensors"] if ema is not None else []))
    missing = [f for f in files if not (src / f).is_file()]
    if missing:
        raise SeqrecError(f"{src}: {missing[0]} is missing, so the run cannot be resumed; train it again (--overwrite)")
    try:
        load_weights(model, src / "model.safetensors")
        if ema is not None:
            load_weights(ema.model, src / "ema.safetensors")
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise SeqrecError(f"{src}: the saved weights do not load into this run's model ({one_line(exc)})") from None
    if ema is not None:
        ema.updates = int(meta["ema_updates"])
    flat = load_file(str(src / "optimizer.safetensors"))
    per_param: dict[int, dict[str, Any]] = {}
    for key, value in flat.items():
        idx, name = key.split(".", 1)
        per_param.setdefault(int(idx), {})[name] = value
    for idx, slots in meta["optimizer"]["scalars"].items():
        per_param.setdefault(int(idx), {}).update(slots)
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["optimizer"]["param_groups"]]
    opt.load_state_dict({"state": per_param, "param_groups": groups})
    rnd = meta["random"]
    random.setstate(_tuples(rnd["python"]))
    torch.set_rng_state(torch.tensor(rnd["torch"], dtype=torch.uint8))
    if rnd["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in rnd["cuda"]])
    rng = getattr(batches, "rng", None)
    if rnd["batches"] is not None and isinstance(rng, np.random.Generator):
        rng.bit_generator.state = rnd["batches"]
    return LoopState(**meta["loop"])


def saved_origin(src: Path) -> dict[str, Any] | None:
    """The pre-trained starting point a saved fine-tuning run recorded (None: trained from scratch, or no state)."""
    try:
        origin = read_json(src / "state.json")["loop"].get("origin")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, SeqrecError):
        return None  # no usable state: load_state says why
    return origin if isinstance(origin, dict) else None


def _jsonable(x: Any) -> Any:
    return [_jsonable(v) for v in x] if isinstance(x, tuple | list) else x


def _tuples(x: Any) -> Any:
    """random.getstate() is nested tuples; JSON gave lists back."""
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x
