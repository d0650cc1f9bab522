"""The `seqrec` command end to end on a tiny generated dataset, and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqrec.cli import main
from tests.conftest import synthetic_log

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SEQREC_HOME", str(tmp_path / "home"))
    raw = synthetic_log()
    raw.interactions.frame.rename({"user": "uid", "item": "iid", "timestamp": "ts"}).write_csv(tmp_path / "log.csv")
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_prepare_train_evaluate_recommend(home: Path, capsys: pytest.CaptureFixture[str],
                                          caplog: pytest.LogCaptureFixture) -> None:
    code, out, _ = run(capsys, "data", "prepare", "toy", "--format", "csv", "--path", str(home / "log.csv"),
                       "--user-col", "uid", "--item-col", "iid", "--time-col", "ts")
    assert code == 0 and "60 users, 30 items" in out
    code, out, _ = run(capsys, "data", "stats", "toy")
    assert code == 0 and "users         60" in out
    # what `seqrec train --model sasrec` would decide, with the properties it reads
    assert "auto          model.loss = ce: the full softmax's output layer" in out and " x 30 items x d=64" in out
    assert "auto          train.batch_size = 128" in out and "auto          data.stride = " in out
    code, out, _ = run(capsys, "data", "stats", "toy", "--json")
    stats = json.loads(out)
    assert code == 0 and stats["users"] == 60
    assert {"key": "train.batch_size", "value": 128} in [{k: d[k] for k in ("key", "value")} for d in stats["auto"]]
    run_dir = home / "run"
    code, out, _ = run(capsys, "train", "--dataset", "toy", "--model", "sasrec", "--out", str(run_dir),
                       "--set", "train.epochs=20", "--set", "model.d=16", "--set", "data.max_len=8",
                       "--set", "train.progress=false", "--set", "train.lr=0.01", "--set", "eval.ks=[5, 10]",
                       "--set", "model.history_bias=false")  # plain: the walk continues from a short history
    assert code == 0, out
    results = json.loads((run_dir / "results.json").read_text())
    assert results["protocol"]["ranking"] == "full (all items)"
    assert results["protocol"]["filter_seen"] is False and results["protocol"]["ks"] == [5, 10]
    assert results["protocol"]["dataset_fingerprint"] and results["protocol"]["history_bias"] is False
    assert results["stopped_by"].startswith(("early stop", "the epoch limit"))
    assert results["test"]["recall@10"] > 0.8  # the +1 walk is learnable
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == results["epochs_run"] and (run_dir / "curve.png").stat().st_size > 0
    assert (run_dir / "checkpoint" / "model.safetensors").is_file()
    code, out, _ = run(capsys, "evaluate", str(run_dir))
    assert code == 0
    test_row = next(line for line in out.splitlines() if line.startswith("test"))
    assert f"{results['test']['recall@10']:.4f}" in test_row and "already-seen" not in out
    code, out, _ = run(capsys, "evaluate", str(run_dir), "--filter-seen")
    assert code == 0 and out.startswith("(already-seen items removed from the ranking")
    # on another dataset: one line that names both and says what would work there
    run(capsys, "data", "prepare", "other", "--format", "csv", "--path", str(home / "log.csv"),
        "--user-col", "uid", "--item-col", "iid", "--time-col", "ts", "--min-user-len", "8")
    code, _, err = run(capsys, "evaluate", str(run_dir), "--dataset", "other")
    assert code == 2 and "trained on toy (dataset fingerprint" in err and "but other (" in err
    assert "evaluate a pre-training run zero-shot" in err and len(err.strip().splitlines()) == 1
    # a model with the history bias is not the published one: its results say so, in the file and printed
    biased = home / "biased"
    code, out, _ = run(capsys, "train", "--dataset", "toy", "--model", "sasrec", "--out", str(biased),
                       "--set", "train.epochs=1", "--set", "model.d=16", "--set", "data.max_len=8",
                       "--set", "train.progress=false", "--set", "model.history_bias=true",
                       "--set", "train.refit=false", "--set", "eval.ks=[10, 30]")
    assert code == 0 and "(a model with the history bias" in out
    # a cutoff that leaves no item out is said (every target counts as found there)
    assert "eval.ks: at 30 (not below the 30 items of toy) every target counts as found" in caplog.text
    assert json.loads((biased / "results.json").read_text())["protocol"]["history_bias"] is True
    assert json.loads((biased / "results.json").read_text())["stopped_by"] == "the epoch limit (train.epochs = 1)"
    code, out, _ = run(capsys, "evaluate", str(biased))
    assert code == 0 and "(a model with the history bias" in out
    code, out, _ = run(capsys, "evaluate", str(biased), "--filter-seen")
    assert code == 0 and "(already-seen items removed" in out and "(a model with the history bias" in out
    # history i3 i4 i5 -> the walk continues with i6
    code, out, _ = run(capsys, "recommend", str(run_dir), "--history", "i3 i4 i5", "-k", "3")
    assert code == 0
    first = out.splitlines()[0].split()
    assert first[1] == "i6" and "Item number 6" not in out  # the CSV has no titles
    code, out, _ = run(capsys, "recommend", str(run_dir), "--user", "u0", "-k", "2")
    assert code == 0 and "user u0" in out and "prepared again" not in out
    # the dataset prepared again from a longer log: --user takes the history as prepared now, and says so
    with (home / "log.csv").open("a") as f:
        f.write("u0,i1,99999999\n")
    assert run(capsys, "data", "prepare", "toy", "--format", "csv", "--path", str(home / "log.csv"),
               "--user-col", "uid", "--item-col", "iid", "--time-col", "ts")[0] == 0
    code, again, _ = run(capsys, "recommend", str(run_dir), "--user", "u0", "-k", "2")
    assert code == 0 and again.startswith("(note: ") and "prepared again since this run was trained" in again
    count = [int(line.split(":")[1].split()[0]) for text in (out, again) for line in text.splitlines()
             if line.startswith("user u0:")]
    assert count[1] == count[0] + 1, count


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["data", "prepare", "x", "--format", "csv", "--path", "missing.csv", "--user-col", "u", "--item-col", "i"],
         "missing.csv"),
        (["data", "prepare", "x", "--format", "csv", "--path", "{home}/log.csv", "--user-col", "user",
          "--item-col", "iid"], "available"),
        (["data", "prepare", "nope"], "unknown dataset"),
        (["data", "stats", "nope"], "no prepared dataset 'nope'"),
        (["data", "stats", "nope"], "prepared: toy"),  # nothing like it: what there is
        (["train", "--dataset", "tyo", "--model", "sasrec"], "did you mean 'toy'?"),
        (["data", "stats", "{home}/prepared/tyo"], "no prepared dataset at '{home}/prepared/tyo': does not exist"),
        (["data", "stats", "{home}"], "holds no meta.json"),  # a path: the names prepared are no hint
        (["train", "--dataset", "toy", "--set", "model.dd=3"], "model.dd"),
        (["train", "--dataset", "toy", "--set", "train.lr=fast"], "train.lr"),
        (["train", "--dataset", "toy", "--model", "gpt"], "unknown model"),
        (["train", "--dataset", "toy", "--model", "sasrec", "--config", str(REPO / "configs" / "ml-100k-gru4rec.toml")],
         "--model sasrec contradicts"),  # it trained SASRec with GRU4Rec's settings
        (["recommend", "{home}/nowhere", "--history", "i1"], "no such run folder"),
    ],
)
def test_user_mistakes_are_one_line_errors(home: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                           message: str) -> None:
    run(capsys, "data", "prepare", "toy", "--format", "csv", "--path", str(home / "log.csv"),
        "--user-col", "uid", "--item-col", "iid", "--time-col", "ts")
    code, _, err = run(capsys, *[a.format(home=home) for a in argv])
    assert code == 2
    assert err.startswith("seqrec: error:") and message.format(home=home) in err and len(err.strip().splitlines()) == 1


def test_recommend_errors(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "data", "prepare", "toy", "--format", "csv", "--path", str(home / "log.csv"),
        "--user-col", "uid", "--item-col", "iid", "--time-col", "ts")
    run_dir = home / "run"
    assert main(["train", "--dataset", "toy", "--out", str(run_dir), "--set", "train.epochs=1",
                 "--set", "model.d=8", "--set", "train.progress=false"]) == 0
    capsys.readouterr()
    for argv, message in [
        (["--history", "i1 zzz"], "unknown item id(s) in history: 'zzz'"),
        (["--history", "i1", "-k", "31"], "k=31"),
        (["--user", "nobody"], "unknown user"),
        (["--user", "u0", "-k", "31"], "k=31"),  # the user's history was printed before the error
        (["--history", '["i1", "Zed, Inc. 2"]'], "unknown item id(s) in history: 'Zed, Inc. 2'"),  # kept whole
        (["--history", '["i1", 2.5]'], "--history: a JSON array of item ids holds strings (or integers), not 2.5"),
        (["--history", '["i1"'], "--history: not a JSON array of item ids"),
        (["--history", "i1", "--candidates", '["i2", null]'], "--candidates: a JSON array of item ids holds"),
    ]:
        code, out, err = run(capsys, "recommend", str(run_dir), *argv)
        assert code == 2 and message in err and out == "", (err, out)  # nothing printed before the error
    # a JSON array names the same items as the split form
    plain = run(capsys, "recommend", str(run_dir), "--history", "i1, i2 i3", "-k", "3")
    assert run(capsys, "recommend", str(run_dir), "--history", '["i1", "i2", "i3"]', "-k", "3") == plain
    # fewer items than k: the table holds what there is, and stderr says why
    code, out, err = run(capsys, "recommend", str(run_dir), "--history", "i1", "--candidates", "i2 i3", "-k", "3")
    assert code == 0 and len(out.strip().splitlines()) == 2
    assert "(2 of k=3: no more items are left among the candidates)" in err
    # --skip-unknown: the unknown ids left out (named on stderr), the rest answered as that history is
    code, out, err = run(capsys, "recommend", str(run_dir), "--history", "i1 zzz i2 i3", "-k", "3", "--skip-unknown")
    assert code == 0 and out == plain[1] and "(left out, not in the run's catalogue: zzz)" in err
    code, out, err = run(capsys, "recommend", str(run_dir), "--history", "i1", "--candidates", "nope i2 i3", "-k", "3",
                         "--skip-unknown")
    assert code == 0 and len(out.strip().splitlines()) == 2 and "catalogue: nope)" in err
    code, out, err = run(capsys, "recommend", str(run_dir), "--history", "zzz", "--skip-unknown")
    assert code == 2 and "no item of the history is known: 'zzz'" in err and out == ""
    code, _, err = run(capsys, "recommend", str(run_dir), "--user", "u0", "--skip-unknown")
    assert code == 2 and "--skip-unknown go with --history" in err


def test_evaluate_a_refitted_run(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`evaluate` on a refit run validates the selected checkpoint and tests the refit, as training did."""
    run(capsys, "data", "prepare", "toy", "--format", "csv", "--path", str(home / "log.csv"),
        "--user-col", "uid", "--item-col", "iid", "--time-col", "ts")
    run_dir = home / "refit"
    code, out, _ = run(capsys, "train", "--dataset", "toy", "--model", "sasrec", "--out", str(run_dir),
                       "--set", "train.epochs=3", "--set", "model.d=16", "--set", "data.max_len=8",
                       "--set", "train.progress=false", "--set", "train.refit=true")
    assert code == 0, out
    results = json.loads((run_dir / "results.json").read_text())
    code, out, _ = run(capsys, "evaluate", str(run_dir))
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("valid", "test"))}
    assert f"{results['valid']['recall@10']:.4f}" in rows["valid"]
    assert f"{results['test']['recall@10']:.4f}" in rows["test"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from seqrec import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"seqrec {__version__}"


@pytest.mark.parametrize("argv, usage, meant", [
    (["data", "prepare", "x", "--text-templat", "{title}"], "seqrec data prepare", "--text-template"),  # a prefix
    (["train", "--modle", "sasrec"], "seqrec train", "--model"),
    (["text", "encode", "x", "--mising=id"], "seqrec text encode", "--missing")])
def test_a_shortened_or_misspelled_flag_is_refused_by_its_command(argv: list[str], usage: str, meant: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A prefix of a flag was taken for the flag (argparse's abbreviations), and a typo was refused with the
    top level's usage; now the command's own usage says which flag was likely meant."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith(f"usage: {usage} ") and f"(did you mean {meant}?)" in err


def test_a_cuda_device_where_there_is_none_is_a_one_line_error(home: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """train.device = "cuda" (and serve --device cuda) on a machine or torch without CUDA: exit 2, one line."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run(capsys, "data", "prepare", "toy", "--format", "csv", "--path", str(home / "log.csv"),
        "--user-col", "uid", "--item-col", "iid", "--time-col", "ts")
    for argv, named in ((["train", "--dataset", "toy", "--set", 'train.device="cuda"', "--out", str(home / "r")],
                         "train.device 'cuda'"),
                        (["serve", str(home / "r"), "--device", "cuda:1"], "--device 'cuda:1'"),
                        (["recommend", str(home / "r"), "--history", "i1", "--device", "cuda"], "--device 'cuda'")):
        (home / "r").mkdir(exist_ok=True)
        code, _, err = run(capsys, *argv)
        assert code == 2 and err.startswith(f"seqrec: error: {named}") and len(err.strip().splitlines()) == 1, err
        assert "(use cpu, or auto" in err
    code, _, err = run(capsys, "serve", str(home / "r"), "--device", "tpu")
    assert code == 2 and "--device: 'tpu' is not a device" in err, err  # the flag, not train.device


def test_a_run_folder_is_never_mixed_with_another_run(home: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--out holding a run is refused (finished or not), --overwrite replaces it whole (no file of the old run
    left); a folder of other files is refused even then. A dataset given by a relative path is recorded
    absolute, so the run evaluates from any folder."""
    run(capsys, "data", "prepare", "toy", "--format", "csv", "--path", str(home / "log.csv"),
        "--user-col", "uid", "--item-col", "iid", "--time-col", "ts")
    monkeypatch.chdir(home / "home")
    out = home / "run"
    train = ["train", "--dataset", "prepared/toy", "--out", str(out), "--set", "train.epochs=1", "--set", "model.d=8",
             "--set", "train.progress=false"]
    assert main([*train, "--model", "sasrec"]) == 0
    assert json.loads((out / "config.json").read_text())["data"]["dataset"] == str(home / "home" / "prepared" / "toy")
    (out / "export-onnx").mkdir()
    capsys.readouterr()
    code, _, err = run(capsys, *train, "--model", "gru4rec")
    assert code == 2 and "holds a run (finished)" in err and "--overwrite" in err
    (out / "state").mkdir()
    (out / "state" / "state.json").write_text('{"loop": {"epoch": 1}}')
    code, _, err = run(capsys, *train, "--model", "gru4rec")
    assert code == 2 and "not finished: stopped after epoch 1; --resume it" in err
    assert main([*train, "--model", "gru4rec", "--overwrite"]) == 0
    assert not (out / "export-onnx").exists() and not (out / "state").exists()
    assert json.loads((out / "config.json").read_text())["model"]["name"] == "gru4rec"
    other = home / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    code, _, err = run(capsys, *train[:3], "--out", str(other), "--overwrite")
    assert code == 2 and "holds other files, not a run" in err and (other / "notes.txt").is_file()
    monkeypatch.chdir(home)
    assert main(["evaluate", str(out)]) == 0


def test_a_run_trained_from_python_records_its_dataset(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from seqrec.config import resolve
    from seqrec.data.dataset import PreparedDataset
    from seqrec.train.loop import fit

    run(capsys, "data", "prepare", "toy", "--format", "csv", "--path", str(home / "log.csv"),
        "--user-col", "uid", "--item-col", "iid", "--time-col", "ts")
    cfg = resolve({"model": {"name": "gru4rec", "d": 8}, "train": {"epochs": 1, "progress": False}})
    fit(cfg, PreparedDataset.load(home / "home" / "prepared" / "toy"), home / "py-run")
    assert main(["evaluate", str(home / "py-run")]) == 0
    assert main(["recommend", str(home / "py-run"), "--user", "u1", "-k", "3"]) == 0


def test_preparing_again_says_when_it_replaced_other_data(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prep = ["data", "prepare", "toy", "--format", "csv", "--path", str(home / "log.csv"), "--user-col", "uid",
            "--item-col", "iid", "--time-col", "ts"]
    assert run(capsys, *prep)[0] == 0
    code, out, _ = run(capsys, *prep)  # the same data and options: the same dataset
    assert code == 0 and "replaced" not in out
    code, out, _ = run(capsys, *prep, "--min-user-len", "6")
    assert code == 0 and "it replaced a preparation with other data or options: fingerprint" in out


def test_event_columns_of_a_log_are_kept(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--event-cols rating keeps the log's rating as an event value (events.parquet), which a model's event
    features read; a column the log lacks is named."""
    import polars as pl

    frame = pl.read_csv(home / "log.csv")
    frame.with_columns((pl.col("ts") % 5 + 1).alias("rating")).write_csv(home / "rated.csv")
    prep = ["data", "prepare", "rated", "--format", "csv", "--path", str(home / "rated.csv"), "--user-col", "uid",
            "--item-col", "iid", "--time-col", "ts"]
    assert run(capsys, *prep, "--event-cols", "rating")[0] == 0
    events = pl.read_parquet(home / "home" / "prepared" / "rated" / "events.parquet")
    assert events.columns == ["rating"] and set(events["rating"].to_list()) <= {1, 2, 3, 4, 5}
    code, _, err = run(capsys, *prep, "--event-cols", "rating,stars")
    assert code == 2 and "'stars'" in err
