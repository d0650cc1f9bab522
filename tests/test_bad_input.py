"""Bad input to every `seqrec` command: exit status 2, one line on stderr that starts with
`seqrec: error:` and names the file, column or value at fault, no traceback, and nothing written.

Each case runs `seqrec.cli.main` in-process on tiny generated data: a prepared dataset with item text
(`syn`), one without text and with another fingerprint (`other`), one-epoch SASRec and UniSRec runs on
`syn` (the UniSRec one with a tiny random BERT as its text encoder). "Nothing written" is checked on
the whole module folder (datasets, runs, $SEQREC_HOME) and on the case's own folder, which is also the
working directory (where `train` without `--out` would put runs/). In-process, log records go to
pytest's log capture, where each case checks that none came before the error (a real process would
print them on stderr above it; see LOADS_FIRST for the one exception); a few cases also run as a
real process (`python -m seqrec.cli`)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from seqrec.cli import main
from seqrec.data.prepare import PrepareOptions, prepare
from tests.conftest import synthetic_log
from tests.unisrec_helpers import TEXT_DIM, make_tiny_encoder

Paths = dict[str, Path]
Prep = Callable[[Path, Paths], None]
TINY = ("--set model.d=8 --set model.n_heads=2 --set model.d_ff=16 --set model.n_layers=1 --set data.max_len=8 "
        "--set train.epochs=1 --set train.progress=false")
UNISREC = f"--set model.text_dim={TEXT_DIM} --set model.text_max_length=16 --set model.n_experts=2"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Paths:
    root = tmp_path_factory.mktemp("bad-input")
    home = root / "home"
    w = {"home": home, "root": root, "enc": make_tiny_encoder(root / "enc"), "csv": root / "log.csv"}
    synthetic_log(seed=1).interactions.frame.rename({"user": "uid", "item": "iid", "timestamp": "ts"}).write_csv(
        w["csv"])
    w["syn"] = prepare(synthetic_log(), PrepareOptions(), home / "prepared" / "syn").path
    no_text = dataclasses.replace(synthetic_log(seed=1), items=None)
    w["other"] = prepare(no_text, PrepareOptions(), home / "prepared" / "other").path
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SEQREC_HOME", str(home))
        unisrec = f"--model unisrec {UNISREC} --set model.text_encoder={{enc}}"
        for name, extra in (("sasrec", ""), ("unisrec", unisrec)):
            argv = fill(f"train --dataset syn --out {{root}}/{name} {TINY} {extra}", w)
            assert main(argv) == 0, f"the tiny {name} run did not train"
            w[name] = root / name
    return w


def subst(text: str, paths: Paths) -> str:
    """`{name}` placeholders replaced by the paths of that name (others are left as they are)."""
    return re.sub(r"\{(\w+)\}", lambda m: str(paths[m[1]]) if m[1] in paths else m[0], text)


def fill(template: str, paths: Paths) -> list[str]:
    """The argv of a case: placeholders replaced, then split like a shell."""
    return shlex.split(subst(template, paths))


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder under `folder`: relative path -> sha256 of the content ('' for folders); not the
    onnx engine's graph cache (`$SEQREC_HOME/onnx`: a whole graph of the run, written before a later
    check fails, that a next start loads instead of exporting again; not an output of the command)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
            for p in sorted(folder.rglob("*")) if p.relative_to(folder).parts[:2] != ("home", "onnx")}


# ---- inputs the cases write into their own folder ------------------------------------------------

def text_file(name: str, text: str | bytes) -> Prep:
    def prep(tmp: Path, w: Paths) -> None:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(text.encode() if isinstance(text, str) else text)
    return prep


def log_csv(*rows: str) -> Prep:
    return text_file("log.csv", "uid,iid,ts\n" + "".join(f"{r}\n" for r in rows))


def run_copy(damage: Callable[[Path], None] = lambda ckpt: None, run: str = "sasrec") -> Prep:
    """A copy of a trained run at {tmp}/run, its checkpoint damaged by `damage`."""
    def prep(tmp: Path, w: Paths) -> None:
        shutil.copytree(w[run], tmp / "run")
        damage(tmp / "run" / "checkpoint")
    return prep


def truncate(ckpt: Path) -> None:
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])


def flip_byte(ckpt: Path) -> None:
    data = bytearray((ckpt / "model.safetensors").read_bytes())
    data[-5] ^= 0xFF
    (ckpt / "model.safetensors").write_bytes(bytes(data))


def unisrec_files(prefix: str) -> Prep:
    """UniSRec's pre-split atomic files: one user, train / valid / test."""
    def prep(tmp: Path, w: Paths) -> None:
        header = "user_id:token\titem_id_list:token_seq\titem_id:token\n"
        for split, (history, target) in {"train": ("1 2", 3), "valid": ("1 2 3", 4), "test": ("1 2 3 4", 5)}.items():
            text_file(f"{prefix}.{split}.inter", f"{header}1\t{history}\t{target}\n")(tmp, w)
    return prep


def dataset_copy(damage: Callable[[Path], None]) -> Prep:
    def prep(tmp: Path, w: Paths) -> None:
        shutil.copytree(w["syn"], tmp / "ds")
        damage(tmp / "ds")
    return prep


OTHER_HEAD = '{"op": "catalogue", "items": 3, "fingerprint": "0123456789abcdef0123", "log": "x"}\n'


def case(id: str, argv: str, needle: str, prep: Prep | None = None) -> object:
    return pytest.param(argv, needle, prep, id=id)


CSV = "--format csv --user-col uid --item-col iid --time-col ts"
PREP = f"data prepare x {CSV} --out {{tmp}}/out --path"

