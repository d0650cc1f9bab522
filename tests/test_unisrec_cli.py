"""`seqrec text encode`, `pretrain`, `finetune`, `train --model unisrec` and text-only new items, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from seqrec.cli import main
from seqrec.config import EvalConfig
from seqrec.data.dataset import PreparedDataset
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.eval.cold import cold_item_split, cold_mask, evaluate_cold_warm
from seqrec.models.sasrec import SASRec, SASRecConfig
from seqrec.train.checkpoint import load_checkpoint
from tests.conftest import synthetic_log
from tests.unisrec_helpers import TEXT_DIM, make_tiny_encoder

TINY = ["--set", "model.d=16", "--set", "model.n_layers=1", "--set", "model.n_heads=2", "--set", "model.d_ff=32",
        "--set", f"model.text_dim={TEXT_DIM}", "--set", "model.text_max_length=16", "--set", "model.n_experts=2"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("cli")
    enc = make_tiny_encoder(root / "enc")
    a = prepare(synthetic_log(seed=0), PrepareOptions(), root / "a").path
    b = prepare(synthetic_log(n_users=40, n_items=20, seed=1), PrepareOptions(), root / "b").path
    return enc, a, b


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def test_text_encode_caches(setup: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    enc, a, _ = setup
    args = ("text", "encode", str(a), "--encoder", str(enc), "--max-length", "16", "--no-progress")
    assert "encoded in" in run(capsys, *args)
    assert "reused" in run(capsys, *args)
    assert "encoded in" in run(capsys, *args, "--pooling", "cls")


@pytest.mark.parametrize("negatives", ["in-batch", "moco"])
def test_pretrain_then_finetune_both_settings(negatives: str, setup: tuple[Path, Path, Path], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    enc, a, b = setup
    pre = tmp_path / "pre"
    out = run(capsys, "pretrain", "--datasets", f"{a},{b}", "--negatives", negatives, "--out", str(pre),
              *TINY, "--set", f'model.text_encoder="{enc}"', "--set", "pretrain.epochs=2",
              "--set", "pretrain.max_len=8", "--set", "pretrain.batch_size=16", "--set", "pretrain.queue_size=32",
              "--set", "pretrain.progress=false")
    assert "steps" in out
    meta = json.loads((pre / "checkpoint" / "model.json").read_text())
    assert meta["n_items"] == 50 and meta["domains"] == {"synthetic": 0, "synthetic#2": 30}
    rows = [json.loads(line) for line in (pre / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) for r in rows)
    for setting in ("inductive", "transductive"):
        ft = tmp_path / f"ft-{setting}"
        out = run(capsys, "finetune", str(a), "--from", str(pre), "--setting", setting, "--out", str(ft),
                  "--set", "data.max_len=8", "--set", "train.epochs=2", "--set", "train.progress=false")
        assert "recall@10" in out
        model, meta = load_checkpoint(ft / "checkpoint")
        assert meta["config"]["item_ids"] == (setting == "transductive") and meta["config"]["freeze_encoder"]
        assert model.n_items == 30


def test_train_from_scratch_and_recommend_new_items(setup: tuple[Path, Path, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    enc, a, _ = setup
    run_dir = tmp_path / "run"
    run(capsys, "train", "--dataset", str(a), "--model", "unisrec", "--out", str(run_dir), *TINY,
        "--set", f'model.text_encoder="{enc}"', "--set", "data.max_len=8", "--set", "train.epochs=2",
        "--set", "train.progress=false")
    out = run(capsys, "recommend", str(run_dir), "--history", "i1 i2 brand-new", "-k", "3",
              "--new-item", "brand-new=item number 3", "--new-item", "other-new=red glue",
              "--candidates", "i4 other-new brand-new")
    lines = out.strip().splitlines()
    assert len(lines) == 3 and {line.split()[1] for line in lines} == {"i4", "other-new", "brand-new"}


def test_cold_item_split_and_cold_warm_metrics(tmp_path: Path, setup: tuple[Path, Path, Path]) -> None:
    data = PreparedDataset.load(setup[1])
    cold = cold_item_split(data, 0.3, seed=0, dest=tmp_path / "cold")
    mask = cold_mask(cold)
    users, pos = cold.eval_positions("test")
    targets = cold.items[cold.offsets[users] + pos]
    assert mask[targets].any() and cold.meta["options"]["cold_items"] >= 1
    # every chosen item is absent from every training prefix and from validation targets
    vusers, vpos = cold.eval_positions("valid")
    assert not mask[cold.items[cold.offsets[vusers] + vpos]].any()
    model = SASRec(SASRecConfig(d=16, n_heads=2), cold.n_items, 8)
    out = evaluate_cold_warm(model, cold, "test", 8, EvalConfig(ks=[10]), torch.device("cpu"))
    assert out["n_cold"] == int(mask[targets].sum()) and out["n_cold"] + out["n_warm"] == len(targets)
    assert set(out["cold"]) >= {"recall@10", "ndcg@10"}
