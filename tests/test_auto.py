"""`"auto"` settings decided from the training data (seqrec.train.auto), on data where the answer is known."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch

from seqrec.cli import main
from seqrec.config import resolve
from seqrec.data.dataset import PreparedDataset
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.data.types import Interactions, RawDataset
from seqrec.train import auto
from seqrec.train.auto import resolve_auto, resolve_auto_train


def dataset(tmp_path: Path, repeats: bool) -> PreparedDataset:
    """40 users of 8 events: each walks new items, or (repeats) cycles over two items."""
    rows = []
    for u in range(40):
        for t in range(8):
            item = (u + t) % 2 if repeats else (u + t) % 30
            rows.append((f"u{u}", f"i{item}", float(t)))
    frame = pl.DataFrame(rows, schema=["user", "item", "timestamp"], orient="row")
    name = "repeats" if repeats else "fresh"
    return prepare(RawDataset(Interactions(frame, name), None, name), PrepareOptions(), tmp_path / name)


@pytest.mark.parametrize("model", ["sasrec", "gru4rec", "unisrec"])
def test_history_bias_on_with_and_without_repeats(tmp_path: Path, model: str) -> None:
    """On either way (it learns its sign: benchmarks/history_bias.py found it lifts validation NDCG@10 on
    diginetica, whose users often return, for SASRec and far more for GRU4Rec); the reason says which."""
    for repeats, direction in ((False, "down"), (True, "up")):
        cfg = resolve({"model": {"name": model, "history_bias": "auto"}})
        decisions = resolve_auto(cfg.model, dataset(tmp_path, repeats))
        assert cfg.model.history_bias is True
        assert [d["key"] for d in decisions] == ["model.history_bias"] and decisions[0]["value"] is True
        assert decisions[0]["repeat_rate"] == (0.0 if not repeats else 0.8)  # 4 of 5: the 2nd item is new
        assert f"push seen items {direction}" in decisions[0]["reason"]


def test_history_offsets_learn_their_sign_from_the_data(tmp_path: Path) -> None:
    """What makes "on" right either way: trained on users who never return, the offsets of the last two
    items go negative; on users who alternate between two items, the item two back (the next one) goes
    positive and the last one negative."""
    from seqrec.data.batching import TrainBatches
    from seqrec.registry import build_model_for

    for repeats in (False, True):
        data = dataset(tmp_path, repeats)
        cfg = resolve({"model": {"name": "sasrec", "history_bias": True, "d": 16, "n_heads": 1, "n_layers": 1}})
        torch.manual_seed(0)
        model = build_model_for(cfg.model, data, 8, None)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(15):
            for batch in TrainBatches(data, 8, 16, seed=0):
                opt.zero_grad()
                model.loss(batch).backward()
                opt.step()
        assert model.history is not None
        theta = model.history.theta.detach()
        assert (theta[1] > 0 > theta[0]) if repeats else bool((theta[:2] < 0).all()), theta


def test_history_bias_off_for_a_sampled_loss_and_untouched_unless_auto(tmp_path: Path) -> None:
    cfg = resolve({"model": {"name": "sasrec", "history_bias": "auto", "loss": "sampled_softmax"}})
    assert resolve_auto(cfg.model, dataset(tmp_path, False))[0]["value"] is False
    explicit = resolve({"model": {"name": "sasrec", "history_bias": False}})
    assert resolve_auto(explicit.model, dataset(tmp_path, False)) == [] and explicit.model.history_bias is False


def test_train_records_the_decision(tmp_path: Path) -> None:
    data = dataset(tmp_path, False)
    out = tmp_path / "run"
    argv = ["train", "--dataset", str(data.path), "--out", str(out), "--set", 'model.history_bias="auto"',
            "--set", "model.d=8", "--set", "model.n_heads=1", "--set", "model.n_layers=1", "--set", "data.max_len=8",
            "--set", "train.epochs=1", "--set", "train.progress=false"]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    decided = {d["key"]: d["value"] for d in results["auto"]}
    assert decided["model.history_bias"] is True and decided["model.loss"] == "ce"
    assert decided["train.batch_size"] == 128
    assert json.loads((out / "config.json").read_text())["model"]["history_bias"] is True


@pytest.mark.parametrize(("model", "default"), [("sasrec", "auto"), ("gru4rec", "auto"), ("unisrec", "auto")])
def test_history_bias_defaults(model: str, default: object) -> None:
    assert resolve({"model": {"name": model}}).model.history_bias == default


def test_a_given_model_keeps_what_it_was_built_with(tmp_path: Path) -> None:
    """A model handed to `fit` (one to fine-tune) was built before the data was seen: "auto" follows it."""
    from seqrec.registry import build_model_for

    data = dataset(tmp_path, False)  # no repeats: from the data alone the bias would be on
    built = build_model_for(resolve({"model": {"name": "sasrec", "history_bias": False}}).model, data, 8, None)
    cfg = resolve({"model": {"name": "sasrec"}})
    decisions = resolve_auto(cfg.model, data, built)
    assert cfg.model.history_bias is False and decisions[0]["value"] is False
    assert "given model" in decisions[0]["reason"]


def long_histories(tmp_path: Path, length: int) -> PreparedDataset:
    rows = [(f"u{u}", f"i{(u + t) % 500}", float(t)) for u in range(30) for t in range(length)]
    frame = pl.DataFrame(rows, schema=["user", "item", "timestamp"], orient="row")
    return prepare(RawDataset(Interactions(frame, "long"), None, "long"), PrepareOptions(), tmp_path / f"l{length}")


def test_windows_overlap_only_where_histories_run_past_max_len(tmp_path: Path) -> None:
    from seqrec.train.auto import resolve_auto_data

    short = resolve({"data": {"max_len": 50}})
    decisions = resolve_auto_data(short.data, long_histories(tmp_path, 20))  # 17 training targets < 50
    assert short.data.stride == 0 and short.data.jitter is False
    assert [d["key"] for d in decisions] == ["data.stride", "data.jitter"]
    long = resolve({"data": {"max_len": 50}})
    resolve_auto_data(long.data, long_histories(tmp_path, 200))  # most targets lie beyond one window
    assert long.data.stride == 10 and long.data.jitter is True
    explicit = resolve({"data": {"max_len": 50, "stride": 0, "jitter": False}})
    assert resolve_auto_data(explicit.data, long_histories(tmp_path, 200)) == []
    assert explicit.data.stride == 0 and explicit.data.jitter is False


def test_a_default_run_records_its_window_decisions(tmp_path: Path) -> None:
    data = long_histories(tmp_path, 60)
    out = tmp_path / "run"
    argv = ["train", "--dataset", str(data.path), "--model", "sasrec", "--out", str(out), "--set", "data.max_len=8",
            "--set", "model.d=8", "--set", "train.epochs=1", "--set", "train.progress=false"]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    keys = {d["key"]: d["value"] for d in results["auto"]}
    assert keys["data.stride"] == 1 and keys["data.jitter"] is True  # max_len 8: a stride of 8 // 5
    saved = json.loads((out / "config.json").read_text())["data"]
    assert saved["stride"] == 1 and saved["jitter"] is True


def big_catalogue(tmp_path: Path) -> PreparedDataset:
    """300 users of 20 events over 6,000 items: a catalogue above 4 x the sampled loss's negatives."""
    rows = [(f"u{u}", f"i{(u * 20 + t) % 6000}", float(t)) for u in range(300) for t in range(20)]
    frame = pl.DataFrame(rows, schema=["user", "item", "timestamp"], orient="row")
    return prepare(RawDataset(Interactions(frame, "big"), None, "big"), PrepareOptions(), tmp_path / "big")


