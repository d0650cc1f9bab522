"""The running average of the weights (`train.ema`): its arithmetic, and that validation, the
checkpoint and a refit use the averaged weights, not the trained ones."""

from pathlib import Path

import pytest
import torch

from seqrec.cli.common import run_config
from seqrec.config import resolve
from seqrec.data.dataset import PreparedDataset
from seqrec.errors import SeqrecError
from seqrec.train import loop
from seqrec.train.checkpoint import load_checkpoint
from seqrec.train.ema import WeightAverage


def test_average_by_hand(tiny_dataset: PreparedDataset) -> None:
    cfg = resolve({}, [f'data.dataset="{tiny_dataset.path}"', 'model.name="sasrec"', "model.d=8"])
    model, _, _, _ = loop.setup(cfg, tiny_dataset, torch.device("cpu"))
    ema = WeightAverage(model, decay=0.5)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    expected = dict(start)
    for step, shift in enumerate([1.0, -2.0, 3.0]):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(shift)
        d = min(0.5, (1 + step) / (10 + step))  # the warm-up keeps the first updates close to the weights
        raw = model.state_dict()
        expected = {k: d * expected[k] + (1 - d) * raw[k] for k in raw}
        ema.update(model)
    assert ema.updates == 3
    for key, value in ema.model.state_dict().items():
        assert torch.allclose(value, expected[key], atol=1e-6), key
    assert not any(p.requires_grad for p in ema.model.parameters())


def test_checkpoint_and_refit_hold_the_averaged_weights(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    sets = [f'data.dataset="{tiny_dataset.path}"', 'model.name="sasrec"', "model.d=8", "model.dropout=0.3",
            "train.epochs=1", "train.batch_size=4", "train.threads=1", "train.progress=false",
            "train.ema=0.8", "train.refit=false"]
    cfg = resolve({}, sets)
    loop.fit(cfg, tiny_dataset, tmp_path / "run")
    saved, _ = load_checkpoint(tmp_path / "run" / "checkpoint")
    cfg = run_config(tmp_path / "run")  # what the run's "auto" settings became (fit leaves `cfg` as it was)

    # the same seeded epoch by hand: the checkpoint is its running average, not its last weights
    model, opt, batches, step = loop.setup(cfg, tiny_dataset, torch.device("cpu"))
    ema = WeightAverage(model, 0.8)
    loop.train_epoch(model, batches, opt, cfg, torch.device("cpu"), 1, step, ema)
    assert ema.updates == len(batches) > 1
    for key, value in saved.state_dict().items():
        assert torch.allclose(value, ema.model.state_dict()[key], atol=1e-6), key
    assert not torch.allclose(saved.item_emb.weight, model.item_emb.weight)

    refit = loop.refit(cfg, tiny_dataset, torch.device("cpu"), epochs=1)
    assert not any(p.requires_grad for p in refit.parameters())  # the average, not the trained model


def test_ema_out_of_range_is_a_config_error() -> None:
    for value in ("1.0", "-0.1"):
        with pytest.raises(SeqrecError, match=r"train\.ema"):
            resolve({}, [f"train.ema={value}"])
