"""Side features: encoders, fitting on training data only, the feature block in every sequence model,
and the same features (and output bias) in training, evaluation and recommendation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import torch.nn.functional as F

from seqrec.config import EvalConfig, build, resolve
from seqrec.data.batching import TrainBatches, eval_batches
from seqrec.data.dataset import PreparedDataset
from seqrec.data.features import (
    UNKNOWN,
    FeatureInputs,
    FeaturesConfig,
    FeatureSpec,
    dataset_event_values,
    feature_inputs,
    fit_features,
    infer_features,
)
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.data.types import Interactions, ItemTable, RawDataset
from seqrec.errors import SeqrecError
from seqrec.eval.evaluate import evaluate_ranks
from seqrec.nn.features import ContinuousInput, FeatureBlock, SoftOneHot
from seqrec.registry import build_model, model_config_class
from seqrec.serve import Recommender
from seqrec.train.checkpoint import load_checkpoint, save_checkpoint

TINY = {
    "sasrec": {"d": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "dropout": 0.0, "attn_dropout": 0.0},
    "bert4rec": {"d": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "dropout": 0.0, "attn_dropout": 0.0},
    "gru4rec": {"d": 16, "dropout": 0.0},
    "unisrec": {"d": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "dropout": 0.0, "attn_dropout": 0.0,
                "text_dim": 8, "n_experts": 2, "item_ids": True},
}
SPECS = [
    FeatureSpec("gap", "event", "continuous", transform="log1p"),
    FeatureSpec("hour", "event", "categorical"),
    FeatureSpec("rating", "event", "continuous", "bucket", size=4),
    FeatureSpec("year", "item", "continuous", "linear"),
    FeatureSpec("genre", "item", "multi_categorical"),
]


def featured_log(n_users: int = 40, n_items: int = 20, year: float | None = None,
                 test_rating: float | None = None, test_item_genre: str | None = None) -> RawDataset:
    """Users walk the catalogue (+1 mod n); events carry ratings and times, items a year and genres.

    Item "i{n_items}" (an extra item) occurs only as the last (test) event of user 0."""
    rng = np.random.default_rng(0)
    users, items, times, ratings = [], [], [], []
    for u in range(n_users):
        start, length = rng.integers(n_items), rng.integers(5, 10)
        for t in range(length):
            users.append(f"u{u}")
            items.append(f"i{(start + t) % n_items}")
            times.append(float(86400 * u + 600 * t * (1 + u % 3)))
            ratings.append(float(1 + (start + t) % 5))
        if u == 0:
            users.append("u0")
            items.append(f"i{n_items}")
            times.append(times[-1] + 60.0)
            ratings.append(5.0 if test_rating is None else test_rating)
    frame = pl.DataFrame({"user": users, "item": items, "timestamp": times, "rating": ratings})
    n = n_items + 1
    genres = [", ".join(["g_even" if i % 2 == 0 else "g_odd", f"g{i % 3}"]) for i in range(n)]
    genres[-1] = test_item_genre or "g_test_only"
    table = pl.DataFrame({"item": [f"i{i}" for i in range(n)], "title": [f"Item {i}" for i in range(n)],
                          "year": [float(1990 + i) if year is None else year for i in range(n)], "genre": genres})
    return RawDataset(Interactions(frame, "feat"), ItemTable(table, "feat"), "feat")


def prepared(tmp_path: Path, name: str = "d", **kwargs: object) -> PreparedDataset:
    return prepare(featured_log(**kwargs), PrepareOptions(), tmp_path / name)  # type: ignore[arg-type]


def model_with(name: str, data: PreparedDataset, specs: list[FeatureSpec] | None = None, fusion: str = "sum",
               **extra: object):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    cfg = build(model_config_class(name), {"name": name, **TINY[name], **extra}, "model")
    inputs = feature_inputs(FeaturesConfig(fields=specs or [], fusion=fusion), data)  # type: ignore[arg-type]
    return build_model(cfg, data.n_items, 8, inputs)


# ---------------------------------------------------------------------------------------------- encoders


def test_soft_one_hot_is_a_convex_combination_of_its_embeddings() -> None:
    torch.manual_seed(0)
    enc = SoftOneHot(d=4, size=5)
    n = torch.tensor([[-2.0, 0.0, 0.5], [1.0, 3.0, -0.1]])
    w = enc.weights(n)  # (2, 3, 5)
    assert torch.allclose(w.sum(-1), torch.ones(2, 3))
    assert (w > 0).all()
    logits = n[..., None] * enc.proj.weight[:, 0] + enc.proj.bias  # p = nW + b, by hand
    expected = torch.softmax(logits, -1) @ enc.table
    assert torch.allclose(enc(n), expected, atol=1e-6)
    assert not torch.allclose(enc(n)[0, 0], enc(n)[0, 1])  # different values, different vectors


def test_onnx_forms_of_bucketize_and_vocabulary_lookup_equal_the_torch_ones(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """ONNX has neither bucketize nor searchsorted: the encoders compare with every edge or key instead
    (always for buckets, while exporting for categorical codes), with the same results."""
    import seqrec.nn.features as nnf

    data = prepared(tmp_path)
    rating, = fit_features([FeatureSpec("rating", "event", "continuous", "bucket", size=4)], data)
    enc = nnf.ContinuousInput(rating, 4)
    x = torch.cat([enc.edges, torch.tensor([-3.0, 0.5, 2.5, 9.0, float("nan")])]).reshape(1, -1)
    table = enc.encoder.weight  # what bucketize would pick, NaN (missing) aside
    want = torch.where(torch.isnan(x).unsqueeze(-1), enc.missing,
                       table[torch.bucketize(torch.nan_to_num(x), enc.edges)])
    assert len(enc.edges) >= 2 and torch.equal(enc(x), want)
    fitted = fit_features([FeatureSpec("hour", "event", "categorical")], data)
    enc = nnf.CategoricalInput(fitted[0], 4)
    x = torch.tensor([[0.0, 1.0, 5.0, 23.0, float("nan"), -3.0, 12.5, 6.0]], dtype=torch.float32)
    searched = enc.codes(x)
    monkeypatch.setattr(nnf, "_exporting", lambda: True)
    assert torch.equal(enc.codes(x), searched)
    assert searched[0, 4:6, 0].tolist() == [UNKNOWN, UNKNOWN] and (searched > UNKNOWN).any()


def test_values_far_outside_training_stay_finite(tmp_path: Path) -> None:
    """A finite value far beyond the training range (1e25 in a request) is clipped once standardised, so
    the layers after the features (a LayerNorm here) stay finite; values in range are untouched."""
    data = prepared(tmp_path)
    for encoding in ("soft_one_hot", "linear"):
        fitted = fit_features([FeatureSpec("rating", "event", "continuous", encoding)], data)[0]
        enc = ContinuousInput(fitted, 4)
        x = torch.tensor([[1e25, 3e38, -3e38, 3.0]])
        assert torch.isfinite(F.layer_norm(enc(x), (4,))).all(), encoding
        assert torch.equal(enc.normalise(x)[0, 3], (3.0 - enc.mean) / enc.std)


def test_gradient_reaches_w_b_and_e() -> None:
    torch.manual_seed(0)
    enc = SoftOneHot(d=4, size=5)
    (enc(torch.tensor([-1.0, 0.3, 2.0])) * torch.randn(3, 4)).sum().backward()
    for p in (enc.proj.weight, enc.proj.bias, enc.table):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_missing_values_take_the_learned_missing_vector(tmp_path: Path) -> None:
    data = prepared(tmp_path)
    (gap,) = fit_features([SPECS[0]], data)
    enc = ContinuousInput(gap, d=4)
    with torch.no_grad():
        enc.missing.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    out = enc(torch.tensor([np.nan, 60.0]))
    assert torch.equal(out[0], enc.missing)
    assert not torch.equal(out[1], enc.missing)


# ---------------------------------------------------------------------------------------------- fitting


def test_statistics_come_from_training_events_only(tmp_path: Path) -> None:
    a = fit_features(SPECS, prepared(tmp_path, "a"))
    b = fit_features(SPECS, prepared(tmp_path, "b", test_rating=1.0))  # only the test event's rating differs
    c = fit_features(SPECS, prepared(tmp_path, "c", test_item_genre="g_other"))  # a test-only item's genre
    for x, y, z in zip(a, b, c, strict=True):
        assert x.to_json() == y.to_json() == z.to_json()
    rating = a[2]
    assert 1.0 <= rating.mean <= 5.0 and rating.edges  # fitted, not defaults


def test_stats_exclude_validation_and_test_events(tmp_path: Path) -> None:
    data = prepared(tmp_path)
    (rating,) = fit_features([SPECS[2]], data)
    values = dataset_event_values(data, ["rating"])["rating"]
    lengths = data.lengths
    position = np.arange(len(values)) - np.repeat(data.offsets[:-1], lengths)
    train = position < np.repeat(lengths - 2, lengths)  # leave-one-out: the last two are held out
    assert rating.mean == pytest.approx(values[train].mean())
    assert rating.mean != pytest.approx(values.mean())


def test_unseen_categorical_value_uses_the_reserved_index(tmp_path: Path) -> None:
    data = prepared(tmp_path)
    inputs = feature_inputs(FeaturesConfig(fields=[SPECS[4]]), data)
    assert inputs is not None and inputs.tables is not None
    (genre,) = inputs.fields
    assert "g_test_only" not in genre.vocab and "g_even" in genre.vocab
    test_only = int(data.item_table.filter(pl.col("item") == "i20")["idx"][0])
    assert inputs.tables["genre"][test_only].tolist()[0] == UNKNOWN
    assert inputs.tables["genre"][0].tolist() == [0, 0]  # padding row
    assert inputs.tables["genre"][-1].tolist()[0] == UNKNOWN  # the row past the catalogue (BERT4Rec's mask)


def test_constant_feature_changes_nothing_after_normalisation(tmp_path: Path) -> None:
    spec = [FeatureSpec("year", "item", "continuous", "soft_one_hot")]
    d1, d2 = prepared(tmp_path, "y1", year=1990.0), prepared(tmp_path, "y2", year=2005.0)
    batch = next(iter(eval_batches(d1, "test", 8, 16)))
    m1, m2 = model_with("sasrec", d1, spec).eval(), model_with("sasrec", d2, spec).eval()
    assert torch.equal(m1.encode(batch), m2.encode(batch))
    # linear encoding: a normalised constant is 0, so the model equals the one without the feature
    linear = model_with("sasrec", d1, [FeatureSpec("year", "item", "continuous", "linear")]).eval()
    plain = model_with("sasrec", d1).eval()
    assert torch.allclose(linear.encode(batch), plain.encode(batch), atol=1e-6)


def test_infer_reads_the_log_and_the_item_table(tmp_path: Path) -> None:
    got = {(s.name, s.level, s.kind) for s in infer_features(prepared(tmp_path))}
    assert got == {("gap", "event", "continuous"), ("hour", "event", "categorical"),
                   ("rating", "event", "continuous"), ("year", "item", "continuous"),
                   ("genre", "item", "multi_categorical")}


def test_config_section_is_typed() -> None:
    cfg = resolve({}, ['features.fields=[{name="gap", level="event", kind="continuous"}]', 'features.fusion="concat"'])
    assert cfg.features.fields[0].encoding == "soft_one_hot" and cfg.features.fusion == "concat"
    with pytest.raises(SeqrecError, match="unknown config key"):
        resolve({}, ['features.fields=[{name="gap", level="event", kind="continuous", bins=3}]'])
    with pytest.raises(SeqrecError, match="categorical ones take embedding"):
        resolve({}, ['features.fields=[{name="g", level="item", kind="categorical", encoding="linear"}]'])
    with pytest.raises(SeqrecError, match="takes no side features"):
        build_model(build(model_config_class("item2vec"), {"name": "item2vec"}, "model"), 5, 8, FeatureInputs([]))


# ---------------------------------------------------------------------------------------------- models


@pytest.mark.parametrize(("name", "fusion"), [("sasrec", "sum"), ("sasrec", "concat"), ("gru4rec", "sum"),
                                              ("bert4rec", "concat"), ("unisrec", "sum")])
def test_every_sequence_model_trains_and_round_trips_with_features(name: str, fusion: str, tmp_path: Path) -> None:
    data = prepared(tmp_path)
    model = model_with(name, data, SPECS, fusion)
    events = dataset_event_values(data, model.event_feature_names())
    assert set(events) == {"gap", "hour", "rating"}
    batches = TrainBatches(data, 8, 16, seed=0, events=events)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for batch in batches:
        loss = model.loss(batch)
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
    block = model.feature_block
    assert block is not None
    assert all(p.grad is not None for p in block.parameters() if p.requires_grad)
    save_checkpoint(model, tmp_path / "ckpt", max_len=8, item_table=data.item_table)
    loaded, meta = load_checkpoint(tmp_path / "ckpt")
    assert meta["features"]["fields"][0]["spec"]["name"] == "gap"
    assert loaded.feature_block is not None
    model.eval()
    batch = next(iter(eval_batches(data, "test", 8, 64, events)))
    assert torch.allclose(model.score(batch), loaded.score(batch), atol=1e-5)


def test_features_change_the_prediction(tmp_path: Path) -> None:
    data = prepared(tmp_path)
    model = model_with("sasrec", data, SPECS).eval()
    events = dataset_event_values(data, model.event_feature_names())
    batch = next(iter(eval_batches(data, "test", 8, 64, events)))
    shifted = {k: v + 3600.0 if k == "gap" else v for k, v in (batch.events or {}).items()}
    assert not torch.allclose(model.encode(batch), model.encode(type(batch)(batch.items, events=shifted)))
    with pytest.raises(SeqrecError, match="lacks event feature"):
        model.encode(type(batch)(batch.items))


def test_recommender_derives_the_same_event_features_as_evaluation(tmp_path: Path) -> None:
    data = prepared(tmp_path)
    model = model_with("sasrec", data, SPECS).eval()
    save_checkpoint(model, tmp_path / "ckpt", max_len=8, item_table=data.item_table)
    rec = Recommender.from_run(tmp_path / "ckpt")
    events = dataset_event_values(data, model.event_feature_names())
    batch = next(iter(eval_batches(data, "test", 8, 1, events)))  # user 0's test history
    u = int(batch.users[0])  # type: ignore[index]
    lo, hi = int(data.offsets[u]), int(data.offsets[u]) + int(data.split[u, 1])
    raw = data.item_table.sort("idx")["item"].to_list()
    history = [raw[i - 1] for i in data.items[lo:hi]]
    ratings = pl.read_parquet(data.path / "events.parquet")["rating"].to_numpy()[lo:hi]
    assert data.times is not None
    top = rec.recommend(history, k=5, times=data.times[lo:hi].tolist(), events={"rating": ratings.tolist()})
    expected = torch.topk(model.score(batch)[0, 1:], 5)
    assert [r.item for r in top] == [raw[i] for i in expected.indices.tolist()]
    assert [r.score for r in top] == pytest.approx(expected.values.tolist(), abs=1e-5)
    without = rec.recommend(history, k=5)  # no times: event features are missing, not silently zero
    assert [r.score for r in without] != pytest.approx([r.score for r in top], abs=1e-6)


# ---------------------------------------------------------------------------------------------- output layer


@pytest.mark.parametrize("name", ["sasrec", "gru4rec", "bert4rec"])
def test_output_variants(name: str, tmp_path: Path) -> None:
    data = prepared(tmp_path)
    tied = model_with(name, data)
    untied = model_with(name, data, tied=False)
    no_bias = model_with(name, data, output_bias=False)
    assert tied.item_bias() is not None and no_bias.item_bias() is None  # tied + bias is the default
    assert tied.item_embeddings().data_ptr() == tied.item_emb.weight.data_ptr()
    assert untied.item_embeddings().data_ptr() != untied.item_emb.weight.data_ptr()
    n_tied, n_untied = (sum(p.numel() for p in m.parameters()) for m in (tied, untied))
    assert n_untied - n_tied == (data.n_items + 1) * TINY[name]["d"]  # type: ignore[operator]
    save_checkpoint(untied, tmp_path / "u", max_len=8, item_table=data.item_table)
    loaded, _ = load_checkpoint(tmp_path / "u")
    assert torch.equal(loaded.item_embeddings(), untied.item_embeddings())
    assert not torch.equal(loaded.item_embeddings()[: data.n_items + 1], loaded.item_emb.weight[: data.n_items + 1])


def test_bias_is_used_alike_in_training_evaluation_and_recommendation(tmp_path: Path) -> None:
    data = prepared(tmp_path)
    model = model_with("sasrec", data).eval()
    favourite = 7
    with torch.no_grad():
        model.bias.zero_()  # type: ignore[union-attr]
        model.bias[favourite] = 50.0  # type: ignore[index]
    # training: the loss is full softmax CE over h·U + b
    batch = next(iter(TrainBatches(data, 8, 16, seed=0)))
    assert batch.targets is not None
    keep = batch.targets != 0
    h = model.hidden(batch.items)[keep]
    logits = h @ model.item_embeddings()[1:].T + model.item_bias()[1:]  # type: ignore[index]
    assert model.loss(batch).item() == pytest.approx(F.cross_entropy(logits, batch.targets[keep] - 1).item(), rel=1e-5)
    # evaluation: ranks come from h·U + b (the favourite outranks every target but itself)
    ranks = evaluate_ranks(model, data, "test", 8, EvalConfig(), torch.device("cpu"))
    users, pos = data.eval_positions("test")
    targets = data.items[data.offsets[users] + pos]
    assert (ranks[targets != favourite] >= 2).all()
    assert (ranks[targets == favourite] == 1).all()
    # recommendation: the checkpointed bias puts the favourite first
    save_checkpoint(model, tmp_path / "ckpt", max_len=8, item_table=data.item_table)
    top = Recommender.from_run(tmp_path / "ckpt").recommend(["i1", "i2"], k=1)
    raw = data.item_table.sort("idx")["item"].to_list()
    assert top[0].item == raw[favourite - 1]


def test_feature_block_rejects_a_wrong_item_table(tmp_path: Path) -> None:
    data = prepared(tmp_path)
    inputs = feature_inputs(FeaturesConfig(fields=[SPECS[3]]), data)
    assert inputs is not None
    with pytest.raises(SeqrecError, match="table shape"):
        FeatureBlock(inputs, data.n_items + 5, 8)


def test_cli_trains_and_recommends_with_features(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from seqrec.cli import main

    monkeypatch.setenv("SEQREC_HOME", str(tmp_path / "home"))
    data = prepared(tmp_path, "toy")
    assert main(["data", "features", str(data.path)]) == 0
    assert 'name = "genre"' in capsys.readouterr().out
    run_dir = tmp_path / "run"
    fields = ('[{name="gap", level="event", kind="continuous", transform="log1p"}, '
              '{name="rating", level="event", kind="continuous"}, '
              '{name="genre", level="item", kind="multi_categorical"}]')
    code = main(["train", "--dataset", str(data.path), "--model", "gru4rec", "--out", str(run_dir),
                 "--set", "train.epochs=2", "--set", "model.d=8", "--set", "data.max_len=8",
                 "--set", "train.progress=false", "--set", f"features.fields={fields}"])
    assert code == 0
    meta = json.loads((run_dir / "checkpoint" / "model.json").read_text())
    assert [f["spec"]["name"] for f in meta["features"]["fields"]] == ["gap", "rating", "genre"]
    capsys.readouterr()
    assert main(["recommend", str(run_dir), "--user", "u3", "-k", "2"]) == 0
    assert "top 2" in capsys.readouterr().out
    history = ["recommend", str(run_dir), "--history", "i1 i2", "--times", "0 60", "-k", "3"]
    assert main(history) == 0
    missing = capsys.readouterr().out
    assert main([*history, "--event", "rating=5,1"]) == 0
    rated = capsys.readouterr().out
    assert rated != missing  # the ratings reach the model
    rec = Recommender.from_run(run_dir)
    want = rec.recommend(["i1", "i2"], 3, times=[0.0, 60.0], events={"rating": [5.0, 1.0]})
    assert [line.split()[1] for line in rated.strip().splitlines()] == [r.item for r in want]
    assert main([*history, "--event", "ratin=5,1"]) == 2
    assert "unknown event feature(s) ['ratin']; this model takes rating" in capsys.readouterr().err
    assert main([*history, "--event", "rating=5,x"]) == 2
    assert "--event rating: 'x' is not a number" in capsys.readouterr().err


@pytest.mark.parametrize("stride", [0, 3])
def test_event_features_stay_aligned_with_the_inputs(tmp_path: Path, stride: int) -> None:
    """With overlapping windows too, Batch.events[name][b, l] belongs to the event Batch.items[b, l]."""
    data = prepared(tmp_path)
    flat = np.arange(len(data.items), dtype=np.float64) + 1  # a "feature" that names its event
    where = {i + 1: i for i in range(len(data.items))}
    for batch in TrainBatches(data, 8, 16, seed=0, stride=stride, events={"id": flat}):
        assert batch.events is not None
        ids = batch.events["id"]
        real = batch.items != 0
        assert ((ids != 0) == real).all()
        idx = torch.tensor([where[int(v)] for v in ids[real]])
        assert torch.equal(torch.from_numpy(data.items[idx.numpy()].astype(np.int64)), batch.items[real])
