"""Exact resume: a run stopped after an epoch and resumed ends exactly where an uninterrupted run ends."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seqrec.config import resolve
from seqrec.data.dataset import PreparedDataset
from seqrec.train import loop
from seqrec.train.checkpoint import load_checkpoint


class Interrupted(Exception):
    pass


def settings(data: PreparedDataset, name: str, extra: list[str]) -> list[str]:
    # dropout and jittered, overlapping windows: every random stream matters for exactness
    return [f'data.dataset="{data.path}"', "data.max_len=8", "data.stride=3", "data.jitter=true",
            f'model.name="{name}"', "model.d=16", "train.epochs=5", "train.patience=50",
            "train.progress=false", "train.threads=1", *extra]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def interrupt_at(monkeypatch: pytest.MonkeyPatch, epoch: int) -> None:
    real = loop.train_epoch

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        if args[5] == epoch:  # train_epoch(model, batches, opt, cfg, device, epoch, step)
            raise Interrupted
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "train_epoch", failing)


@pytest.mark.parametrize(("name", "extra"), [("sasrec", ["model.dropout=0.3", 'train.optimizer="adam"', "train.ema=0",
                                                        "train.refit=false"]),
                                             ("gru4rec", ["model.dropout=0.3", "train.refit=true"]),
                                             ("sasrec", ["train.ema=0.9", "train.refit=true"]),
                                             ("item2vec", [])])
def test_resumed_run_equals_uninterrupted_run(name: str, extra: list[str], tiny_dataset: PreparedDataset,
                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = resolve({}, settings(tiny_dataset, name, extra))
    whole = loop.fit(cfg, tiny_dataset, tmp_path / "whole")
    assert not (tmp_path / "whole" / "state").exists()  # a finished run leaves nothing to resume

    with monkeypatch.context() as m:
        interrupt_at(m, 3)
        with pytest.raises(Interrupted):
            loop.fit(cfg, tiny_dataset, tmp_path / "cut")
    assert [r["epoch"] for r in metrics(tmp_path / "cut")] == [1, 2]
    resumed = loop.fit(cfg, tiny_dataset, tmp_path / "cut", resume=True)

    drop = {"train_s", "targets_per_s", "elapsed_s"}  # timings differ, nothing else may
    assert ([{k: v for k, v in r.items() if k not in drop} for r in metrics(tmp_path / "cut")]
            == [{k: v for k, v in r.items() if k not in drop} for r in metrics(tmp_path / "whole")])
    assert resumed["valid"] == whole["valid"] and resumed["test"] == whole["test"]
    a, _ = load_checkpoint(tmp_path / "whole" / "checkpoint")
    b, _ = load_checkpoint(tmp_path / "cut" / "checkpoint")
    for (key, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), key


def test_resume_without_state_is_a_one_line_error(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    cfg = resolve({}, settings(tiny_dataset, "sasrec", ["train.epochs=1"]))
    loop.fit(cfg, tiny_dataset, tmp_path / "run")
    for args, message in [(["--resume", str(tmp_path / "run")], "has finished"),
                          (["--resume", str(tmp_path / "nothing")], "no such run folder"),
                          (["--resume", str(tmp_path / "run"), "--set", "train.epochs=3"], "drop --set")]:
        out = subprocess.run([sys.executable, "-m", "seqrec.cli", "train", *args], capture_output=True, text=True)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_resume_keeps_the_auto_record_and_refuses_other_data(tiny_dataset: PreparedDataset, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """config.json holds the values the auto settings decided, so a resumed run's results.json takes the
    decisions from the saved state; a dataset prepared again in between (another fingerprint) is refused."""
    from dataclasses import replace

    from seqrec.cli.common import run_config
    from seqrec.errors import SeqrecError

    with monkeypatch.context() as m:
        interrupt_at(m, 2)
        with pytest.raises(Interrupted):
            loop.fit(resolve({}, settings(tiny_dataset, "sasrec", ["train.epochs=3"])), tiny_dataset, tmp_path / "cut")
    saved = run_config(tmp_path / "cut")
    assert saved.train.batch_size != "auto"  # decided, and only the value is in config.json
    other = replace(tiny_dataset, meta={**tiny_dataset.meta, "fingerprint": "prepared-again"})
    with pytest.raises(SeqrecError, match="prepared again since"):
        loop.fit(saved, other, tmp_path / "cut", resume=True)
    resumed = loop.fit(run_config(tmp_path / "cut"), tiny_dataset, tmp_path / "cut", resume=True)
    whole = loop.fit(resolve({}, settings(tiny_dataset, "sasrec", ["train.epochs=3"])), tiny_dataset,
                     tmp_path / "whole")
    assert resumed["processes"] == whole["processes"] == [1]
    assert [d["key"] for d in resumed["auto"]] == [d["key"] for d in whole["auto"]] and "train.batch_size" in [
        d["key"] for d in whole["auto"]]


def test_an_unfinished_run_says_how_far_it_got(tiny_dataset: PreparedDataset, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Stopped after an epoch: evaluate says it is unfinished, and --out on it says to resume. Stopped before the
    first epoch ended: nothing to resume, and every command says so (not "--resume it", nor a missing model.json)."""
    from seqrec.cli import main

    for cut, at in (("cut", 3), ("early", 1)):
        with monkeypatch.context() as m:
            interrupt_at(m, at)
            with pytest.raises(Interrupted):
                loop.fit(resolve({}, settings(tiny_dataset, "sasrec", ["train.refit=true"])), tiny_dataset,
                         tmp_path / cut)
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "cut")]) == 0
    assert capsys.readouterr().out.startswith("(unfinished run: stopped after epoch 2; --resume it;")
    retrain = ["train", "--dataset", str(tiny_dataset.path), "--model", "sasrec", "--out"]
    assert main([*retrain, str(tmp_path / "cut")]) == 2
    assert "not finished: stopped after epoch 2; --resume it" in capsys.readouterr().err
    early = str(tmp_path / "early")
    for argv in (["train", "--resume", early], ["evaluate", early], [*retrain, early]):
        assert main(argv) == 2, argv
        assert "interrupted before its first epoch ended: nothing to resume; --overwrite starts it again" in (
            capsys.readouterr().err), argv
    # the resumable weights gone: named as missing (it said they "do not load into this run's model")
    (tmp_path / "cut" / "state" / "model.safetensors").unlink()
    assert main(["train", "--resume", str(tmp_path / "cut")]) == 2
    assert "model.safetensors is missing, so the run cannot be resumed" in capsys.readouterr().err


