"""The side-by-side benchmarks against RecBole keep seqrec's model as plain as RecBole's: the history
bias is off unless a run asks for it ("auto" would turn it on for the full softmax)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import speed_vs_recbole  # noqa: E402
import zoo_vs_recbole  # noqa: E402

from seqrec.config import resolve  # noqa: E402


def test_speed_runs_are_plain_unless_named_hist() -> None:
    for name, (batch, stride, extra) in speed_vs_recbole.SEQREC_RUNS.items():
        cfg = resolve({}, speed_vs_recbole.seqrec_sets(batch, stride, extra))
        assert cfg.model.history_bias is ("-hist" in name), name
        assert (cfg.train.optimizer, cfg.train.ema, cfg.train.refit) == ("adam", 0.0, False)


def test_zoo_vs_recbole_gru4rec_is_plain_and_refuses_the_bias() -> None:
    cfg = zoo_vs_recbole.seqrec_config("GRU4Rec", [])
    assert cfg.model.history_bias is False
    assert "--hidden-size" in zoo_vs_recbole.recbole_hp("GRU4Rec", cfg)
    with pytest.raises(SystemExit, match="plain"):
        zoo_vs_recbole.recbole_hp("GRU4Rec", zoo_vs_recbole.seqrec_config("GRU4Rec", ["model.history_bias=true"]))
