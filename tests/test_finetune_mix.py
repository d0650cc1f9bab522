"""Fine-tuning keeps what pre-training knew: the weights a x fine-tuned + (1 - a) x pre-trained are validated
(`train.interpolate`), only the pre-trained tensors are mixed, and a fine-tuning run resumed after an
interruption starts from the pre-trained weights again (its refit too)."""

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from seqrec.config import RunConfig, resolve
from seqrec.data.dataset import PreparedDataset
from seqrec.errors import SeqrecError
from seqrec.models.unisrec import UniSRec
from seqrec.train import loop
from seqrec.train.checkpoint import load_checkpoint, save_checkpoint
from seqrec.train.transfer import Origin, finetune_config, mix, unmix
from tests.test_resume import Interrupted, interrupt_at
from tests.test_unisrec import encoder_dir, tiny_config  # noqa: F401 (the fixture)


def pretrained(data: PreparedDataset, encoder: Path, dest: Path) -> Path:
    torch.manual_seed(7)
    pre = UniSRec.from_dataset(tiny_config(encoder, history_bias=True), data, 8)
    with torch.no_grad():  # weights far from a fresh model's, as pre-training leaves them
        for p in pre.parameters():
            p.add_(torch.randn_like(p))
    save_checkpoint(pre, dest, max_len=8, item_table=data.item_table)
    return dest


def finetuning(pre: Path, data: PreparedDataset, setting: str = "transductive", *extra: str) -> RunConfig:
    model = finetune_config(pre, setting, {"freeze_encoder": False})  # type: ignore[arg-type]
    return resolve({"model": dataclasses.asdict(model)},
                   [f'data.dataset="{data.path}"', "data.max_len=8", "train.epochs=6", "train.patience=50",
                    "train.progress=false", "train.threads=1", "train.lr=0.01", *extra])


def test_only_the_pretrained_tensors_are_mixed(tiny_dataset: PreparedDataset, encoder_dir: Path,  # noqa: F811
                                               tmp_path: Path) -> None:
    pre = pretrained(tiny_dataset, encoder_dir, tmp_path / "pre")
    cfg = finetuning(pre, tiny_dataset)
    origin = Origin.of(pre)
    model = origin.model(tiny_dataset, cfg.model, 8, seed=0)
    start = origin.weights(model)
    assert {"item_emb.weight", "text_emb", "text_mean"}.isdisjoint(start)  # new, or the target's own
    assert "history.theta" in start and any(k.startswith("adaptor.") for k in start)
    assert set(Origin.of(pre, "adaptor").weights(model)) == {k for k in start if k.startswith("adaptor.")}
    with torch.no_grad():  # as fine-tuning leaves it
        for p in model.parameters():
            p.add_(1.0)
    after = {k: v.clone() for k, v in model.state_dict().items()}
    half = mix(model, start, 0.5).state_dict()
    for key, value in half.items():
        expected = (start[key] + after[key]) / 2 if key in start else after[key]
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-6, msg=key)
    mix(model, start, 0.25, after)  # from the fine-tuned values given, not from the model's mixed ones
    adaptor = next(k for k in start if k.startswith("adaptor."))
    torch.testing.assert_close(model.state_dict()[adaptor], 0.75 * start[adaptor] + 0.25 * after[adaptor])
    for k, v in unmix(model, start, 0.25).items():  # what a report gets back from a checkpoint saved mixed
        torch.testing.assert_close(v, after[k], rtol=0, atol=1e-5, msg=k)
    mix(model, start, 0.0, after)
    assert all(torch.equal(model.state_dict()[k], start[k]) for k in start)
    with pytest.raises(SeqrecError, match="keeps nothing"):
        unmix(model, start, 0.0)


def test_a_changed_pretrained_run_is_refused(tiny_dataset: PreparedDataset, encoder_dir: Path,  # noqa: F811
                                            tmp_path: Path) -> None:
    pre = pretrained(tiny_dataset, encoder_dir, tmp_path / "pre")
    origin = Origin.of(pre)
    assert Path(origin.pretrained).is_absolute()
    again = UniSRec.from_dataset(tiny_config(encoder_dir, history_bias=True), tiny_dataset, 8)
    save_checkpoint(again, pre, max_len=8, item_table=tiny_dataset.item_table)  # trained again meanwhile
    with pytest.raises(SeqrecError, match="changed since"):
        origin.model(tiny_dataset, finetuning(pre, tiny_dataset).model, 8, 0)


