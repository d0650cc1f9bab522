"""`seqrec tune`: trials never read the test split, a study resumes where it stopped, and the command
ends with one tested run of the best settings."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from seqrec.cli import main
from seqrec.data.dataset import PreparedDataset
from seqrec.errors import SeqrecError
from seqrec.train.tune import base_config, tune

BASE = {"model": {"name": "sasrec", "n_heads": 1}, "data": {"max_len": 8},
        "train": {"epochs": 3, "batch_size": 64, "patience": 2}}


class NoTestSplit(PreparedDataset):
    """A dataset whose test targets cannot be read: any access raises."""

    def eval_positions(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        if which == "test":
            raise AssertionError("the tuner read the test split")
        return super().eval_positions(which)


def no_test(data: PreparedDataset) -> NoTestSplit:
    return NoTestSplit(data.path, data.meta, data.items, data.offsets, data.split, data.times)


def test_trials_never_read_the_test_split(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    data = no_test(tiny_dataset)
    with pytest.raises(AssertionError, match="test split"):
        data.eval_positions("test")
    report = tune({**BASE, "data": {**BASE["data"], "dataset": str(data.path)}}, data, tmp_path / "study",
                  budget_s=120, trials=3, final=False)
    assert report["n_trials"] == 3 and all(t["state"] == "complete" for t in report["trials"])
    for n in range(3):
        results = json.loads((tmp_path / "study" / "trials" / str(n) / "results.json").read_text())
        assert "test" not in results and results["protocol"]["evaluated_on"] == "valid"
        config = json.loads((tmp_path / "study" / "trials" / str(n) / "config.json").read_text())
        assert config["train"]["optimizer"] == "adamw"  # the base's (SASRec's default), though the decay is searched
    assert (tmp_path / "study" / "trials.json").is_file() and (tmp_path / "study" / "tune.png").is_file()


def test_a_resumed_study_continues_its_trial_count(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    study = tmp_path / "study"
    first = tune(BASE, tiny_dataset, study, budget_s=120, trials=2, final=False)
    second = tune(BASE, tiny_dataset, study, budget_s=120, trials=2, final=False)
    assert first["n_trials"] == 2 and second["n_trials"] == 4
    assert [t["number"] for t in second["trials"]] == [0, 1, 2, 3]
    assert sorted(p.name for p in (study / "trials").iterdir()) == ["0", "1", "2", "3"]


def test_cli_tune_trains_and_tests_the_best(tiny_dataset: PreparedDataset, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tuned"
    argv = ["tune", "--dataset", str(tiny_dataset.path), "--model", "sasrec", "--trials", "2", "--budget", "120",
            "--set", "data.max_len=8", "--set", "train.epochs=2", "--set", "model.n_heads=1", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "best trial" in printed and "test" in printed
    results = json.loads((out / "best" / "results.json").read_text())
    assert "test" in results
    report = json.loads((out / "trials.json").read_text())
    assert report["best_run"]["test"] == results["test"]
    # the final run takes the best trial's machine-dependent decisions instead of making them again
    best = report["best_run"]["config"]
    assert best["model"]["loss"] == "ce" and best["train"]["batch_size"] == 128
    assert best["train"]["sparse_items"] is False


def test_unknown_model_space_is_an_error(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    with pytest.raises(SeqrecError, match="no search space"):
        tune({"model": {"name": "item2vec"}}, tiny_dataset, tmp_path / "s", budget_s=10, trials=1)


def test_the_budget_bounds_a_running_trial(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    """A trial that would train for a thousand epochs stops at the study's budget, keeping its best epoch."""
    import time

    long = {**BASE, "train": {"epochs": 1000, "patience": 1000, "batch_size": 64}}
    t0 = time.perf_counter()
    report = tune(long, tiny_dataset, tmp_path / "study", budget_s=3, trials=None, final=False)
    assert time.perf_counter() - t0 < 60
    first = report["trials"][0]
    assert first["state"] == "complete" and first["valid_ndcg@10"] is not None
    results = json.loads((tmp_path / "study" / "trials" / "0" / "results.json").read_text())
    assert results["epochs_run"] < 1000