CPU = torch.device("cpu")


def test_loss_full_softmax_while_affordable_sampled_beyond(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = big_catalogue(tmp_path)
    targets = int((data.train_end() - 1).sum())
    # the output layer's matmul per epoch is 6 x targets x items x d FLOPs: put the rate on either side of the limit
    flops = 6.0 * targets * data.n_items * 64
    limit = auto.CE_EPOCH_SECONDS
    for rate, expected in ((flops / (limit / 2), "ce"), (flops / (limit * 2), "sampled_softmax")):
        monkeypatch.setattr(auto, "nominal_flops", lambda device, r=rate: r)
        cfg = resolve({"model": {"name": "sasrec"}})
        decisions = resolve_auto_train(cfg.model, cfg.train, 50, data, CPU)
        assert cfg.model.loss == expected and decisions[0]["value"] == expected
        assert decisions[0]["epoch_output_seconds"] == pytest.approx(flops / rate)
        if expected == "sampled_softmax":
            sampled = (cfg.model.negatives, cfg.model.logq, cfg.model.n_negatives)
            assert sampled == ("popularity", True, auto.SAMPLED_NEGATIVES)
            assert resolve_auto(cfg.model, data)[0]["value"] is False  # then no history bias: it needs "ce"


def test_loss_stays_full_for_a_small_catalogue_or_a_history_bias(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auto, "nominal_flops", lambda device: 1.0)  # however slow the machine
    cfg = resolve({"model": {"name": "gru4rec"}})
    resolve_auto_train(cfg.model, cfg.train, 8, dataset(tmp_path, False), CPU)  # 30 items
    assert cfg.model.loss == "ce"
    cfg = resolve({"model": {"name": "sasrec", "history_bias": True}})
    decisions = resolve_auto_train(cfg.model, cfg.train, 50, big_catalogue(tmp_path), CPU)
    assert cfg.model.loss == "ce" and "history_bias" in decisions[0]["reason"]
    explicit = resolve({"model": {"name": "sasrec", "loss": "bce"}, "train": {"batch_size": 64, "sparse_items": False}})
    assert resolve_auto_train(explicit.model, explicit.train, 50, big_catalogue(tmp_path), CPU) == []


def test_a_model_built_without_the_decision_uses_the_full_softmax() -> None:
    from seqrec.models.sasrec import SASRec, SASRecConfig

    assert SASRecConfig().loss == "auto" and SASRec(SASRecConfig(), 10, 5).objective.kind == "ce"


def test_batch_size_halves_until_a_step_fits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = big_catalogue(tmp_path)
    cfg = resolve({"model": {"name": "sasrec", "loss": "ce"}})
    sizes = [auto.step_bytes(cfg.model, b, 50, data.n_items) for b in (16, 32, 64, 128)]
    assert sizes == sorted(sizes) and len(set(sizes)) == 4  # the estimate grows with the batch
    for free, expected in ((10 * sizes[-1], 128), (2 * sizes[1] + 1, 32), (0, auto.MIN_BATCH_SIZE)):
        monkeypatch.setattr(auto, "free_memory", lambda device, f=free: f)
        cfg = resolve({"model": {"name": "sasrec", "loss": "ce"}})
        decisions = resolve_auto_train(cfg.model, cfg.train, 50, data, CPU)
        assert cfg.train.batch_size == expected and decisions[0]["key"] == "train.batch_size"
        assert ("still over" in decisions[0]["reason"]) is (free == 0)


def test_the_machine_probes_are_plausible() -> None:
    # the loss rule's rate is a fixed figure (one dataset and command: one loss), per CPU thread
    assert auto.nominal_flops(CPU) == auto.NOMINAL_FLOPS["cpu"] * torch.get_num_threads()
    assert auto.free_memory(CPU) > 1 << 26


def test_train_with_a_sampled_auto_loss_records_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auto, "nominal_flops", lambda device: 1e3)
    data = big_catalogue(tmp_path)
    out = tmp_path / "run"
    argv = ["train", "--dataset", str(data.path), "--out", str(out), "--set", "model.d=8", "--set", "model.n_layers=1",
            "--set", "data.max_len=8", "--set", "train.epochs=1", "--set", "train.progress=false"]
    assert main(argv) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["model"]["loss"] == "sampled_softmax" and saved["model"]["logq"] is True
    assert saved["model"]["history_bias"] is False and saved["train"]["batch_size"] == 128
    keys = [d["key"] for d in json.loads((out / "results.json").read_text())["auto"]]
    assert keys[:2] == ["model.loss", "train.batch_size"]