def test_the_kept_model_is_the_one_validation_scored(tiny_dataset: PreparedDataset, encoder_dir: Path,  # noqa: F811
                                                     tmp_path: Path) -> None:
    pre = pretrained(tiny_dataset, encoder_dir, tmp_path / "pre")
    cfg = finetuning(pre, tiny_dataset, "inductive")
    origin = Origin.of(pre)
    results = loop.fit(cfg, tiny_dataset, tmp_path / "ft", model=origin.model(tiny_dataset, cfg.model, 8, 42),
                       origin=origin)
    assert results["origin"] == dataclasses.asdict(origin)  # results.json names the pre-trained run it came from
    mix = results["interpolation"]
    assert "skipped" not in mix, mix  # training moved away from the (perturbed) pre-trained weights
    assert set(mix["valid"]) == {"0.25", "0.5", "0.75"}
    best = max(mix["fine_tuned"], *mix["valid"].values())
    assert results["valid"]["ndcg@10"] == pytest.approx(best, abs=1e-9)  # the saved checkpoint scores it
    _, meta = load_checkpoint(tmp_path / "ft" / "checkpoint")
    assert meta.get("interpolated", 1.0) == mix["alpha"]
    if mix["alpha"] < 1:
        assert "mixed with the pre-trained ones" in results["protocol"]["model_selection"]
    off = loop.fit(finetuning(pre, tiny_dataset, "inductive", "train.interpolate=[]"), tiny_dataset, tmp_path / "off",
                   model=origin.model(tiny_dataset, cfg.model, 8, 42), origin=origin)
    assert "interpolation" not in off and off["valid"]["ndcg@10"] == pytest.approx(mix["fine_tuned"], abs=1e-9)


def test_a_resumed_fine_tuning_starts_from_the_pretrained_weights(
        tiny_dataset: PreparedDataset, encoder_dir: Path, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    pre = pretrained(tiny_dataset, encoder_dir, tmp_path / "pre")
    cfg = finetuning(pre, tiny_dataset, "transductive", "train.refit=true", "model.dropout=0.2")
    origin = Origin.of(pre)
    whole = loop.fit(copy.deepcopy(cfg), tiny_dataset, tmp_path / "whole",
                     model=origin.model(tiny_dataset, cfg.model, 8, cfg.train.seed), origin=origin)
    with monkeypatch.context() as m:
        interrupt_at(m, 3)
        with pytest.raises(Interrupted):
            loop.fit(copy.deepcopy(cfg), tiny_dataset, tmp_path / "cut",
                     model=origin.model(tiny_dataset, cfg.model, 8, cfg.train.seed), origin=origin)
    resumed = loop.fit(copy.deepcopy(cfg), tiny_dataset, tmp_path / "cut", resume=True)  # as `train --resume` does
    assert resumed["valid"] == whole["valid"] and resumed["test"] == whole["test"]  # the refit too
    assert resumed["interpolation"] == whole["interpolation"]
    a, _ = load_checkpoint(tmp_path / "whole" / "checkpoint")
    b, _ = load_checkpoint(tmp_path / "cut" / "checkpoint")
    for (key, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), key


def test_a_kept_mix_survives_a_crash_and_is_applied_to_the_refit(
        tiny_dataset: PreparedDataset, encoder_dir: Path, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation made to prefer the half-and-half mix: it is saved, recorded, applied to the refit, and a run
    stopped right after saving it resumes without mixing the mixed weights again."""
    import seqrec.eval.evaluate as evaluation

    real = evaluation.evaluate

    def rigged() -> None:
        calls: list[int] = []

        def scored(*args, **kwargs):  # type: ignore[no-untyped-def]
            out = real(*args, **kwargs)
            calls.append(1)
            return {**out, "ndcg@10": 1.0} if len(calls) == 2 else out  # the mixes are 0.25, 0.5, 0.75

        monkeypatch.setattr(evaluation, "evaluate", scored)

    pre = pretrained(tiny_dataset, encoder_dir, tmp_path / "pre")
    cfg = finetuning(pre, tiny_dataset, "transductive", "train.refit=true")
    origin = Origin.of(pre)
    rigged()
    whole = loop.fit(copy.deepcopy(cfg), tiny_dataset, tmp_path / "whole",
                     model=origin.model(tiny_dataset, cfg.model, 8, cfg.train.seed), origin=origin)
    assert whole["interpolation"]["alpha"] == 0.5
    assert "applied to the refit" in whole["protocol"]["model_selection"]
    for name in ("checkpoint", "checkpoint-selected"):
        assert load_checkpoint(tmp_path / "whole" / name)[1]["interpolated"] == 0.5

    real_save = loop.save_state

    def crash_after_mixing(dest, state, *args, **kwargs):  # type: ignore[no-untyped-def]
        if state.interpolation is not None:
            raise Interrupted
        real_save(dest, state, *args, **kwargs)

    rigged()
    with monkeypatch.context() as m:
        m.setattr(loop, "save_state", crash_after_mixing)
        with pytest.raises(Interrupted):
            loop.fit(copy.deepcopy(cfg), tiny_dataset, tmp_path / "cut",
                     model=origin.model(tiny_dataset, cfg.model, 8, cfg.train.seed), origin=origin)
    monkeypatch.setattr(evaluation, "evaluate", real)  # a second mixing would be scored for real
    resumed = loop.fit(copy.deepcopy(cfg), tiny_dataset, tmp_path / "cut", resume=True)
    assert resumed["interpolation"] == whole["interpolation"]
    assert resumed["valid"] == whole["valid"] and resumed["test"] == whole["test"]
    a, _ = load_checkpoint(tmp_path / "whole" / "checkpoint")
    b, _ = load_checkpoint(tmp_path / "cut" / "checkpoint")
    for (key, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), key


@pytest.mark.parametrize("weights", ["[0]", "[1.0]", "[0.5, 1.5]", "[-0.2]"])
def test_interpolation_weights_are_strictly_between_the_ends(weights: str) -> None:
    with pytest.raises(SeqrecError, match=r"train\.interpolate"):
        resolve({}, [f"train.interpolate={weights}"])