def test_a_finished_run_without_its_results_file_evaluates_as_finished(tiny_dataset: PreparedDataset, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """results.json deleted: evaluate said "interrupted before its first epoch ended" and tested the model
    validation chose instead of the refit."""
    from seqrec.cli import main

    run = tmp_path / "run"
    loop.fit(resolve({}, settings(tiny_dataset, "sasrec", ["train.refit=true", "train.epochs=2"])), tiny_dataset, run)
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    whole = capsys.readouterr().out
    (run / "results.json").unlink()
    assert main(["evaluate", str(run)]) == 0
    assert capsys.readouterr().out == whole  # the same models (refit tested), no "unfinished" line


def test_a_resumed_run_keeps_what_auto_decided(tiny_dataset: PreparedDataset, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """fit leaves the caller's config as it was ("auto" stays "auto"); resumed with it on a machine that now has
    little free memory, the run goes on with the batch size its config.json recorded, not a new decision."""
    from seqrec.train import auto

    cfg = resolve({}, settings(tiny_dataset, "sasrec", ["train.refit=false"]))
    assert cfg.train.batch_size == "auto"
    with monkeypatch.context() as m:
        interrupt_at(m, 2)
        with pytest.raises(Interrupted):
            loop.fit(cfg, tiny_dataset, tmp_path / "cut")
    decided = json.loads((tmp_path / "cut" / "config.json").read_text())["train"]["batch_size"]
    monkeypatch.setattr(auto, "free_memory", lambda device: 0)  # a new decision would be the smallest batch
    resumed = loop.fit(cfg, tiny_dataset, tmp_path / "cut", resume=True)
    assert json.loads((tmp_path / "cut" / "config.json").read_text())["train"]["batch_size"] == decided != 8
    assert {d["key"]: d["value"] for d in resumed["auto"]}["train.batch_size"] == decided


def test_ctrl_c_says_how_to_go_on(tiny_dataset: PreparedDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A training stopped by Ctrl-C names the command that goes on with it; one stopped before its first epoch
    ended says there is nothing to resume."""
    from seqrec.cli import main

    real = loop.train_epoch
    for epoch, said in ((3, "not finished: stopped after epoch 2; `seqrec train --resume {out}`"),
                        (1, "interrupted before its first epoch ended: nothing to resume")):
        out = tmp_path / f"cut{epoch}"

        def stopped(*args, at: int = epoch, **kwargs):  # type: ignore[no-untyped-def]
            if args[5] == at:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(loop, "train_epoch", stopped)
        argv = [item for s in settings(tiny_dataset, "sasrec", ["train.refit=false"])[1:] for item in ("--set", s)]
        assert main(["train", "--dataset", str(tiny_dataset.path), *argv, "--out", str(out)]) == 130
        err = capsys.readouterr().err
        assert f"seqrec: {out}: {said.format(out=out)}" in err and "seqrec: interrupted" in err