def test_each_trial_is_capped_at_its_share_of_the_budget(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    """With min_trials=4 a 40 s budget gives no trial more than 10 s of training, whatever its recipe asks."""
    long = {**BASE, "train": {"epochs": 1000, "patience": 1000, "batch_size": 64, "time_budget_s": 600}}
    report = tune(long, tiny_dataset, tmp_path / "study", budget_s=40, trials=1, final=False, min_trials=4)
    assert report["trials"][0]["state"] == "complete"
    config = json.loads((tmp_path / "study" / "trials" / "0" / "config.json").read_text())
    assert 0 < config["train"]["time_budget_s"] <= 10
    results = json.loads((tmp_path / "study" / "trials" / "0" / "results.json").read_text())
    assert results["epochs_run"] < 1000
    with pytest.raises(SeqrecError, match="min-trials"):
        tune(BASE, tiny_dataset, tmp_path / "other", budget_s=10, trials=1, min_trials=0)


def test_the_first_trial_is_the_base_itself(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    """Trial 0 trains the base's own settings ("auto" decided from the data); a value the space cannot hold
    (d=48, a weight decay of 0) is kept as the base has it, undrawn, and a resumed study does not queue the
    base again."""
    base = {**BASE, "model": {**BASE["model"], "d": 48, "n_layers": 1, "dropout": 0.25},
            "train": {**BASE["train"], "lr": 0.002, "weight_decay": 0.0}}
    study = tmp_path / "study"
    report = tune(base, tiny_dataset, study, budget_s=120, trials=2, final=False)
    first = report["trials"][0]
    assert first["base"] and not report["trials"][1]["base"]
    assert first["params"] == report["base_point"] and "model.d" not in first["params"]
    assert "train.weight_decay" not in first["params"]
    assert first["params"]["model.n_layers"] == 1 and first["params"]["model.dropout"] == 0.25
    assert first["params"]["train.lr"] == 0.002
    assert first["params"]["model.history_bias"] is True  # "auto" on the tiny data: no repeats, the full softmax
    trained = json.loads((study / "trials" / "0" / "config.json").read_text())
    assert trained["model"]["d"] == 48 and trained["train"]["weight_decay"] == 0.0
    assert {"model.d", "train.weight_decay"} <= set(report["trials"][1]["params"])  # later trials draw them
    again = tune(base, tiny_dataset, study, budget_s=120, trials=1, final=False)
    assert again["n_trials"] == 3 and not again["trials"][2]["base"]


def test_a_base_trial_cut_short_runs_again_when_the_study_goes_on(tiny_dataset: PreparedDataset, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted during the base trial (here: it failed), the next call on the study queues the base again."""
    first_call = [True]
    fake_fit(monkeypatch, lambda run_dir: "interrupted" if run_dir.name == "0" and first_call[0] else None)
    study = tmp_path / "study"
    report = tune(BASE, tiny_dataset, study, budget_s=120, trials=2, final=False)
    assert [(t["base"], t["state"]) for t in report["trials"]] == [(True, "fail"), (False, "complete")]
    first_call[0] = False
    again = tune(BASE, tiny_dataset, study, budget_s=120, trials=2, final=False)
    rerun = again["trials"][2]
    assert rerun["base"] and rerun["state"] == "complete" and rerun["params"] == again["base_point"]
    assert not again["trials"][3]["base"]


def fake_fit(monkeypatch: pytest.MonkeyPatch, fail: Callable[[Path], str | None] = lambda run_dir: None) -> list[Path]:
    """Trials without training: `fit` records its run folder and scores 0.1, or raises what `fail` names."""
    calls: list[Path] = []

    def fit(cfg: object, data: PreparedDataset, run_dir: Path, **kwargs: object) -> dict[str, object]:
        calls.append(run_dir)
        why = fail(run_dir)
        if why:
            raise RuntimeError(why)
        return {"valid": {"ndcg@10": 0.1}}

    monkeypatch.setattr("seqrec.train.loop.fit", fit)
    return calls


def test_parallel_jobs_run_the_queued_base_trial_once(tiny_dataset: PreparedDataset, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Optuna's SQLite study can hand one queued trial to two workers (optuna/optuna#4002); forced here by a
    window between reading the queue and taking from it. The base trial runs alone, once."""
    import optuna
    from optuna.trial import TrialState

    def racy_pop(self: optuna.Study) -> int | None:
        waiting = self._storage.get_all_trials(self._study_id, deepcopy=False, states=(TrialState.WAITING,))
        if not waiting:
            return None
        time.sleep(0.5)  # another worker asking now reads the same queue
        self._storage.set_trial_state_values(waiting[0]._trial_id, state=TrialState.RUNNING)
        return waiting[0]._trial_id

    monkeypatch.setattr(optuna.Study, "_pop_waiting_trial_id", racy_pop)
    calls = fake_fit(monkeypatch)
    study = tmp_path / "study"
    report = tune(BASE, tiny_dataset, study, budget_s=120, trials=3, jobs=2, final=False)
    assert sorted(p.name for p in calls) == ["0", "1", "2"] and all(p.parent == study / "trials" for p in calls)
    assert [t["state"] for t in report["trials"]] == ["complete"] * 3 and report["n_trials_this_call"] == 3
    assert report["base_point"] == {k: report["trials"][0]["params"][k] for k in report["base_point"]}


def test_failed_trials_are_named_not_the_budget(tiny_dataset: PreparedDataset, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Where every trial raised, the error counts them and gives the first one's reason, on one line."""
    fake_fit(monkeypatch, lambda run_dir: "CUDA out of memory\n(a long report)")
    with pytest.raises(SeqrecError) as caught:
        tune(BASE, tiny_dataset, tmp_path / "study", budget_s=120, trials=3, jobs=2, final=False)
    message = str(caught.value)
    assert "3 of 3 failed" in message and "trial 0: RuntimeError: CUDA out of memory" in message
    assert "budget" not in message and "\n" not in message
    report = json.loads((tmp_path / "study" / "trials.json").read_text())
    assert [t["error"] for t in report["trials"]] == ["RuntimeError: CUDA out of memory"] * 3


def test_a_failed_trial_does_not_stop_the_study(tiny_dataset: PreparedDataset, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    fake_fit(monkeypatch, lambda run_dir: "boom" if run_dir.name == "1" else None)
    with caplog.at_level(logging.WARNING, logger="seqrec.train.tune"):
        report = tune(BASE, tiny_dataset, tmp_path / "study", budget_s=120, trials=3, final=False)
    assert [t["state"] for t in report["trials"]] == ["complete", "fail", "complete"]
    assert report["trials"][1]["error"] == "RuntimeError: boom" and report["best_trial"]["number"] in (0, 2)
    assert "1 of 3 trials this call failed; the first, trial 1: RuntimeError: boom" in caplog.text


def test_the_trial_count_of_a_call(tiny_dataset: PreparedDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   caplog: pytest.LogCaptureFixture) -> None:
    """The queued base trial is one of the first call's trials, not one from before it."""
    fake_fit(monkeypatch)
    study = tmp_path / "study"
    with caplog.at_level(logging.INFO, logger="seqrec.train.tune"):
        first = tune(BASE, tiny_dataset, study, budget_s=120, trials=2, final=False)
        second = tune(BASE, tiny_dataset, study, budget_s=120, trials=3, final=False)
    assert (first["n_trials_this_call"], first["n_trials"]) == (2, 2)
    assert (second["n_trials_this_call"], second["n_trials"]) == (3, 5)
    counts = [r.getMessage() for r in caplog.records if "this call" in r.getMessage()]
    assert counts[0].startswith("tune: 2 trials this call (2 in the study)")
    assert counts[1].startswith("tune: 3 trials this call (5 in the study)")


def test_a_study_goes_on_only_with_its_own_arguments(tiny_dataset: PreparedDataset, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Another model, dataset or base config with the --out of a study is refused, saying what differs; the
    same data at another path goes on."""
    fake_fit(monkeypatch)
    study = tmp_path / "study"
    base = base_config(None, "sasrec", str(tiny_dataset.path), ["data.max_len=8", "train.epochs=3",
                                                                 "model.n_heads=1"])
    tune(base, tiny_dataset, study, budget_s=120, trials=1, final=False)
    epochs = {**base, "train": {**base["train"], "epochs": 5}}
    with pytest.raises(SeqrecError, match=r"another base config \(train.epochs 3 there, 5 now\).*new --out"):
        tune(epochs, tiny_dataset, study, budget_s=120, trials=1, final=False)
    gru = {**base, "model": {"name": "gru4rec"}}
    with pytest.raises(SeqrecError, match=r"tunes model 'sasrec', not 'gru4rec'.*new --out"):
        tune(gru, tiny_dataset, study, budget_s=120, trials=1, final=False)
    other = PreparedDataset(tiny_dataset.path, {**tiny_dataset.meta, "fingerprint": "f0"}, tiny_dataset.items,
                            tiny_dataset.offsets, tiny_dataset.split, tiny_dataset.times)
    with pytest.raises(SeqrecError, match=f"another dataset \\(fingerprint {tiny_dataset.fingerprint};.* f0\\)"):
        tune(base, other, study, budget_s=120, trials=1, final=False)
    argv = ["tune", "--dataset", str(tiny_dataset.path), "--model", "sasrec", "--trials", "1", "--out", str(study),
            "--set", "data.max_len=8", "--set", "train.epochs=2", "--set", "model.n_heads=1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"seqrec: error: --out {study}: its study has another base config (train.epochs 3 there, 2 now); "
                   "give a new --out, or the study's own arguments to go on with it"]
    moved = {**base, "data": {**base["data"], "dataset": str(tmp_path / "elsewhere")}}
    assert tune(moved, tiny_dataset, study, budget_s=120, trials=1, final=False)["n_trials"] == 2


def test_tune_refuses_to_run_under_torchrun(tiny_dataset: PreparedDataset, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Under torchrun every rank would run its own study of DDP trials that cannot agree; refused, nothing written."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["tune", "--dataset", str(tiny_dataset.path), "--trials", "1", "--out", str(tmp_path / "t")]) == 2
    assert "not under torchrun" in capsys.readouterr().err and not (tmp_path / "t").exists()


def test_ctrl_c_in_a_trial_prints_no_traceback(tiny_dataset: PreparedDataset, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Optuna logs the interrupted trial as failed with its traceback; the CLI says "interrupted" on its own.
    (Read from a handler on Optuna's logger: its own stderr handler may hold another test's captured stream.)"""
    def interrupted(cfg: object, data: PreparedDataset, run_dir: Path, **kwargs: object) -> None:
        raise KeyboardInterrupt

    class Records(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    monkeypatch.setattr("seqrec.train.loop.fit", interrupted)
    seen = Records()
    logging.getLogger("optuna.study._optimize").addHandler(seen)
    try:
        with pytest.raises(KeyboardInterrupt):
            tune(BASE, tiny_dataset, tmp_path / "study", budget_s=120, trials=2, final=False)
    finally:
        logging.getLogger("optuna.study._optimize").removeHandler(seen)
    assert seen.records  # Optuna did log the failed trial ...
    assert not [r for r in seen.records if r.exc_info]  # ... and no traceback with it


def test_jobs_auto_fills_the_cores_at_each_trials_threads() -> None:
    from seqrec.train.tune_space import auto_jobs

    assert auto_jobs(0, cores=2)[0] == 1  # a trial on torch's default threads takes every core
    assert auto_jobs(1, cores=2)[0] == 2 and auto_jobs(2, cores=8)[0] == 4
    assert auto_jobs(4, cores=2)[0] == 1  # never none
    assert "2 cores" in auto_jobs(1, cores=2)[1]