DATA = [
    case("fetch-unknown", "data fetch nope", "'nope'"),
    case("prepare-missing-file", f"{PREP} {{tmp}}/missing.csv", "missing.csv"),
    case("prepare-folder-as-file", f"{PREP} {{tmp}}", "is a folder"),
    case("prepare-unknown-format", "data prepare x --format xlsx --path {csv} --out {tmp}/out", "'xlsx'"),
    case("prepare-format-no-path", "data prepare x --format csv --out {tmp}/out", "--format needs --path"),
    case("prepare-csv-no-user-col", "data prepare x --format csv --path {csv} --item-col iid --out {tmp}/out",
         "--user-col"),
    case("prepare-option-format-lacks", "data prepare x --format s3rec --path {csv} --user-col u --out {tmp}/out",
         "--user-col"),
    case("prepare-wrong-user-column", "data prepare x --format csv --path {csv} --user-col user --item-col iid "
         "--out {tmp}/out", "'user'"),
    case("prepare-wrong-time-column", f"{PREP} {{csv}} --time-col when", "'when'"),
    case("prepare-unknown-suffix", "data prepare x --format table --path {tmp}/log.xlsx --user-col uid "
         "--item-col iid --out {tmp}/out", "'.xlsx'", text_file("log.xlsx", "uid,iid\n")),
    case("prepare-long-separator", f"{PREP} {{csv}} --sep ';;'", "';;'"),
    case("prepare-wrong-separator", f"{PREP} {{tmp}}/log.csv --sep ';'", "'uid'", log_csv("u1,i1,1", "u1,i2,2")),
    case("prepare-empty-file", f"{PREP} {{tmp}}/log.csv", "log.csv", text_file("log.csv", "")),
    case("prepare-header-only", f"{PREP} {{tmp}}/log.csv", "no interactions left", log_csv()),
    case("prepare-nan-timestamp", f"{PREP} {{tmp}}/log.csv", "line 3", log_csv("u1,i1,1", "u1,i2,nan", "u1,i3,3")),
    case("prepare-inf-timestamp", f"{PREP} {{tmp}}/log.csv", "'inf'", log_csv("u1,i1,1", "u1,i2,inf", "u1,i3,3")),
    case("prepare-text-timestamp", f"{PREP} {{tmp}}/log.csv", "'yesterday'",
         log_csv("u1,i1,1", "u1,i2,yesterday")),
    case("prepare-time-format-mismatch", f"{PREP} {{csv}} --time-format %Y-%m-%d", "%Y-%m-%d"),
    case("prepare-empty-user-id", f"{PREP} {{tmp}}/log.csv", "line 3", log_csv("u1,i1,1", ",i2,2")),
    case("prepare-user-and-item-one-column", "data prepare x --format csv --path {csv} --user-col uid "
         "--item-col uid --out {tmp}/out", "the user and the item column are both 'uid'"),
    case("prepare-users-too-short-for-leave-one-out", f"{PREP} {{csv}} --min-user-len 1",
         "--min-user-len must be >= 3, got 1"),
    case("prepare-text-among-numbers", f"{PREP} {{tmp}}/log.csv --event-cols rating", "line 3: column 'rating' holds "
         "'good' among numbers", text_file("log.csv", "uid,iid,ts,rating\nu1,i1,1,5\nu1,i2,2,good\nu1,i3,3,\n")),
    case("prepare-ragged-line", f"{PREP} {{tmp}}/log.csv", "log.csv", log_csv("u1,i1,1", "u1,i2,2,9,9", "u1,i3")),
    case("prepare-one-item", f"{PREP} {{tmp}}/log.csv", "only one distinct item",
         log_csv(*(f"u{u},i1,{t}" for u in range(5) for t in range(4)))),
    case("prepare-not-parquet", "data prepare x --format parquet --path {tmp}/log.parquet --user-col uid "
         "--item-col iid --out {tmp}/out", "log.parquet", text_file("log.parquet", "uid,iid\nu1,i1\n")),
    case("prepare-s3rec-not-int", "data prepare x --format s3rec --path {tmp}/s.txt --out {tmp}/out", "'x'",
         text_file("s.txt", "1 2 3\n2 4 x\n")),
    case("prepare-s3rec-not-utf8", "data prepare x --format s3rec --path {tmp}/s.txt --out {tmp}/out",
         "not utf-8", text_file("s.txt", b"1 2 \xff\n")),
    case("prepare-recbole-empty", "data prepare x --format recbole --path {tmp}/rb --out {tmp}/out",
         "x.inter", text_file("rb/x.inter", "")),
    case("prepare-lcrec-bad-json", "data prepare x --format lcrec --path {tmp}/x.inter.json --out {tmp}/out",
         "x.inter.json", text_file("x.inter.json", '{"1": [1, 2,')),
    case("prepare-lcrec-not-a-table", "data prepare x --format lcrec --path {tmp}/x.inter.json --out {tmp}/out",
         "x.inter.json", text_file("x.inter.json", "[1, 2, 3]")),
    case("prepare-movielens-no-udata", "data prepare x --format movielens --path {tmp} --out {tmp}/out", "u.data"),
    case("prepare-movielens-inf-timestamp", "data prepare x --format movielens --path {tmp}/ml --out {tmp}/out",
         "u.data, line 2: timestamp value 'inf' is not a finite number",
         text_file("ml/u.data", "1\t1\t5\t1\n1\t2\t4\tinf\n")),
    case("prepare-recbole-nan-timestamp", "data prepare x --format recbole --path {tmp}/rb --out {tmp}/out",
         "x.inter, line 3: timestamp value 'nan' is not a finite number",
         text_file("rb/x.inter", "user_id:token\titem_id:token\ttimestamp:float\n1\t1\t1\n1\t2\tnan\n")),
    case("prepare-recbole-inf-rating", "data prepare x --format recbole --path {tmp}/rb --out {tmp}/out",
         "rating value '-inf' is not a finite number",
         text_file("rb/x.inter", "user_id:token\titem_id:token\trating:float\n1\t1\t-inf\n")),
    case("prepare-unknown-dataset", "data prepare nope --out {tmp}/out", "'nope'"),
    case("prepare-known-no-source", "data prepare yelp-p5 --source {tmp}/nowhere --out {tmp}/out", "nowhere"),
    case("prepare-known-empty-source", "data prepare lastfm-s3rec --source {tmp}/src --out {tmp}/out",
         "LastFM.txt", text_file("src/readme", "")),
    case("prepare-time-split-no-times", "data prepare x --format csv --path {csv} --user-col uid --item-col iid "
         "--split time --out {tmp}/out", "time split needs timestamps"),
    case("prepare-test-frac-out-of-range", f"{PREP} {{csv}} --split time --test-frac 1.5", "test_frac"),
    case("prepare-fracs-sum-to-one", f"{PREP} {{csv}} --split time --test-frac 0.5 --valid-frac 0.5",
         "valid_frac"),
    case("prepare-negative-kcore", f"{PREP} {{csv}} --kcore -3", "kcore"),
    case("prepare-kcore-empties", f"{PREP} {{csv}} --kcore 100", "kcore=100"),
    case("prepare-over-existing-dataset", f"data prepare x {CSV} --path {{csv}} --kcore 100 --out {{tmp}}/ds",
         "kcore=100", dataset_copy(lambda d: None)),
    case("prepare-min-user-len-zero", f"{PREP} {{csv}} --min-user-len 0", "min_user_len"),
    case("prepare-presplit-filtered", "data prepare x --format unisrec --path {tmp}/u --kcore 5 --out {tmp}/out",
         "pre-split", unisrec_files("u/x")),
    case("prepare-items-no-key-column", f"{PREP} {{csv}} --items {{tmp}}/items.csv", "no item key column 'iid'",
         text_file("items.csv", "sku,title\ni1,One\n")),
    case("prepare-items-duplicate-key", f"{PREP} {{csv}} --items {{tmp}}/items.csv", "item id 'i1'",
         text_file("items.csv", "iid,title\ni1,One\ni2,Two\ni1,Again\n")),
    case("prepare-items-template-unknown-field", f"{PREP} {{csv}} --items {{tmp}}/items.csv --text-template "
         "'{title}. {brand}'", "['brand']", text_file("items.csv", "iid,title\ni1,One\n")),
    case("prepare-items-template-all-empty", f"{PREP} {{csv}} --items {{tmp}}/items.csv --text-template '{{title}}'",
         "empty text for every item", text_file("items.csv", "iid,title\ni1,\ni2,\n")),
    case("prepare-items-no-id-matches", f"{PREP} {{csv}} --items {{tmp}}/items.csv", "none of the log's",
         text_file("items.csv", "iid,title\nzz,One\n")),
    case("prepare-items-missing-file", f"{PREP} {{csv}} --items {{tmp}}/nothere.parquet", "nothere.parquet"),
    case("prepare-item-key-without-items", f"{PREP} {{csv}} --item-key sku", "--item-key needs --items"),
    case("prepare-items-bad-template", f"{PREP} {{csv}} --items {{tmp}}/items.csv --text-template '{{title'",
         "{title", text_file("items.csv", "iid,title\ni1,One\n")),
    case("prepare-jsonl-bad-line", "data prepare x --format jsonl --path {tmp}/log.jsonl --user-col uid "
         "--item-col iid --out {tmp}/out", "log.jsonl", text_file("log.jsonl", '{"uid": 1, "iid": 2}\n{"uid": \n')),
    case("prepare-recbole-seq-no-files", "data prepare x --format recbole-seq --path {tmp} --out {tmp}/out",
         ".test.inter"),
    case("stats-unknown", "data stats nope", "'nope'"),
    case("cold-split-unknown", "data cold-split nope --out {tmp}/cold", "'nope'"),
    case("cold-split-fraction-out-of-range", "data cold-split {syn} --fraction 2 --out {tmp}/cold",
         "--fraction must be between 0 and 1"),
    case("cold-split-onto-itself", "data cold-split {syn} --out {syn}", "is the dataset itself"),
    case("compare-not-a-run", "compare {tmp}", "no config.json"),
    case("compare-unknown-metric", "compare {sasrec} --metrics 'test hitrate@10'", "hitrate@10"),
    case("compare-damaged-results", "compare {sasrec} {tmp}/run", "damaged config.json or results.json",
         run_copy(lambda ckpt: (ckpt.parent / "results.json").write_text("{"))),
    case("stats-corrupt-meta", "data stats {tmp}/ds", "meta.json",
         dataset_copy(lambda d: (d / "meta.json").write_text('{"name": '))),
    case("stats-old-format", "data stats {tmp}/ds", "incompatible format",
         dataset_copy(lambda d: (d / "meta.json").write_text('{"format_version": 0}'))),
    case("stats-missing-array", "data stats {tmp}/ds", "seq_items.npy",
         dataset_copy(lambda d: (d / "seq_items.npy").unlink())),
    case("stats-truncated-array", "data stats {tmp}/ds", "seq_offsets.npy",
         dataset_copy(lambda d: (d / "seq_offsets.npy").write_bytes((d / "seq_offsets.npy").read_bytes()[:40]))),
    case("stats-meta-not-an-object", "data stats {tmp}/ds", "incompatible format",
         dataset_copy(lambda d: (d / "meta.json").write_text("[1]"))),
    case("features-unknown", "data features nope", "'nope'"),
    case("features-damaged-items", "data features {tmp}/ds", "items.parquet",
         dataset_copy(lambda d: (d / "items.parquet").write_bytes(b"PAR1 not parquet PAR1"))),
    case("prepare-missing-columns-named-by-flag", "data prepare x --format csv --path {csv} --out {tmp}/out",
         "--format csv needs --user-col and --item-col"),
    case("prepare-refused-option-named-by-flag", "data prepare x --format s3rec --path {csv} --time-col ts "
         "--out {tmp}/out", "--format s3rec does not take --time-col"),
    case("prepare-day-first-time", f"{PREP} {{tmp}}/log.csv", "value '13/09/2020 12:27' is not ISO 8601",
         log_csv("u1,i1,13/09/2020 12:27", "u1,i2,14/09/2020 12:27", "u1,i3,15/09/2020 12:27")),
    case("prepare-day-month-ambiguous-time", f"{PREP} {{tmp}}/log.csv", "line 2: time 'ts' value '01/02/2020'",
         log_csv("u1,i1,01/02/2020", "u1,i2,03/01/2020", "u1,i3,05/01/2020")),
    case("prepare-bad-time-names-the-flag", f"{PREP} {{tmp}}/log.csv", "--time-format, e.g. '%d/%m/%Y %H:%M'",
         log_csv("u1,i1,1", "u1,i2,yesterday")),
    case("prepare-jsonl-bad-line-number", "data prepare x --format jsonl --path {tmp}/log.jsonl --user-col uid "
         "--item-col iid --out {tmp}/out", "log.jsonl, line 6: not valid JSON",
         text_file("log.jsonl", "".join(f'{{"uid": 1, "iid": {i}}}\n' for i in range(5)) + '{"uid": :}\n')),
    case("prepare-csv-extra-field-line-number", f"{PREP} {{tmp}}/log.csv",
         "log.csv, line 3: 5 ','-separated fields, but the header has 3",
         log_csv("u1,i1,1", "u1,i2,2,9,9", "u1,i3,3")),
    case("prepare-format-disagrees-with-suffix", f"{PREP} {{tmp}}/log.jsonl",
         "log.jsonl: read as csv, but its suffix '.jsonl' names a jsonl file",
         text_file("log.jsonl", '{"uid": "u1", "iid": "i1", "ts": 1}\n')),
    case("prepare-wrong-separator-is-named", f"{PREP} {{tmp}}/log.csv",
         "the header was read as one column: it is separated by ';', not ','",
         text_file("log.csv", "uid;iid;ts\nu1;i1;1\n")),
    case("prepare-jsonl-boolean-id", "data prepare x --format jsonl --path {tmp}/log.jsonl --user-col uid "
         "--item-col iid --out {tmp}/out", "log.jsonl, line 2: id column 'iid' holds true/false",
         text_file("log.jsonl", '{"uid": "u1", "iid": "i1"}\n{"uid": "u1", "iid": true}\n')),
    case("prepare-jsonl-object-after-numbers", "data prepare x --format jsonl --path {tmp}/log.jsonl --user-col uid "
         "--item-col iid --out {tmp}/out", "log.jsonl, line 2: field 'iid' holds an object, but on line 1",
         text_file("log.jsonl", '{"uid": "u1", "iid": 7}\n{"uid": "u1", "iid": {"a": 1}}\n')),
    case("prepare-long-separator-mentions-tab", f"{PREP} {{csv}} --sep ';;'", "or \\t or tab for a tab"),
    case("prepare-long-items-separator-mentions-tab", f"{PREP} {{csv}} --items {{tmp}}/items.dat --items-sep ab",
         "or \\t or tab for a tab", text_file("items.dat", "iid,title\ni1,One\n")),
    case("fetch-unknown-says-how-to-prepare", "data fetch nope",
         "`seqrec data prepare nope --format csv --path FILE --user-col COL --item-col COL`"),
    case("fetch-known-says-source", "data fetch yelp-p5", "`seqrec data prepare yelp-p5 --source DIR`"),
    case("prepare-missing-parquet", "data prepare x --format parquet --path {tmp}/log.parquet --user-col uid "
         "--item-col iid --out {tmp}/out", "log.parquet: no such file"),
    case("prepare-min-user-len-names-the-flag", f"{PREP} {{csv}} --min-user-len 0", "--min-user-len"),
]

