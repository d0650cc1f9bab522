from pathlib import Path

import pytest

from seqrec.config import load_toml, parse_override, resolve
from seqrec.errors import SeqrecError


def test_overrides_are_typed() -> None:
    assert parse_override("model.d=128") == (["model", "d"], 128)
    assert parse_override("train.lr=1e-3") == (["train", "lr"], 0.001)
    assert parse_override("eval.ks=[5, 20]") == (["eval", "ks"], [5, 20])
    assert parse_override("train.device=cuda:1") == (["train", "device"], "cuda:1")
    cfg = resolve({"model": {"d": 32}}, ["model.d=128", "train.lr=1", "eval.ks=[50, 10, 10]"])
    assert cfg.model.d == 128 and cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    assert cfg.eval.ks == [10, 50]


@pytest.mark.parametrize(
    ("raw", "overrides", "message"),
    [
        ({}, ["model.dd=3"], "model.dd"),
        ({"trian": {}}, [], "trian"),
        ({}, ["train.epochs=1.5"], "train.epochs"),
        ({}, ["train.bf16=1"], "train.bf16"),
        ({}, ["model.loss=hinge"], "model.loss"),
        ({}, ["model.n_heads=3"], "divisible"),
        ({}, ["nokey"], "section.key=value"),
        ({"model": {"name": "gpt"}}, [], "unknown model"),
    ],
)
def test_bad_config_names_the_key(raw: dict, overrides: list[str], message: str) -> None:
    with pytest.raises(SeqrecError, match=message):
        resolve(raw, overrides)


def test_toml_file_errors(tmp_path: Path) -> None:
    with pytest.raises(SeqrecError, match="not found"):
        load_toml(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(SeqrecError, match=r"bad\.toml"):
        load_toml(bad)


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[1] / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_config_resolves(path: Path) -> None:
    """The configs the README points to have no stale or misspelt key (unknown keys are errors)."""
    raw = load_toml(path)
    if "pretrain" in raw:  # a pre-training recipe: [pretrain] and [model]
        from seqrec.config import build
        from seqrec.models.unisrec import UniSRecConfig
        from seqrec.train.pretrain import PretrainConfig

        assert set(raw) == {"pretrain", "model"}
        assert build(PretrainConfig, raw["pretrain"], "pretrain").datasets
        assert build(UniSRecConfig, raw["model"], "model").name == "unisrec"
        return
    cfg = resolve(raw, [])
    assert cfg.model.name in path.stem


@pytest.mark.parametrize(("override", "message"), [
    ("model.d=-4", "model.d must be >= 1, got -4"),
    ("model.d_ff=0", "model.d_ff must be >= 1"),
    ("model.n_layers=0", "model.n_layers must be >= 1"),
    ("model.dropout=1.5", "model.dropout must be in [0, 1)"),
    ("model.attn_dropout=-0.1", "model.attn_dropout must be in [0, 1)"),
    ("model.init_std=0", "model.init_std must be > 0"),
    ("model.gbce_t=2", "model.gbce_t must be in [0, 1]"),
    ("train.lr=-1", "train.lr must be > 0"),
    ("train.weight_decay=-0.1", "train.weight_decay must be >= 0"),
    ("train.lr=nan", "train.lr must be a finite number"),
    ("data.max_len=0", "data.max_len must be >= 1"),
    ("eval.budget=0", "eval.budget must be >= 1"),
])
def test_numeric_settings_out_of_range_are_one_line_errors(override: str, message: str) -> None:
    with pytest.raises(SeqrecError) as err:
        resolve({"model": {"name": "sasrec"}}, [override])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_model_training_defaults_apply_by_group() -> None:
    """A model's TRAIN_DEFAULTS sit beneath the given [train] table, a group only when none of its keys is given
    another value."""
    sasrec = resolve({}, ['model.name="sasrec"']).train
    assert (sasrec.optimizer, sasrec.weight_decay, sasrec.ema, sasrec.refit) == ("adamw", 0.1, 0.997, True)
    plain = resolve({}, ['model.name="sasrec"', 'train.optimizer="adam"', "train.refit=false"]).train
    assert (plain.optimizer, plain.weight_decay, plain.ema, plain.refit) == ("adam", 0.0, 0.997, False)
    decay = resolve({"train": {"weight_decay": 0.01}}, ['model.name="sasrec"']).train
    assert (decay.optimizer, decay.weight_decay) == ("adam", 0.01)  # the group is the pair: no AdamW added
    own = resolve({}, ['model.name="sasrec"', 'train.optimizer="adamw"']).train  # the group's own value, set
    assert (own.optimizer, own.weight_decay) == ("adamw", 0.1)
    for name in ("gru4rec", "bert4rec", "unisrec"):
        train = resolve({}, [f'model.name="{name}"']).train
        assert (train.optimizer, train.weight_decay, train.ema, train.refit) == ("adam", 0.0, 0.0, True), name
    item2vec = resolve({}, ['model.name="item2vec"']).train
    assert (item2vec.optimizer, item2vec.ema, item2vec.refit) == ("adam", 0.0, False)
