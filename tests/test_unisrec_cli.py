"""`seqrec text encode`, `pretrain`, `finetune`, `train --model unisrec` and text-only new items, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from seqrec.cli import main
from seqrec.config import EvalConfig
from seqrec.data.batching import history_batch
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
    assert meta["n_items"] == 50 and meta["domains"] == {"a": 0, "b": 30}  # named after their folders
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
        rows = [json.loads(line) for line in (ft / "metrics.jsonl").read_text().splitlines()]
        assert [r["epoch"] for r in rows] == [0, 1, 2] and "loss" not in rows[0] and "ndcg@10" in rows[0]["valid"]
        assert json.loads((ft / "results.json").read_text())["epochs_run"] == 2


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


def test_cold_split_and_evaluate_cold_from_the_cli(tmp_path: Path, setup: tuple[Path, Path, Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`data cold-split` writes the split `cold_item_split` makes; `evaluate --cold` adds rows for cold and warm
    targets whose user counts add up to the split's, and leaves the split's own row as plain `evaluate` has it."""
    a = setup[1]
    dest = tmp_path / "a-cold"
    said = run(capsys, "data", "cold-split", str(a), "--fraction", "0.3", "--seed", "1", "--out", str(dest))
    cold = PreparedDataset.load(dest)
    want = cold_item_split(PreparedDataset.load(a), 0.3, 1, tmp_path / "same")
    assert cold.meta["name"] == "a-cold" and np.array_equal(cold.items, want.items)
    users, pos = cold.eval_positions("test")
    n_cold = int(cold_mask(cold)[cold.items[cold.offsets[users] + pos]].sum())
    assert n_cold >= 1 and f"{n_cold:,} of {len(users):,} test targets cold" in said
    runs = tmp_path / "run"
    run(capsys, "train", "--dataset", str(dest), "--model", "sasrec", "--set", "model.d=16",
        "--set", "train.epochs=1", "--set", "train.progress=false", "--out", str(runs))
    rows = {line[:11].strip(): line[11:].split() for line in run(capsys, "evaluate", str(runs), "--cold").splitlines()
            if line[:11].strip() in ("valid", "test", "test cold", "test warm", "valid cold", "valid warm")}
    plain = {line[:11].strip(): line[11:].split() for line in run(capsys, "evaluate", str(runs)).splitlines()
             if line[:11].strip() in ("valid", "test")}
    assert rows["test"] == plain["test"] and rows["valid"] == plain["valid"]
    assert int(rows["test cold"][-1]) == n_cold and int(rows["test warm"][-1]) == len(users) - n_cold
    assert int(rows["test"][-1]) == len(users)
    # bad input: one line each
    for argv, message in ((["--fraction", "1.5"], "--fraction must be between 0 and 1"),
                          (["--out", str(dest)], "the dataset itself")):
        target = str(dest) if "--out" in argv else str(a)
        assert main(["data", "cold-split", target, *argv]) == 2
        assert message in capsys.readouterr().err
    timed = prepare(synthetic_log(seed=0), PrepareOptions(split="time"), tmp_path / "timed").path
    assert main(["data", "cold-split", str(timed), "--out", str(tmp_path / "x")]) == 2
    assert "needs a leave-one-out dataset" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_recipe_zero_shot_run_and_evaluate(setup: tuple[Path, Path, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Pre-train from a recipe file on domain b only, then use it on domain a with no training: as a
    run folder (finetune --setting zero-shot) and straight from the pre-training run (evaluate --dataset)."""
    enc, a, b = setup
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'[pretrain]\ndatasets = ["{b}"]\nepochs = 1\nmax_len = 8\nbatch_size = 16\nprogress = false\n'
                      f'[model]\nd = 16\nn_layers = 1\nn_heads = 2\nd_ff = 32\ntext_dim = {TEXT_DIM}\n'
                      f'text_max_length = 16\nn_experts = 2\ntext_encoder = "{enc}"\n')
    pre = tmp_path / "pre"
    run(capsys, "pretrain", "--config", str(recipe), "--out", str(pre))
    card = json.loads((pre / "data_card.json").read_text())
    assert [d["path"] for d in card["domains"]] == [str(b)] and card["recipe"] == str(recipe)
    assert card["domains"][0]["users"] == 40 and card["text_encoder"]["encoder"] == str(enc)
    zs = tmp_path / "zs"
    out = run(capsys, "finetune", str(a), "--from", str(pre), "--setting", "zero-shot", "--out", str(zs),
              "--set", "train.epochs=2", "--set", "train.lr=0.1")
    assert "(note: zero-shot trains nothing: train.epochs, train.lr not used)" in out
    results = json.loads((zs / "results.json").read_text())
    assert results["epochs_run"] == 0 and "zero-shot" in results["protocol"]["model_selection"]
    assert results["pretrained"] == str(pre.resolve())  # where the weights came from, whatever the working folder
    # a run whose weights already saw a is no start for a zero-shot on a (it would be said to have trained nothing)
    assert main(["finetune", str(a), "--from", str(zs), "--setting", "zero-shot", "--out", str(tmp_path / "no")]) == 2
    said = capsys.readouterr().err
    assert f"{zs} was trained on a" in said and f"`seqrec evaluate {zs}` evaluates it" in said
    assert not (tmp_path / "no").exists()
    # nor is a pre-training run on one of its own domains (b), as a run folder or straight
    assert main(["finetune", str(b), "--from", str(pre), "--setting", "zero-shot", "--out", str(tmp_path / "no")]) == 2
    assert f"{pre} was pre-trained on b" in capsys.readouterr().err and not (tmp_path / "no").exists()
    assert main(["evaluate", str(pre), "--dataset", str(b)]) == 2
    said = capsys.readouterr().err
    assert "was pre-trained on b" in said and f"`seqrec finetune b --from {pre}`" in said
    # ... nor b's events prepared again with other options (another fingerprint): the data card's event sample
    again = prepare(synthetic_log(n_users=40, n_items=20, seed=1), PrepareOptions(split="time", dedupe="first"),
                    tmp_path / "b-again")
    assert again.fingerprint != card["domains"][0]["fingerprint"] and len(card["domains"][0]["events_sketch"]) > 100
    assert main(["evaluate", str(pre), "--dataset", str(again.path)]) == 2
    assert "has already learnt from most of b-again's events: about 100% of them are its pre-training domain b's" \
        in capsys.readouterr().err
    direct = run(capsys, "evaluate", str(pre), "--dataset", str(a))
    said, direct = direct.split("\n", 1)
    assert said.startswith(f"zero-shot: {pre} on ") and said.endswith("no training on it")
    assert out.split("\n", 2)[2] == direct  # the same metrics, printed the same way (after the note and run lines)
    assert "Item number" in run(capsys, "recommend", str(zs), "--user", "u1", "-k", "3")
    assert main(["evaluate", str(pre)]) == 2
    assert "pre-training run" in capsys.readouterr().err
    # `seqrec serve PRE --dataset a` serves the same zero-shot model, made once inside the pre-training run
    from seqrec.cli.common import zero_shot_run
    from seqrec.errors import SeqrecError
    from seqrec.serve import Recommender

    served = zero_shot_run(pre, str(a), "cpu")
    assert served.parent == pre / "zero-shot" and zero_shot_run(pre, str(a), "cpu") == served
    assert json.loads((served / "results.json").read_text())["valid"] == results["valid"]
    top = Recommender.from_run(served).recommend(["i1", "i2", "i3"], k=3)
    assert top == Recommender.from_run(zs).recommend(["i1", "i2", "i3"], k=3)
    with pytest.raises(SeqrecError, match="--dataset"):
        zero_shot_run(pre, None, "cpu")
    with pytest.raises(SeqrecError, match="trained run"):
        zero_shot_run(zs, str(a), "cpu")
    # recommend and export take the pre-training run on a catalogue too, and refuse it without one
    said = run(capsys, "recommend", str(pre), "--dataset", str(a), "--history", "i1 i2 i3", "-k", "3")
    assert [line.split()[1] for line in said.splitlines()] == [r.item for r in top]
    assert main(["recommend", str(pre), "--history", "i1"]) == 2
    assert "is a pre-training run" in capsys.readouterr().err
    assert main(["export", str(pre), "--dataset", str(a)]) == 0 and (served / "export-onnx" / "manifest.json").is_file()
    assert "replaced" not in capsys.readouterr().out
    assert main(["export", str(pre), "--dataset", str(a)]) == 0  # again: says that it replaced the first
    assert "(the earlier export there replaced)" in capsys.readouterr().out
    assert main(["export", str(pre)]) == 2 and "--dataset" in capsys.readouterr().err


def test_zero_shot_scores_depend_only_on_item_text(setup: tuple[Path, Path, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    enc, _, b = setup
    pre = tmp_path / "pre"
    run(capsys, "pretrain", "--datasets", str(b), "--out", str(pre), *TINY, "--set", f'model.text_encoder="{enc}"',
        "--set", "pretrain.epochs=1", "--set", "pretrain.max_len=8", "--set", "pretrain.batch_size=16",
        "--set", "pretrain.progress=false")
    # a target where items 3 and 7 share a text, and 5 has another
    raw = synthetic_log(seed=0)
    assert raw.items is not None
    titles = raw.items.frame["title"].to_list()
    titles[7] = titles[3]
    from dataclasses import replace

    from seqrec.data.types import ItemTable
    table = ItemTable(raw.items.frame.with_columns(title=np.array(titles)), "twins")
    target = prepare(replace(raw, items=table), PrepareOptions(), tmp_path / "twins").path
    zs = tmp_path / "zs"
    run(capsys, "finetune", str(target), "--from", str(pre), "--setting", "zero-shot", "--out", str(zs))
    model, _ = load_checkpoint(zs / "checkpoint")
    ids = PreparedDataset.load(target).item_table.sort("idx")["item"].to_list()
    i3, i7, i5 = (ids.index(f"i{k}") + 1 for k in (3, 7, 5))
    with torch.no_grad():
        scores = model.score(history_batch([[1, 2, 4]], 8))[0]
    emb = model.item_embeddings()
    assert torch.equal(emb[i3], emb[i7]) and not torch.equal(emb[i3], emb[i5])  # bit for bit
    # the scores too, up to where the product's kernel puts a column (a last-bit difference)
    assert abs(scores[i3] - scores[i7]) <= 1e-6 * abs(scores[i3]) and abs(scores[i3] - scores[i5]) > 1e-3


@pytest.mark.parametrize("setting", ["inductive", "transductive"])
def test_fine_tuning_can_choose_its_starting_point(setup: tuple[Path, Path, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str], setting: str) -> None:
    """Epoch 0 (the pre-trained model as it came) is a validation candidate: an update too small to change
    any weight cannot beat it, so the run keeps it, and it scores as the zero-shot run does (transductive
    too: its new ID vectors start at zero)."""
    enc, a, b = setup
    pre, ft, zs = tmp_path / "pre", tmp_path / "ft", tmp_path / "zs"
    run(capsys, "pretrain", "--datasets", str(b), "--out", str(pre), *TINY, "--set", f'model.text_encoder="{enc}"',
        "--set", "pretrain.epochs=1", "--set", "pretrain.max_len=8", "--set", "pretrain.batch_size=16",
        "--set", "pretrain.progress=false")
    run(capsys, "finetune", str(a), "--from", str(pre), "--setting", "zero-shot", "--out", str(zs))
    run(capsys, "finetune", str(a), "--from", str(pre), "--setting", setting, "--out", str(ft),
        "--set", "train.epochs=2", "--set", "train.lr=1e-15", "--set", "train.progress=false")
    results = json.loads((ft / "results.json").read_text())
    assert results["checkpoint"]["epoch"] == 0 and results["epochs_run"] == 2
    assert results["valid"] == json.loads((zs / "results.json").read_text())["valid"]


def test_fine_tuning_keeps_the_text_vectors_the_adaptor_learnt_from(setup: tuple[Path, Path, Path], tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str],
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """The encoder's pooling (and length, revision, centring) is the pre-trained model's: a recipe's other
    value is dropped with a log line, a --set of one is refused; the missing-text policy is the target's."""
    from dataclasses import replace

    enc, a, b = setup
    pre = tmp_path / "pre"
    run(capsys, "pretrain", "--datasets", str(b), "--out", str(pre), *TINY, "--set", f'model.text_encoder="{enc}"',
        "--set", "model.text_pooling=cls", "--set", 'model.text_missing="id"', "--set", "pretrain.epochs=1",
        "--set", "pretrain.max_len=8", "--set", "pretrain.batch_size=16", "--set", "pretrain.progress=false")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('[model]\ntext_pooling = "mean"\ndropout = 0.3\n[train]\nepochs = 1\nprogress = false\n')
    ft = tmp_path / "ft"
    with caplog.at_level("INFO", logger="seqrec.train.transfer"):
        run(capsys, "finetune", str(a), "--from", str(pre), "--setting", "inductive", "--config", str(recipe),
            "--out", str(ft))
    assert "model.text_pooling = cls from the pre-trained model" in caplog.text
    config = json.loads((ft / "config.json").read_text())["model"]
    assert config["text_pooling"] == "cls" and config["dropout"] == 0.3 and config["text_missing"] == "auto"
    assert main(["finetune", str(a), "--from", str(pre), "--setting", "inductive", "--out", str(tmp_path / "x"),
                 "--set", "model.text_pooling=mean"]) == 2
    assert "model.text_pooling=mean does not fit the pre-trained model" in capsys.readouterr().err
    # a target whose items have no text: zero-shot is refused (it was served from "item <id>" stand-ins)
    raw = synthetic_log(seed=3)
    bare = prepare(replace(raw, items=None), PrepareOptions(), tmp_path / "bare").path
    zero = ["finetune", str(bare), "--from", str(pre), "--setting", "zero-shot", "--out", str(tmp_path / "z")]
    assert main(zero) == 2
    assert "have no text" in capsys.readouterr().err


def test_zero_shot_carries_the_history_bias_learnt_in_pretraining(setup: tuple[Path, Path, Path], tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Pre-trained with model.history_bias = true: the zero-shot run has the same offsets (decided by the
    pre-trained model, not by the target's events), and so does the start of fine-tuning."""
    from safetensors.torch import load_file

    enc, a, b = setup
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'[pretrain]\ndatasets = ["{b}"]\nepochs = 2\nmax_len = 8\nbatch_size = 16\nprogress = false\n'
                      f'[model]\nd = 16\nn_layers = 1\nn_heads = 2\nd_ff = 32\ntext_dim = {TEXT_DIM}\n'
                      f'text_max_length = 16\nn_experts = 2\ntext_encoder = "{enc}"\nhistory_bias = true\n')
    pre, zs = tmp_path / "pre", tmp_path / "zs"
    run(capsys, "pretrain", "--config", str(recipe), "--out", str(pre))
    learnt = load_file(str(pre / "checkpoint" / "model.safetensors"))["history.theta"]
    assert float(learnt.abs().sum()) > 0  # pre-training moved it
    run(capsys, "finetune", str(a), "--from", str(pre), "--setting", "zero-shot", "--out", str(zs))
    assert json.loads((zs / "config.json").read_text())["model"]["history_bias"] is True
    assert torch.equal(load_file(str(zs / "checkpoint" / "model.safetensors"))["history.theta"], learnt)


def test_finetune_adaptor_only_with_a_kept_mix_and_refit(setup: tuple[Path, Path, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`seqrec finetune --transfer adaptor` with validation made to prefer the half-and-half mix: only the
    adaptor is mixed (the Transformer was never pre-trained here), the CLI says which mix it kept, and the
    refit's checkpoint is mixed the same way."""
    import seqrec.eval.evaluate as evaluation
    from seqrec.train.transfer import Origin

    enc, a, b = setup
    pre = tmp_path / "pre"
    run(capsys, "pretrain", "--datasets", f"{a},{b}", "--out", str(pre), *TINY, "--set", f'model.text_encoder="{enc}"',
        "--set", "pretrain.epochs=1", "--set", "pretrain.max_len=8", "--set", "pretrain.batch_size=16",
        "--set", "pretrain.progress=false")
    real, calls = evaluation.evaluate, []

    def scored(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(*args, **kwargs)
        calls.append(1)
        return {**out, "ndcg@10": 1.0} if len(calls) == 2 else out  # the mixes are 0.25, 0.5, 0.75

    monkeypatch.setattr(evaluation, "evaluate", scored)
    ft = tmp_path / "ft"
    out = run(capsys, "finetune", str(a), "--from", str(pre), "--setting", "inductive", "--transfer", "adaptor",
              "--out", str(ft), "--set", "data.max_len=8", "--set", "train.epochs=3", "--set", "train.lr=0.01",
              "--set", "train.refit=true", "--set", "train.progress=false")
    assert "kept 0.5 x fine-tuned + 0.5 x pre-trained weights" in out, out
    results = json.loads((ft / "results.json").read_text())
    assert results["interpolation"]["alpha"] == 0.5 and len(calls) == 3
    model, meta = load_checkpoint(ft / "checkpoint")
    assert meta["interpolated"] == 0.5 and load_checkpoint(ft / "checkpoint-selected")[1]["interpolated"] == 0.5
    origin = Origin.of(pre, "adaptor")
    start = origin.weights(origin.model(PreparedDataset.load(a), model.config, 8, seed=42))
    assert start and all(k.startswith("adaptor.") for k in start)
    state = model.state_dict()
    assert any(not torch.allclose(state[k], start[k]) for k in start)  # fine-tuning moved the adaptor


def test_train_with_a_sampled_softmax_serves_and_fine_tunes(setup: tuple[Path, Path, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """model.loss="sampled_softmax" end to end: trained (the auto history bias off: it needs the full softmax),
    served, and fine-tuned from a pre-trained model (the target's own popularity counts)."""
    from seqrec.serve import Recommender

    enc, a, b = setup
    out = tmp_path / "sampled"
    sampled = ["--set", 'model.loss="sampled_softmax"', "--set", "model.n_negatives=8", "--set", "train.epochs=2",
               "--set", "train.progress=false", "--set", f'model.text_encoder="{enc}"']
    run(capsys, "train", "--dataset", str(a), "--model", "unisrec", "--out", str(out), *TINY, *sampled)
    results = json.loads((out / "results.json").read_text())
    assert {d["key"]: d["value"] for d in results["auto"]}["model.history_bias"] is False
    assert np.isfinite(results["test"]["ndcg@10"])
    assert len(Recommender.from_run(out).recommend(["i3", "i4"], k=5)) == 5
    pre = tmp_path / "pre"
    run(capsys, "pretrain", "--datasets", str(b), "--out", str(pre), *TINY, "--set", f'model.text_encoder="{enc}"',
        "--set", "pretrain.epochs=1", "--set", "pretrain.max_len=8", "--set", "pretrain.batch_size=16",
        "--set", "pretrain.progress=false")
    tuned = tmp_path / "tuned"
    run(capsys, "finetune", str(a), "--from", str(pre), "--setting", "inductive", "--out", str(tuned),
        "--set", "data.max_len=8", *sampled[:4], "--set", "train.epochs=1", "--set", "train.progress=false")
    model, _ = load_checkpoint(tuned / "checkpoint")
    assert model.sampler is not None and float(model.sampler.counts.sum()) > 0  # type: ignore[union-attr]