TRAIN = "train --dataset syn --out {tmp}/run"
TRAINING = [
    case("train-unknown-key", f"{TRAIN} --set model.dd=3", "model.dd"),
    case("train-wrong-type", f"{TRAIN} --set train.lr=fast", "train.lr"),
    case("train-negative-d", f"{TRAIN} --set model.d=-4", "model.d"),
    case("train-dropout-above-one", f"{TRAIN} --set model.dropout=1.5", "model.dropout"),
    case("train-zero-lr", f"{TRAIN} --set train.lr=0", "train.lr"),
    case("train-negative-seed", f"{TRAIN} --set train.seed=-1", "train.seed must be >= 0"),
    case("train-negative-fraction-seed", f"{TRAIN} --set data.train_fraction=0.5 --set data.train_fraction_seed=-1",
         "data.train_fraction_seed must be >= 0"),
    case("train-heads-do-not-divide-d", f"{TRAIN} --set model.d=10 --set model.n_heads=3", "n_heads"),
    case("train-zero-epochs", f"{TRAIN} --set train.epochs=0", "train.epochs"),
    case("train-item2vec-neg-power", f"{TRAIN} --model item2vec --set model.neg_power=-3", "model.neg_power"),
    case("train-nan-lr", f"{TRAIN} --set train.lr=nan", "train.lr"),
    case("train-zero-max-len", f"{TRAIN} --set data.max_len=0", "data.max_len"),
    case("train-stride-above-max-len", f"{TRAIN} --set data.max_len=8 --set data.stride=9", "data.stride"),
    case("train-k-zero", f"{TRAIN} --set 'eval.ks=[0]'", "eval.ks"),
    case("train-unknown-optimizer", f"{TRAIN} --set train.optimizer=sgd", "'sgd'"),
    case("train-ema-one", f"{TRAIN} --set train.ema=1", "train.ema"),
    case("train-unknown-device", f"{TRAIN} {TINY} --set train.device=tpu9", "'tpu9'"),
    case("train-unknown-section", f"{TRAIN} --set optim.lr=1", "optim"),
    case("train-override-no-equals", f"{TRAIN} --set model.d", "'model.d'"),
    case("train-override-no-section", f"{TRAIN} --set lr=3", "'lr'"),
    case("train-unknown-model", "train --dataset syn --model gpt --out {tmp}/run", "'gpt'"),
    case("train-dataset-without-items", f"train --dataset {{tmp}}/ds --out {{tmp}}/run {TINY}", "items.parquet",
         dataset_copy(lambda d: (d / "items.parquet").unlink())),
    case("train-no-dataset", "train --out {tmp}/run", "no dataset"),
    case("train-unknown-dataset", "train --dataset nope --out {tmp}/run", "'nope'"),
    case("train-unknown-item-feature", f"{TRAIN} {TINY} --set 'features.fields=[{{name=\"genre\", level=\"item\", "
         "kind=\"categorical\"}]'", "'genre'"),
    case("train-bad-feature-kind", f"{TRAIN} --set 'features.fields=[{{name=\"title\", level=\"item\", "
         "kind=\"colour\"}]'", "'colour'"),
    case("train-init-items-from-nowhere", f"{TRAIN} {TINY} --init-items-from {{tmp}}/nowhere", "nowhere"),
    case("train-config-missing", f"{TRAIN} --config {{tmp}}/missing.toml", "missing.toml"),
    case("train-config-malformed", f"{TRAIN} --config {{tmp}}/c.toml", "c.toml",
         text_file("c.toml", "[model]\nd = = 3\n")),
    case("train-config-not-utf8", f"{TRAIN} --config {{tmp}}/c.toml", "c.toml", text_file("c.toml", b"[model]\xff\n")),
    case("train-config-is-a-folder", f"{TRAIN} --config {{tmp}}", "{tmp}"),
    case("train-config-section-not-table", f"{TRAIN} --config {{tmp}}/c.toml", "model",
         text_file("c.toml", "model = 3\n")),
    case("train-config-unknown-key", f"{TRAIN} --config {{tmp}}/c.toml", "train.speed",
         text_file("c.toml", "[train]\nspeed = 3\n")),
    case("train-into-existing-run", f"train --dataset syn --out {{tmp}}/run {TINY}", "holds a run (finished)",
         run_copy()),
    case("train-overwrite-fails", f"train --dataset syn --out {{tmp}}/run --overwrite {TINY} --set 'features.fields=[{{"
         "name=\"genre\", level=\"item\", kind=\"categorical\"}]'", "'genre'", run_copy()),
    case("resume-not-a-run", "train --resume {tmp}", "not a run folder"),
    case("resume-with-flags", "train --resume {sasrec} --set train.epochs=2", "--set"),
    case("resume-finished", "train --resume {sasrec}", "has finished"),
    case("evaluate-not-a-run", "evaluate {tmp}", "not a run folder"),
    case("evaluate-other-fingerprint", "evaluate {sasrec} --dataset other", "fingerprint"),
    case("evaluate-unknown-dataset", "evaluate {sasrec} --dataset nope", "'nope'"),
    case("evaluate-corrupt-config", "evaluate {tmp}/run", "config.json",
         run_copy(lambda c: (c.parent / "config.json").write_text("{"))),
    case("evaluate-truncated-weights", "evaluate {tmp}/run", "model.safetensors", run_copy(truncate)),
]