def test_the_decisions_benchmark_runs_in_a_tiny_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/auto_decisions.py on a generated log only: every model's decisions, each with a reason."""
    import sys

    root = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    import auto_decisions

    out = tmp_path / "auto.json"
    monkeypatch.setattr(sys, "argv", ["auto_decisions.py", "--datasets", "--sizes", "20000", "--out", str(out)])
    auto_decisions.main()
    (row,) = json.loads(out.read_text())["rows"]
    assert row["interactions"] > 0 and set(row["decisions"]) == {"sasrec", "gru4rec", "bert4rec", "unisrec"}
    keys = {m: [d["key"] for d in ds] for m, ds in row["decisions"].items()}
    assert keys["sasrec"] == ["model.loss", "train.batch_size", "train.sparse_items", "model.history_bias",
                              "data.stride", "data.jitter"]
    assert "model.loss" not in keys["unisrec"] and "model.history_bias" not in keys["bert4rec"]
    assert all(d["reason"] for ds in row["decisions"].values() for d in ds)


def test_popularity_negatives_need_an_explicit_sampled_loss() -> None:
    """With loss "auto" the full softmax may be chosen, which draws no negatives: refused up front."""
    from seqrec.errors import SeqrecError

    with pytest.raises(SeqrecError, match="needs a sampled loss"):
        resolve({"model": {"name": "sasrec", "negatives": "popularity"}})


def test_explicit_sampled_settings_are_kept_when_auto_picks_the_sampled_loss(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auto, "nominal_flops", lambda device: 1.0)
    cfg = resolve({"model": {"name": "sasrec", "n_negatives": 256}})
    resolve_auto_train(cfg.model, cfg.train, 50, big_catalogue(tmp_path), CPU)
    assert (cfg.model.loss, cfg.model.n_negatives, cfg.model.negatives) == ("sampled_softmax", 256, "popularity")


def test_a_saved_config_from_before_sparse_items_resumes_dense(tmp_path: Path) -> None:
    from seqrec.cli.common import run_config

    (tmp_path / "config.json").write_text(json.dumps({"model": {"name": "sasrec"}, "train": {"batch_size": 64}}))
    assert run_config(tmp_path).train.sparse_items is False
