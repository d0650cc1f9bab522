"""Settings read from the data: `"auto"` values of a model config, decided from the training split.

    model.history_bias = "auto"   on when users rarely return to items they already have (repeat rate
                                  of the training events below REPEAT_RATE_ON): the learned offset then
                                  pushes seen items down, as the Amazon builds reward; off when repeats
                                  are common (the model scores a return itself) or the loss is not the
                                  full softmax the offset enters.

    data.stride = "auto"          overlapping training windows (a stride of max_len / 5) when more than
                                  LONG_SHARE of the training targets lie beyond the last max_len items
                                  of their user's training history (MovieLens), else consecutive ones
    data.jitter = "auto"          window boundaries redrawn each epoch when windows overlap

`resolve_auto` (model settings) and `resolve_auto_data` (data settings) replace each "auto" by its
decision before the model is built, log it with its reason and return the decisions, which the run
records in results.json under `auto`; the saved config holds the decided value, so the run is
reproducible without the data.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from seqrec.data.dataset import PreparedDataset

log = logging.getLogger(__name__)

REPEAT_RATE_ON = 0.05  # a history bias when fewer training events than this return to a seen item
LONG_SHARE = 0.10  # overlapping windows when more training targets than this lie beyond one window


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
    for d in decisions:
        log.info("auto: %s = %s (%s)", d["key"], d["value"], d["reason"])
    return decisions


def resolve_auto(model_cfg: Any, data: PreparedDataset, built: Any = None) -> list[dict[str, Any]]:
    """Decide every "auto" setting of `model_cfg` (in place) from `data`'s training split. For a model
    already `built` (one given to fine-tune) the decision is what it was built with."""
    decisions = []
    if getattr(model_cfg, "history_bias", None) == "auto":
        if built is not None:
            has = getattr(built, "history", None) is not None
            model_cfg.history_bias = has
            decisions.append({"key": "history_bias", "value": has,
                              "reason": f"the given model was built {'with' if has else 'without'} it"})
        else:
            decisions.append(_history_bias(model_cfg, data))
    for d in decisions:
        log.info("auto: model.%s = %s (%s)", d["key"], d["value"], d["reason"])
    return decisions


def _history_bias(model_cfg: Any, data: PreparedDataset) -> dict[str, Any]:
    rate = data.repeat_rates()["repeat_rate"]
    if getattr(model_cfg, "loss", "ce") != "ce":
        value, reason = False, f"model.loss={model_cfg.loss!r}: the offset needs the full softmax ('ce')"
    elif getattr(model_cfg, "session_parallel", False):
        value, reason = False, "GRU4Rec's session-parallel batches mix sessions in a lane"
    elif rate < REPEAT_RATE_ON:
        value, reason = True, (f"{rate:.1%} of training events return to an item the user had "
                               f"(< {REPEAT_RATE_ON:.0%}): learn to push seen items down")
    else:
        value, reason = False, (f"{rate:.1%} of training events return to an item the user had "
                                f"(>= {REPEAT_RATE_ON:.0%}): returns are common, the model scores them itself")
    model_cfg.history_bias = value
    return {"key": "history_bias", "value": value, "reason": reason, "repeat_rate": rate}