REC = "recommend {sasrec}"
RECOMMEND = [
    case("recommend-unknown-item", f"{REC} --history 'i1 zzz'", "'zzz'"),
    case("recommend-empty-history", f"{REC} --history ''", "history is empty"),
    case("recommend-k-zero", f"{REC} --history i1 -k 0", "k=0"),
    case("recommend-k-above-catalogue", f"{REC} --history i1 -k 31", "k=31"),
    case("recommend-unknown-user", f"{REC} --user nobody", "'nobody'"),
    case("recommend-history-and-user", f"{REC} --user u0 --history i1", "exactly one"),
    case("recommend-no-history", REC, "exactly one"),
    case("recommend-empty-candidates", f"{REC} --history i1 --candidates ''", "the candidates are empty"),
    case("recommend-new-item-id-model", f"{REC} --history i1 --new-item 'n1=red glue'", "sasrec"),
    case("recommend-new-item-no-equals", "recommend {unisrec} --history i1 --new-item n1", "'n1'"),
    case("recommend-new-item-no-text", "recommend {unisrec} --history i1 --new-item n1=", "'n1='"),
    case("recommend-new-item-known", "recommend {unisrec} --history i1 --new-item i2=glue",
         "already in the run's catalogue"),
    case("recommend-new-item-twice", "recommend {unisrec} --history i1 --new-item n1=a --new-item n1=b",
         "given more than once"),
    case("recommend-n-probe-without-ivf", f"{REC} --history i1 --n-probe 4", "--n-probe"),
    case("recommend-n-probe-zero", f"{REC} --history i1 --index ivf --n-probe 0", "--n-probe"),
    case("recommend-unknown-candidate", f"{REC} --history i1 --candidates 'i2 zzz'", "'zzz'"),
    case("recommend-times-not-numbers", f"{REC} --history 'i1 i2' --times '1 soon'", "'soon'"),
    case("recommend-times-count", f"{REC} --history 'i1 i2' --times 1", "times"),
    case("recommend-event-the-model-does-not-take", f"{REC} --history 'i1 i2' --event rating=5,4",
         "unknown event feature(s) ['rating']; this model takes none"),
    case("recommend-event-no-name", f"{REC} --history 'i1 i2' --event =5,4", "NAME=V1,V2"),
    case("recommend-times-the-model-does-not-read", f"{REC} --history 'i1 i2' --times '1 2'",
         "--times: this model reads no time features"),
    case("recommend-users-without-out", f"{REC} --users all", "give --out PATH"),
    case("recommend-users-unknown-output-type", f"{REC} --users all --out {{tmp}}/r.xlsx", "'.xlsx'"),
    case("recommend-users-none-known", f"{REC} --users {{tmp}}/u.txt --out {{tmp}}/r.csv", "none of the 1 user id",
         text_file("u.txt", "nobody\n")),
    case("recommend-log-without-columns", f"{REC} --log {{csv}} --out {{tmp}}/r.csv", "--log needs --user-col"),
    case("recommend-log-empty", f"{REC} --log {{tmp}}/log.csv --user-col uid --item-col iid --out {{tmp}}/r.csv",
         "no events in it", log_csv()),
    case("recommend-event-not-numbers", f"{REC} --history 'i1 i2' --event 'rating=5,high'", "'high'"),
    case("recommend-event-twice", f"{REC} --history 'i1 i2' --event rating=5,4 --event rating=1,2", "twice"),
    case("recommend-event-with-user", f"{REC} --user u0 --event rating=5", "go with --history"),
    case("recommend-not-a-run", "recommend {tmp} --history i1", "no checkpoint"),
    case("recommend-truncated-weights", "recommend {tmp}/run --history i1", "model.safetensors", run_copy(truncate)),
    case("recommend-flipped-byte", "recommend {tmp}/run --history i1", "model.safetensors", run_copy(flip_byte)),
    case("recommend-no-items-parquet", "recommend {tmp}/run --history i1", "items.parquet",
         run_copy(lambda c: (c / "items.parquet").unlink())),
    case("recommend-malformed-model-json", "recommend {tmp}/run --history i1", "model.json",
         run_copy(lambda c: (c / "model.json").write_text('{"model": "sasrec",'))),
    case("recommend-user-corrupt-config", "recommend {tmp}/run --user u0", "config.json",
         run_copy(lambda c: (c.parent / "config.json").write_text("[]"))),
]

