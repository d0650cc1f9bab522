"""`seqrec compare`: runs grouped by everything but their seed, with mean and spread per group."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from seqrec.cli import main
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.eval.compare import Group, compare_runs, differences, label
from tests.conftest import synthetic_log

TINY = ["--set", "model.d=8", "--set", "data.max_len=8", "--set", "train.epochs=2", "--set", "train.progress=false",
        "--set", "train.refit=false", "--set", "model.n_layers=1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    data = prepare(synthetic_log(), PrepareOptions(), root / "data").path
    out = {}
    for name, extra in (("plain-s1", ["--set", "train.seed=1"]), ("plain-s2", ["--set", "train.seed=2"]),
                        ("plain-s3", ["--set", "train.seed=3", "--set", "train.threads=1"]),
                        ("hist-s1", ["--set", "train.seed=1", "--set", "model.history_bias=true"])):
        bias = [] if name.startswith("hist") else ["--set", "model.history_bias=false"]
        assert main(["train", "--dataset", str(data), "--model", "sasrec", "--out", str(root / name),
                     *TINY, *bias, *extra]) == 0
        out[name] = root / name
    return out


def test_runs_differing_only_in_their_seed_form_one_group(runs: dict[str, Path]) -> None:
    groups, differ = compare_runs([runs["plain-s1"], runs["hist-s1"], runs["plain-s2"], runs["plain-s3"]])
    assert [len(g.runs) for g in groups] == [3, 1] and groups[0].seeds == [1, 2, 3]
    assert "model.history_bias" in differ and "train.seed" not in differ and "train.threads" not in differ
    values = [json.loads((runs[n] / "results.json").read_text())["test"]["ndcg@10"]
              for n in ("plain-s1", "plain-s2", "plain-s3")]
    assert groups[0].mean("test ndcg@10") == pytest.approx(statistics.fmean(values))
    assert groups[0].std("test ndcg@10") == pytest.approx(statistics.stdev(values))
    assert groups[1].std("test ndcg@10") is None  # one run has no spread


def test_the_command_prints_a_table_csv_and_json(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    paths = [str(p) for p in runs.values()]
    assert main(["compare", *paths]) == 0
    out = capsys.readouterr().out
    assert "model.history_bias=False" in out and "model.history_bias=True" in out and "±" in out
    assert main(["compare", *paths, "--format", "json", "--metrics", "test ndcg@50"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["runs"] for r in rows] == [3, 1] and len(rows[0]["test ndcg@50"]) == 2
    assert rows[1]["test ndcg@50"][1] is None and rows[1]["differences"]["model.history_bias"] is True
    assert main(["compare", *paths, "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("group,runs,seeds,valid ndcg@10 mean") and len(lines) == 3
    assert main(["compare", *paths, "--metrics", "test ndcg@7"]) == 2
    assert "test ndcg@7 not in every run" in capsys.readouterr().err
    assert main(["compare", str(runs["plain-s1"].parent)]) == 2  # not a run
    assert "no config.json" in capsys.readouterr().err


def test_a_label_leads_with_the_model_and_names_only_settings_the_group_has() -> None:
    sasrec = Group({"model.name": '"sasrec"', "model.n_heads": "2", "model.d": "64", "model.d_ff": "256",
                    "model.n_layers": "2", "model.dropout": "0.5"}, runs=["runs/a"])
    gru = Group({"model.name": '"gru4rec"', "model.d": "64", "model.dropout": "0.3"}, runs=["runs/b"])
    differ = ["model.d_ff", "model.dropout", "model.n_heads", "model.n_layers", "model.name"]
    assert label(gru, differ) == "model.name=gru4rec, model.dropout=0.3"  # no '-' for another model's settings
    assert label(sasrec, differ) == ("model.name=sasrec, model.d_ff=256, model.dropout=0.5, model.n_heads=2 "
                                     "(+1 more)")
    assert list(differences(sasrec, differ)) == ["model.name", "model.d_ff", "model.dropout", "model.n_heads",
                                                 "model.n_layers"]
    assert label(Group({}, runs=["runs/plain"]), []) == "plain"