SERVE = [
    case("export-not-a-run", "export {tmp}/nowhere --out {tmp}/out", "nowhere: no such run folder"),
    case("export-truncated-weights", "export {tmp}/run --out {tmp}/out", "model.safetensors", run_copy(truncate)),
    case("export-onto-other-files", "export {sasrec} --out {tmp}/mine", "holds other files",
         lambda tmp, w: (tmp / "mine").mkdir() or (tmp / "mine" / "notes.txt").write_text("keep me")),
    case("serve-not-a-run", "serve {tmp}/nowhere", "nowhere"),
    case("serve-public-host", "serve {sasrec} --host 0.0.0.0", "0.0.0.0"),
    case("serve-port-zero", "serve {sasrec} --port 0", "--port"),
    case("serve-port-too-high", "serve {sasrec} --port 70000", "--port"),
    case("serve-no-workers", "serve {sasrec} --workers 0", "--workers"),
    case("serve-negative-threads", "serve {sasrec} --threads -1", "--threads"),
    case("serve-no-sessions", "serve {sasrec} --max-sessions 0", "--max-sessions"),
    case("serve-zero-ttl", "serve {sasrec} --session-ttl 0", "--session-ttl"),
    case("serve-infinite-ttl", "serve {sasrec} --session-ttl inf", "--session-ttl"),
    case("serve-no-body", "serve {sasrec} --max-body-bytes 0", "--max-body-bytes"),
    case("serve-no-queue", "serve {sasrec} --max-queue 0", "--max-queue"),
    case("serve-truncated-weights", "serve {tmp}/run --port 8765", "model.safetensors", run_copy(truncate)),
    case("serve-log-folder-missing", "serve {sasrec} --catalogue-log {tmp}/nowhere/log.jsonl", "nowhere"),
    case("serve-log-not-json", "serve {sasrec} --port 8765 --catalogue-log {tmp}/log.jsonl", "log.jsonl:1",
         text_file("log.jsonl", 'not json\n{"op": "remove", "ids": ["i1"]}\n')),
    case("serve-log-unknown-op", "serve {sasrec} --port 8765 --catalogue-log {tmp}/log.jsonl", "log.jsonl:2",
         text_file("log.jsonl", '{"op": "remove", "ids": []}\n{"op": "rename"}\n\n')),
    case("serve-log-unknown-item", "serve {sasrec} --port 8765 --catalogue-log {tmp}/log.jsonl", "'nope'",
         text_file("log.jsonl", '{"op": "remove", "ids": ["nope"]}\n')),
    case("serve-log-text-for-id-model", "serve {sasrec} --port 8765 --catalogue-log {tmp}/log.jsonl", "no item text",
         text_file("log.jsonl", '{"op": "items", "items": {"x": "a new item"}}\n')),
    case("serve-store-folder-missing", "serve {sasrec} --session-store {tmp}/nowhere/s.sqlite", "nowhere"),
    case("serve-store-not-sqlite", "serve {sasrec} --workers 2 --port 8765 --session-store {tmp}/s.sqlite",
         "s.sqlite", text_file("s.sqlite", "not a database, a text file of some length " * 40)),
    case("serve-ready-timeout-one-worker", "serve {sasrec} --ready-timeout 30", "--ready-timeout is for --workers"),
    case("serve-ready-timeout-zero", "serve {sasrec} --workers 2 --ready-timeout 0", "--ready-timeout"),
    case("compact-log-missing", "compact-log {tmp}/nowhere.jsonl", "no such catalogue log"),
    case("compact-log-folder", "compact-log {tmp}", "not a regular file"),
    case("compact-log-no-first-line", "compact-log {tmp}/log.jsonl", "no catalogue line at its start",
         text_file("log.jsonl", '{"op": "remove", "ids": ["i1"]}\n')),
    case("compact-log-bad-line", "compact-log {tmp}/log.jsonl", "log.jsonl:2: not a catalogue change",
         text_file("log.jsonl", '{"op": "remove", "ids": ["i1"]}\n{"op": "rename"}\n')),
    case("carry-log-missing", "carry-log {tmp}/nowhere.jsonl --to {unisrec}", "no such catalogue log"),
    case("carry-log-no-run", "carry-log {tmp}/log.jsonl --to {tmp}/nowhere", "no such run folder",
         text_file("log.jsonl", OTHER_HEAD)),
    case("carry-log-texts-to-id-model", "carry-log {tmp}/log.jsonl --to {sasrec}", "cannot be carried",
         text_file("log.jsonl", OTHER_HEAD + '{"op": "items", "items": {"x": "a new item"}}\n')),
    case("carry-log-out-exists", "carry-log {tmp}/log.jsonl --to {unisrec} --out {tmp}/log.jsonl", "exists",
         text_file("log.jsonl", OTHER_HEAD)),
]

ENC = "text encode syn --encoder {enc} --no-progress"
PRE = f"pretrain --out {{tmp}}/pre {UNISREC} --set model.text_encoder={{enc}} --set pretrain.progress=false"
FT = "finetune syn --from {unisrec} --out {tmp}/ft --set train.progress=false"
TEXT = [
    case("text-unknown-dataset", "text encode nope", "'nope'"),
    case("text-no-text", "text encode other --encoder {enc} --no-progress", "no text"),
    case("text-encoder-missing", "text encode syn --encoder {tmp}/no-encoder --no-progress", "no-encoder"),
    case("text-encoder-empty-folder", "text encode syn --encoder {tmp}/enc --no-progress", "enc",
         text_file("enc/readme", "")),
    case("text-template-unknown-field", f"{ENC} --template '{{brand}}'", "brand"),
    case("text-template-unclosed", f"{ENC} --template '{{title'", "{title"),
    case("text-max-length-zero", f"{ENC} --max-length 0", "max_length"),
    case("text-word-drop-one", f"{ENC} --word-drop 1", "word_drop"),
    case("text-batch-size-zero", f"{ENC} --batch-size 0", "batch"),
    case("pretrain-unknown-dataset", f"{PRE} --datasets syn,nope", "'nope'"),
    case("pretrain-no-dataset", f"{PRE} --datasets ,", "no datasets"),
    case("pretrain-no-datasets-anywhere", f"{PRE} --negatives moco", "no datasets"),
    case("pretrain-dataset-without-text", f"{PRE} --datasets other", "pre-training domain other: "),
    case("pretrain-unknown-section", f"{PRE} --datasets syn --set train.lr=1", "'train.lr=1'"),
    case("pretrain-unknown-key", f"{PRE} --datasets syn --set pretrain.speed=1", "pretrain.speed"),
    case("pretrain-batch-of-one", f"{PRE} --datasets syn --set pretrain.batch_size=1", "batch_size"),
    case("pretrain-negative-d", f"{PRE} --datasets syn --set model.d=-4", "model.d"),
    case("pretrain-encoder-missing", f"{PRE} --datasets syn --set model.text_encoder={{tmp}}/no-encoder",
         "no-encoder"),
    case("pretrain-no-word-drop", f"{PRE} --datasets syn --set model.text_word_drop=0", "text_word_drop"),
    case("pretrain-recipe-missing", f"{PRE} --config {{tmp}}/recipe.toml", "recipe.toml"),
    case("pretrain-recipe-wrong-section", f"{PRE} --config {{tmp}}/recipe.toml", "train",
         text_file("recipe.toml", "[train]\nlr = 1\n")),
    case("pretrain-recipe-no-datasets", f"{PRE} --config {{tmp}}/recipe.toml", "no datasets",
         text_file("recipe.toml", "[pretrain]\nepochs = 1\n")),
    case("finetune-text-dim-differs", f"{FT} --set model.text_dim=999", "text"),
    case("finetune-zero-shot-other-encoder", f"{FT} --setting zero-shot --set model.text_encoder={{tmp}}/no-encoder",
         "no-encoder"),
    case("finetune-zero-shot-adaptor-only", f"{FT} --setting zero-shot --transfer adaptor", "--transfer"),
    case("tune-zero-budget", "tune --dataset syn --budget 0 --out {tmp}/t", "--budget"),
    case("tune-nan-budget", "tune --dataset syn --budget nan --out {tmp}/t", "got --budget nan"),
    case("tune-endless-budget", "tune --dataset syn --budget inf --out {tmp}/t", "--budget inf needs --trials"),
    case("tune-onto-a-training-run", "tune --dataset syn --trials 1 --out {sasrec}", "a folder that is not a study"),
    case("train-out-under-a-file", "train --dataset syn --out {tmp}/afile/run --set train.progress=false",
         "afile", text_file("afile", "x")),
    case("prepare-out-under-a-file", f"data prepare x {CSV} --path {{csv}} --out {{tmp}}/afile/out",
         "afile", text_file("afile", "x")),
    case("prepare-no-name", "data prepare --out {tmp}/out", "give a dataset name"),
    case("export-opset-too-old", "export {sasrec} --out {tmp}/e --opset 3", "--opset 3: the exporter writes opset 18"),
    case("tune-negative-seed", "tune --dataset syn --seed -1 --out {tmp}/t", "--seed >= 0"),
    case("tune-no-space", "tune --dataset syn --model item2vec --trials 1 --out {tmp}/t", "no search space"),
    case("tune-unknown-dataset", "tune --dataset nope --out {tmp}/t", "'nope'"),
    case("finetune-from-nowhere", "finetune syn --from {tmp}/nowhere --out {tmp}/ft", "nowhere"),
    case("finetune-from-id-model", "finetune syn --from {sasrec} --out {tmp}/ft", "'sasrec'"),
    case("finetune-unknown-dataset", "finetune nope --from {unisrec} --out {tmp}/ft", "'nope'"),
    case("finetune-config-missing", f"{FT} --config {{tmp}}/missing.toml", "missing.toml"),
    case("finetune-item-ids-contradict", f"{FT} --set model.item_ids=true", "item_ids"),
    case("finetune-max-len-differs", f"{FT} --set data.max_len=12", "max_len=8"),
    case("finetune-zero-lr", f"{FT} --set data.max_len=8 --set train.lr=0", "train.lr"),
    case("finetune-unknown-section", f"{FT} --set pretrain.lr=1", "'pretrain.lr=1'"),
    case("finetune-architecture-differs", f"{FT} --set data.max_len=8 --set model.d=32",
         "model.d=32 does not fit the pre-trained model"),
    case("finetune-malformed-model-json", "finetune syn --from {tmp}/run --out {tmp}/ft", "model.json",
         run_copy(lambda c: (c / "model.json").write_text("{"), run="unisrec")),
    case("finetune-truncated-weights", "finetune syn --from {tmp}/run --out {tmp}/ft --set data.max_len=8",
         "model.safetensors", run_copy(truncate, run="unisrec")),
]


# A service loads its run (the engine it picks, an export) before it replays a catalogue log against it:
# those lines come before the error of a log that does not fit. Every other bad input is refused before
# anything is logged, so a real process prints the error line alone.
LOADS_FIRST = ("serve ",)


@pytest.mark.parametrize(("argv", "needle", "prep"), DATA + TRAINING + RECOMMEND + SERVE + TEXT)
def test_bad_input_is_one_line_and_writes_nothing(argv: str, needle: str, prep: Prep | None, world: Paths,
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("SEQREC_HOME", str(world["home"]))
    monkeypatch.chdir(tmp_path)
    if prep is not None:
        prep(tmp_path, world)
    paths = {**world, "tmp": tmp_path}
    before = (snapshot(world["root"]), snapshot(tmp_path))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="seqrec"):
        code = main(fill(argv, paths))  # an exception here is the traceback a user would have seen
    said = [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records if r.name.startswith("seqrec")]
    if not argv.startswith(LOADS_FIRST):  # what a real process would print on stderr before its error line
        assert not said, said
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("seqrec: error: "), (code, err)
    assert subst(needle, paths) in lines[0], lines[0]
    assert (snapshot(world["root"]), snapshot(tmp_path)) == before, "a failed command left files behind"


@pytest.mark.parametrize(("argv", "needle"), [
    ("data prepare x --format xlsx --path {csv}", "'xlsx'"),
    ("train --dataset syn --out {tmp}/run --set model.d=-4", "model.d"),
    ("serve {sasrec} --host 0.0.0.0", "0.0.0.0"),
])
def test_a_real_process_prints_one_line(argv: str, needle: str, world: Paths, tmp_path: Path) -> None:
    """The same contract through `python -m seqrec.cli`, where logging goes to the console."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SEQREC_HOME": str(world["home"])}
    proc = subprocess.run([sys.executable, "-m", "seqrec.cli", *fill(argv, {**world, "tmp": tmp_path})],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("seqrec: error: ") and needle in lines[0], proc.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(("argv", "needle"), [
    ("data prepare x --split random", "'random'"),
    ("data prepare x --kcore three", "'three'"),
    ("data prepare x --dedupe last", "'last'"),
    ("data features syn --encoding onehot", "'onehot'"),
    ("train --dataset syn --epochs 3", "--epochs"),
    ("recommend run --history i1 -k many", "'many'"),
    ("recommend run --history i1 --index annoy", "'annoy'"),
    ("serve run --port http", "'http'"),
    ("export run --format tflite", "'tflite'"),
    ("text encode syn --pooling max", "'max'"),
    ("finetune syn --from run --setting semi", "'semi'"),
    ("pretrain --negatives moco --datasets", "--datasets"),
    ("tune --model sasrec", "--dataset"),
])
def test_usage_errors_are_argparse_errors(argv: str, needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A flag that argparse itself refuses (unknown, not a number, not a choice, missing): exit status 2,
    the usage, then one `error:` line naming the value. (Not the one-line contract above: argparse's own
    form, which shows the user the command's flags.)"""
    with pytest.raises(SystemExit) as exit_:
        main(shlex.split(argv))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err and err.startswith("usage: seqrec")
    last = err.strip().splitlines()[-1]
    assert ": error: " in last and needle in last, err
