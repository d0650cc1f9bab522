"""ONNX export: the exported encoder + item table reproduce PyTorch states and `Recommender` top-10 exactly."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch

from seqrec.data.batching import TrainBatches, history_batch
from seqrec.data.dataset import PreparedDataset
from seqrec.errors import SeqrecError
from seqrec.registry import MODELS
from seqrec.serve import Recommender
from seqrec.serve.export import export_run, verify_export
from seqrec.serve.recommender import Recommendation
from seqrec.train.checkpoint import load_checkpoint, save_checkpoint
from tests.serve_helpers import train_tiny_runs
from tests.test_models import make

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

MAX_LEN = 8
EXPORTED = [  # every registered model, and the options that change the exported graph or scoring
    ("sasrec", {}),
    ("sasrec", {"history_bias": True, "tied": False, "output_bias": False}),
    ("bert4rec", {}),
    ("gru4rec", {}),
    ("gru4rec", {"history_bias": True}),
    ("unisrec", {"history_bias": True}),
    ("unisrec", {"item_ids": True, "text_centre": True}),  # transductive: ID vectors in the item table
    ("item2vec", {}),
]
SHARED_DATA = Path(os.environ.get("SEQREC_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


def test_every_registered_model_is_exported() -> None:
    assert {name for name, _ in EXPORTED} == set(MODELS)


def trained_checkpoint(name: str, extra: dict[str, Any], data: PreparedDataset, dest: Path) -> Path:
    """A few epochs on the tiny set, so that scores are spread out (no near ties in a top-10)."""
    model = make(name, extra, n_items=data.n_items, max_len=MAX_LEN)
    model.fit_data(data)
    opt = torch.optim.Adam(model.parameters(), lr=3e-2 if name == "item2vec" else 1e-2)
    batches = model.train_batches(data, MAX_LEN, 16, 0) or TrainBatches(data, MAX_LEN, 16, seed=0)
    for _ in range(3):
        for batch in batches:
            opt.zero_grad()
            model.loss(batch).backward()
            opt.step()
    if model.history is not None:  # learned offsets start at 0: make them matter
        with torch.no_grad():
            model.history.theta.copy_(torch.linspace(-0.3, 0.2, MAX_LEN))
    save_checkpoint(model.eval(), dest, max_len=MAX_LEN, item_table=data.item_table)
    return dest


def onnx_top_k(export: Path, histories: list[list[int]], k: int,
               events: list[dict[str, np.ndarray]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(states, top-k indices) from the exported files alone, by the manifest's scoring rule; `events`:
    each history's event feature values, one per item (the manifest's features section)."""
    manifest = json.loads((export / "manifest.json").read_text())
    session = ort.InferenceSession(str(export / "encoder.onnx"), providers=["CPUExecutionProvider"])
    tensors = safetensors_numpy.load_file(str(export / "items.safetensors"))
    max_len = manifest["max_len"]
    width = max(min(len(h), max_len) for h in histories)

    def left_padded(rows: list[Any], dtype: type) -> np.ndarray:  # the last max_len values, most recent last
        out = np.zeros((len(rows), width), dtype=dtype)
        for row, values in enumerate(rows):
            tail = np.asarray(values)[-max_len:]
            out[row, width - len(tail):] = tail
        return out

    items = left_padded(histories, np.int64)
    feeds = {"items": items}
    for feature in manifest["features"]["event"]:
        feeds[feature["input"]] = left_padded([e[feature["name"]] for e in events or []], np.float32)
    if "item_inputs" in tensors:  # a text model's encoder reads the item table (grown by items added by text)
        feeds["item_inputs"] = tensors["item_inputs"]
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    scores = outputs["state"] @ tensors["item_vectors"].T
    if "item_bias" in tensors:
        scores = scores + tensors["item_bias"]
    if "history_offsets" in outputs:
        for row in range(len(histories)):
            np.add.at(scores[row], items[row], outputs["history_offsets"][row])
    scores[:, 0] = -np.inf
    return outputs["state"], np.argsort(-scores, axis=1, kind="stable")[:, :k]


def user_histories(data: PreparedDataset, n: int, min_len: int = 1) -> list[list[int]]:
    """Up to n training-part histories (item indices), of assorted lengths."""
    rng = np.random.default_rng(0)
    histories = []
    for u in range(len(data.lengths)):
        seq = data.items[data.offsets[u] : data.offsets[u + 1]].astype(int).tolist()
        cut = int(rng.integers(min(min_len, len(seq)), len(seq) + 1))
        if cut:
            histories.append(seq[:cut])
    return histories[:n]


def assert_same_as_pytorch(ckpt: Path, export: Path, histories: list[list[int]], atol: float = 1e-4) -> None:
    model, meta = load_checkpoint(ckpt)
    states, top = onnx_top_k(export, histories, 10)
    with torch.no_grad():
        ref = model.encode(history_batch(histories, int(meta["max_len"]))).numpy()
    np.testing.assert_allclose(states, ref, rtol=0, atol=atol)
    rec = Recommender.from_run(ckpt)
    ids = json.loads((export / "manifest.json").read_text())["item_ids"]
    for h, row in zip(histories, top, strict=True):
        expected = [r.item for r in rec.recommend([ids[i] for i in h], 10)]
        assert [ids[i] for i in row] == expected


@pytest.mark.parametrize(("name", "extra"), EXPORTED)
def test_onnx_matches_pytorch(name: str, extra: dict[str, Any], tiny_dataset: PreparedDataset,
                              tmp_path: Path) -> None:
    ckpt = trained_checkpoint(name, extra, tiny_dataset, tmp_path / "run" / "checkpoint")
    manifest = export_run(tmp_path / "run", tmp_path / "export")
    out = tmp_path / "export"
    text = ["adaptor.onnx"] if name == "unisrec" else []
    assert sorted(p.name for p in out.iterdir()) == [*text, "encoder.onnx", "items.parquet", "items.safetensors",
                                                     "manifest.json"]
    assert [i["name"] for i in manifest["encoder"]["inputs"]] == ["items"] + (["item_inputs"] if text else [])
    assert ("text" in manifest) == bool(text)
    assert manifest == json.loads((out / "manifest.json").read_text()) == verify_export(out)
    assert manifest["model"] == name and manifest["max_len"] == MAX_LEN and manifest["n_items"] == 30
    assert manifest["exporter"] in ("dynamo", "torchscript") and manifest["opset"] >= 11
    has_history = bool(extra.get("history_bias"))
    outputs = [o["name"] for o in manifest["encoder"]["outputs"]]
    assert outputs == (["state", "history_offsets"] if has_history else ["state"])
    onnx.checker.check_model(str(out / "encoder.onnx"))
    assert [o.name for o in ort.InferenceSession(str(out / "encoder.onnx")).get_outputs()] == outputs
    assert ("item_bias" in manifest["items"]["tensors"]) == (load_checkpoint(ckpt)[0].item_bias() is not None)
    assert manifest["item_ids"][1:] == tiny_dataset.item_table.sort("idx")["item"].to_list()
    assert_same_as_pytorch(ckpt, out, user_histories(tiny_dataset, 60))


def test_history_offsets_change_the_ranking(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    """The offsets output is not decoration: ignoring it gives other top-10s (so the parity test can fail)."""
    trained_checkpoint("sasrec", {"history_bias": True}, tiny_dataset, tmp_path / "ckpt")
    export_run(tmp_path / "ckpt", tmp_path / "export")
    histories = user_histories(tiny_dataset, 30, min_len=4)
    _, with_offsets = onnx_top_k(tmp_path / "export", histories, 10)
    tensors = safetensors_numpy.load_file(str(tmp_path / "export" / "items.safetensors"))
    session = ort.InferenceSession(str(tmp_path / "export" / "encoder.onnx"))
    items = history_batch(histories, MAX_LEN).items.numpy()
    scores = session.run(["state"], {"items": items})[0] @ tensors["item_vectors"].T + tensors["item_bias"]
    scores[:, 0] = -np.inf
    assert not np.array_equal(np.argsort(-scores, axis=1, kind="stable")[:, :10], with_offsets)


def test_export_replaces_dest_atomically_and_detects_damage(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    trained_checkpoint("sasrec", {}, tiny_dataset, tmp_path / "ckpt")
    dest = tmp_path / "export"
    dest.mkdir()
    (dest / "stale.txt").write_text("not an export")
    with pytest.raises(SeqrecError, match="holds other files"):  # replacing it would delete them
        export_run(tmp_path / "ckpt", dest, opset=18)
    assert (dest / "stale.txt").read_text() == "not an export"
    (dest / "manifest.json").write_text("{}")  # an earlier export: replaced whole
    export_run(tmp_path / "ckpt", dest, opset=18)
    assert not (dest / "stale.txt").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    assert verify_export(dest)["opset"] == 18
    data = bytearray((dest / "items.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (dest / "items.safetensors").write_bytes(bytes(data))
    with pytest.raises(SeqrecError, match=r"items\.safetensors"):
        verify_export(dest)


def test_refusals(tiny_dataset: PreparedDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = trained_checkpoint("gru4rec", {}, tiny_dataset, tmp_path / "ckpt")
    with pytest.raises(SeqrecError, match="unknown export format 'tflite'"):
        export_run(ckpt, tmp_path / "out", format="tflite")
    with pytest.raises(SeqrecError, match="nowhere: no such run folder"):
        export_run(tmp_path / "nowhere", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SeqrecError, match=r"empty: not a run folder \(no checkpoint/model.json\)"):
        export_run(tmp_path / "empty", tmp_path / "out")

    def unexportable(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("no such operator")

    monkeypatch.setattr("seqrec.serve.export.export_onnx", unexportable)
    with pytest.raises(SeqrecError, match=r"could not export gru4rec to ONNX \(dynamo: RuntimeError: no such"):
        export_run(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("name", "fusion"), [("sasrec", "sum"), ("gru4rec", "sum"), ("bert4rec", "concat"),
                                              ("unisrec", "sum")])
def test_models_with_side_features_export_and_serve(name: str, fusion: str, tmp_path: Path) -> None:
    """Item features (every encoding) travel inside the encoder, event features are inputs: the exported
    files and the onnx engine give PyTorch's top-10 for histories with times and ratings, and without."""
    from tests.test_features import SPECS, model_with, prepared

    data = prepared(tmp_path)
    model = model_with(name, data, SPECS, fusion).eval()
    with torch.no_grad():  # trained-looking features: missing vectors and encoders far from their zero init
        assert model.feature_block is not None
        for p in model.feature_block.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    ckpt = tmp_path / "ckpt"
    save_checkpoint(model, ckpt, max_len=MAX_LEN, item_table=data.item_table)
    manifest = export_run(ckpt, tmp_path / "export")
    inputs = [i["name"] for i in manifest["encoder"]["inputs"]]
    assert inputs == ["items", *(["item_inputs"] if name == "unisrec" else []), "event_gap", "event_hour",
                      "event_rating"]
    assert manifest["features"]["item"] == ["year", "genre"]
    assert [f["input"] for f in manifest["features"]["event"]] == inputs[-3:]
    torch_rec, onnx_rec = Recommender.from_run(ckpt), Recommender.from_run(ckpt, engine="onnx")
    assert onnx_rec._onnx is not None
    raw = torch_rec.catalogue.raw_ids
    rng = np.random.default_rng(0)
    histories = user_histories(data, 12, min_len=2)
    times = [np.cumsum(rng.integers(30, 90_000, len(h))).astype(float) for h in histories]
    ratings = [rng.integers(1, 6, len(h)).astype(float) for h in histories]
    events = [torch_rec.history_events(len(h), t, {"rating": r}) for h, t, r in zip(histories, times, ratings,
                                                                                     strict=True)]
    _, top = onnx_top_k(tmp_path / "export", histories, 10, events)
    for h, t, r, row in zip(histories, times, ratings, top, strict=True):
        ids = [raw[i - 1] for i in h]
        want = torch_rec.recommend(ids, k=10, times=t.tolist(), events={"rating": r.tolist()})
        got = onnx_rec.recommend(ids, k=10, times=t.tolist(), events={"rating": r.tolist()})
        assert [x.item for x in got] == [x.item for x in want] == [raw[i - 1] for i in row]
        np.testing.assert_allclose([x.score for x in got], [x.score for x in want], atol=1e-4)
        plain = onnx_rec.recommend(ids, k=10)  # no times: event features missing, as in PyTorch
        assert [x.item for x in plain] == [x.item for x in torch_rec.recommend(ids, k=10)]
        assert [x.score for x in plain] != pytest.approx([x.score for x in got], abs=1e-4)  # the events count
    if name == "sasrec":  # the same through the service: times and events in the request
        from fastapi.testclient import TestClient

        from seqrec.serve.app import create_app

        client = TestClient(create_app(onnx_rec))
        ids = [raw[i - 1] for i in histories[0]]
        body = {"history": ids, "k": 10, "times": times[0].tolist(), "events": {"rating": ratings[0].tolist()}}
        got = client.post("/recommend", json=body).json()["items"]
        want = torch_rec.recommend(ids, k=10, times=times[0].tolist(), events={"rating": ratings[0].tolist()})
        assert [g["item"] for g in got] == [w.item for w in want]
        typo = client.post("/recommend", json={**body, "events": {"ratin": ratings[0].tolist()}})
        error = typo.json()["error"]
        assert typo.status_code == 400 and "['ratin']" in error and "takes rating" in error
        # a session whose events carry their time and rating: after each event, /recommend's top-k on the
        # same history with the same times and ratings; an event without them leaves them missing there
        for n, (item, t, r) in enumerate(zip(ids, times[0], ratings[0], strict=True), start=1):
            # the second event gives no rating, the third no time
            extra = {**({"values": {"rating": float(r)}} if n != 2 else {}), **({"time": float(t)} if n != 3 else {})}
            got = client.post("/sessions/u/events", json={"item": item, "k": 10, **extra}).json()
            r_given = [float(x) if i != 1 else float("nan") for i, x in enumerate(ratings[0][:n])]
            t_given = [float(x) if i != 2 else float("nan") for i, x in enumerate(times[0][:n])]
            want = torch_rec.recommend(ids[:n], k=10, times=t_given, events={"rating": r_given})
            assert [g["item"] for g in got["recommendations"]] == [w.item for w in want]
            np.testing.assert_allclose([g["score"] for g in got["recommendations"]], [w.score for w in want],
                                       atol=1e-4)
        view = client.get("/sessions/u").json()  # re-encoded from the stored times and values
        assert [g["item"] for g in view["recommendations"]] == [w.item for w in want]
        bad = client.post("/sessions/u/events", json={"item": ids[0], "values": {"ratin": 3.0}})
        assert bad.status_code == 400 and "['ratin']" in bad.json()["error"]
        assert client.get("/sessions/u").json()["n_events"] == len(ids)  # a refused event adds nothing
    many = [[raw[i - 1] for i in h] for h in histories[:4]]  # batch requests: event values missing
    assert [[x.item for x in rs] for rs in onnx_rec.recommend_many(many, k=5)] == \
        [[x.item for x in torch_rec.recommend(h, k=5)] for h in many]


def test_a_huge_event_vocabulary_is_not_exported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The exported lookup compares a value with every key: refused above the limit, and the auto engine
    says so and serves with PyTorch."""
    from tests.test_features import SPECS, model_with, prepared

    data = prepared(tmp_path)
    save_checkpoint(model_with("sasrec", data, SPECS).eval(), tmp_path / "ckpt", max_len=MAX_LEN,
                    item_table=data.item_table)
    monkeypatch.setattr("seqrec.serve.export_inputs.EVENT_VOCAB_LIMIT", 3)
    with pytest.raises(SeqrecError, match=r"event feature 'hour' has \d+ values.*--engine torch"):
        export_run(tmp_path / "ckpt", tmp_path / "export")
    with caplog.at_level("INFO", logger="seqrec.serve.recommender"):
        assert Recommender.from_run(tmp_path / "ckpt", engine="auto")._onnx is None
    assert "engine: torch (event feature 'hour'" in caplog.text


ML100K_SASREC = ['model.name="sasrec"', "model.d=32", "data.max_len=50", "train.epochs=1", "train.progress=false",
                 "train.batch_size=256"]


@pytest.mark.realdata
def test_ml100k_sasrec_onnx_top10_is_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny SASRec trained one epoch on ml-100k: ONNX and PyTorch agree on the top-10 of 200 real users;
    the same with the features inferred from the data (gap, hour, rating, year, genres), each history
    with its real times and ratings, on the onnx engine."""
    source = SHARED_DATA / "ml-100k"
    if not source.is_dir():
        pytest.skip(f"{source} is absent (set SEQREC_SHARED_DATA to the shared data folder)")
    from seqrec.config import resolve
    from seqrec.data.catalog import KNOWN_DATASETS, load_known
    from seqrec.data.prepare import PrepareOptions, prepare
    from seqrec.train.loop import fit

    monkeypatch.setenv("SEQREC_HOME", str(tmp_path / "home"))
    data = prepare(load_known("ml-100k", source), PrepareOptions(**KNOWN_DATASETS["ml-100k"].prepare),
                   tmp_path / "prepared")
    fit(resolve({}, ML100K_SASREC), data, tmp_path / "run")
    manifest = export_run(tmp_path / "run", tmp_path / "export")
    assert manifest["n_items"] == 1682 and manifest["max_len"] == 50
    histories = user_histories(data, 200, min_len=1)
    assert len(histories) == 200 and max(map(len, histories)) > 50  # some are cut to max_len
    assert_same_as_pytorch(tmp_path / "run" / "checkpoint", tmp_path / "export", histories)

    fit(resolve({}, [*ML100K_SASREC, "features.infer=true"]), data, tmp_path / "feat")
    torch_rec, onnx_rec = Recommender.from_run(tmp_path / "feat"), Recommender.from_run(tmp_path / "feat",
                                                                                         engine="onnx")
    assert {"gap", "hour", "rating"} <= set(torch_rec.model.event_feature_names()) and onnx_rec._onnx is not None
    raw = torch_rec.catalogue.raw_ids
    ratings = pl.read_parquet(data.path / "events.parquet")["rating"].to_numpy()
    assert data.times is not None
    for u in range(200):
        lo, hi = int(data.offsets[u]), int(data.offsets[u]) + int(data.split[u, 1])
        kw = {"times": data.times[lo:hi].tolist(), "events": {"rating": ratings[lo:hi].tolist()}}
        ids = [raw[i - 1] for i in data.items[lo:hi]]
        a, b = torch_rec.recommend(ids, 10, **kw), onnx_rec.recommend(ids, 10, **kw)
        assert [r.item for r in a] == [r.item for r in b]
        np.testing.assert_allclose([r.score for r in a], [r.score for r in b], atol=1e-4)


@pytest.mark.parametrize(("name", "extra"), [("sasrec", {"history_bias": True}), ("gru4rec", {})])
def test_onnx_engine_serves_the_same_top_k(name: str, extra: dict[str, Any], tiny_dataset: PreparedDataset,
                                           tmp_path: Path) -> None:
    """`Recommender.use_engine("onnx")` (and `seqrec serve --engine onnx`): the same recommendations as
    PyTorch, history offsets included, and the encoder really is ONNX Runtime's."""
    ckpt = trained_checkpoint(name, extra, tiny_dataset, tmp_path / "ckpt")
    torch_rec, onnx_rec = Recommender.from_run(ckpt), Recommender.from_run(ckpt, engine="onnx")
    assert onnx_rec._onnx is not None and torch_rec._onnx is None
    raw = torch_rec.catalogue.raw_ids
    for history in user_histories(tiny_dataset, 12):
        ids = [raw[i - 1] for i in history]
        a, b = torch_rec.recommend(ids, k=10), onnx_rec.recommend(ids, k=10)
        assert [r.item for r in a] == [r.item for r in b]
        np.testing.assert_allclose([r.score for r in a], [r.score for r in b], atol=1e-4)
    many = [[raw[i - 1] for i in h] for h in user_histories(tiny_dataset, 5)]
    assert [[r.item for r in rs] for rs in onnx_rec.recommend_many(many, k=5)] == \
        [[r.item for r in rs] for rs in torch_rec.recommend_many(many, k=5)]
    onnx_rec.use_engine("torch")
    assert onnx_rec._onnx is None


def test_onnx_engine_keeps_its_export_and_loads_it_again(tiny_dataset: PreparedDataset, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A second engine of the same model (a restart, another worker) loads the cached graph instead of
    exporting it again, with the same answers; other weights are a new export; a damaged cached graph is
    exported again; a cache that cannot be written still serves."""
    import seqrec.serve.export as export
    from seqrec.serve import onnx_engine

    monkeypatch.setenv("SEQREC_HOME", str(tmp_path / "home"))
    exports: list[Path] = []
    write = export.write_encoder
    monkeypatch.setattr(export, "write_encoder", lambda w, path, opset: exports.append(path) or write(w, path, opset))
    ckpt = trained_checkpoint("sasrec", {"history_bias": True}, tiny_dataset, tmp_path / "ckpt")
    torch_rec = Recommender.from_run(ckpt)
    raw = torch_rec.catalogue.raw_ids
    histories = [[raw[i - 1] for i in h] for h in user_histories(tiny_dataset, 6)]

    def answers(rec: Recommender) -> list[list[str]]:
        return [[r.item for r in rs] for rs in rec.recommend_many(histories, k=5)]

    first = Recommender.from_run(ckpt, engine="onnx")
    second = Recommender.from_run(ckpt, engine="onnx")
    assert len(exports) == 1 and first._onnx is not None and second._onnx is not None
    assert not first._onnx.cached and second._onnx.cached
    assert answers(first) == answers(second) == answers(torch_rec)
    cached = list(onnx_engine.onnx_cache().glob("*/encoder.onnx"))
    assert len(cached) == 1 and not list(onnx_engine.onnx_cache().glob(".export-*"))

    changed = Recommender.from_run(ckpt)  # one weight changed: another graph
    with torch.no_grad():
        for weight in changed.model.parameters():  # (a constant shift could vanish in a layer norm)
            weight.add_(torch.randn_like(weight) * 0.1)
    changed.use_engine("onnx")
    assert len(exports) == 2 and changed._onnx is not None and not changed._onnx.cached
    # a graph that loads but answers otherwise (what the key would miss: an exporter's version) is exported again
    other = next(p for p in onnx_engine.onnx_cache().glob("*/encoder.onnx") if p != cached[0])
    original = cached[0].read_bytes()
    cached[0].write_bytes(other.read_bytes())
    swapped = Recommender.from_run(ckpt, engine="onnx")
    assert len(exports) == 3 and not swapped._onnx.cached and answers(swapped) == answers(torch_rec)  # type: ignore[union-attr]
    assert cached[0].read_bytes() == original  # (the export is deterministic)

    # from here each new export writes that graph (what the exporter was just seen to write) instead of
    # tracing the model again: the cases below are about when the engine exports, not how
    monkeypatch.setattr(export, "write_encoder",
                        lambda w, path, opset: exports.append(path) or path.write_bytes(original))
    cached[0].write_bytes(cached[0].read_bytes()[:100])  # cut short
    again = Recommender.from_run(ckpt, engine="onnx")
    assert len(exports) == 4 and again._onnx is not None and not again._onnx.cached
    assert answers(again) == answers(torch_rec)
    cached[0].unlink()  # a folder left without its graph (a removal stopped part-way) is made again
    assert not Recommender.from_run(ckpt, engine="onnx")._onnx.cached and cached[0].is_file()  # type: ignore[union-attr]
    assert len(exports) == 5 and Recommender.from_run(ckpt, engine="onnx")._onnx.cached  # type: ignore[union-attr]
    assert oct(cached[0].parent.stat().st_mode & 0o777) == "0o755"  # other users' services may load it

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SEQREC_HOME", str(tmp_path / "file"))  # no folder can be made under a file
    unkept = Recommender.from_run(ckpt, engine="onnx")
    assert len(exports) == 6 and answers(unkept) == answers(torch_rec)


def test_onnx_engine_refusals(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    ckpt = trained_checkpoint("sasrec", {}, tiny_dataset, tmp_path / "ckpt")
    with pytest.raises(SeqrecError, match="unknown engine"):
        Recommender.from_run(ckpt, engine="tensorrt")


def test_auto_engine_takes_onnx_where_it_can(tiny_dataset: PreparedDataset, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """`seqrec serve`'s default: ONNX Runtime when it can serve the model, else PyTorch, saying why."""
    import importlib.util

    ckpt = trained_checkpoint("sasrec", {}, tiny_dataset, tmp_path / "ckpt")
    with caplog.at_level("INFO", logger="seqrec.serve.recommender"):
        assert Recommender.from_run(ckpt, engine="auto")._onnx is not None
    assert "engine: onnx" in caplog.text
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    caplog.clear()
    with caplog.at_level("INFO", logger="seqrec.serve.recommender"):
        assert Recommender.from_run(ckpt, engine="auto")._onnx is None
    assert "engine: torch (onnxruntime not installed" in caplog.text
    with pytest.raises(SeqrecError, match=r"onnxruntime not installed.*--engine torch"):
        Recommender.from_run(ckpt, engine="onnx")


TEXT_RUNS = {"inductive": (),
             "transductive, centred": ("--set", "model.item_ids=true", "--set", "model.text_centre=true")}


@pytest.fixture(scope="module", params=list(TEXT_RUNS))
def text_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny UniSRec run trained through the CLI with a tiny local text encoder (items take text):
    inductive, and transductive (trained items' table rows hold ID vectors) with centred text."""
    root = tmp_path_factory.mktemp("text-run")
    return train_tiny_runs(root, ("unisrec",), TEXT_RUNS[request.param])["unisrec"]


NEW_ITEMS = {"n1": "red glue", "n2": "large green saw tool", "n3": "small blue tape"}


def test_text_model_export_takes_items_added_by_text(text_run: Path, tmp_path: Path) -> None:
    """Items added after the export, by the manifest's recipe (the run's text encoder, then adaptor.onnx,
    rows appended to both tables), score and encode as `Recommender.add_items` makes them in PyTorch."""
    from seqrec.data.text import TextOptions, encode_texts

    manifest = export_run(text_run, tmp_path / "export")
    out = tmp_path / "export"
    rec = Recommender.from_run(text_run)
    rec.add_items(NEW_ITEMS)
    enc = manifest["text"]["encoder"]
    options = TextOptions(encoder=enc["name"], revision=enc["revision"], pooling=enc["pooling"],
                          max_length=enc["max_length"], template=enc["template"])
    text = encode_texts(list(NEW_ITEMS.values()), options).numpy()
    adaptor = ort.InferenceSession(str(out / "adaptor.onnx"), providers=["CPUExecutionProvider"])
    inputs, vectors = adaptor.run(None, {"text": text})
    new = torch.tensor(rec.to_indices(list(NEW_ITEMS)))
    assert new.tolist() == list(range(manifest["n_items"] + 1, manifest["n_items"] + 4))
    np.testing.assert_allclose(vectors, rec.catalogue.vectors[new].numpy(), rtol=0, atol=1e-4)
    np.testing.assert_allclose(inputs, rec.model.input_table(new).detach().numpy(), rtol=0, atol=1e-5)
    tensors = safetensors_numpy.load_file(str(out / "items.safetensors"))
    table = np.concatenate([tensors["item_inputs"], inputs])
    item_vectors = np.concatenate([tensors["item_vectors"], vectors])
    encoder = ort.InferenceSession(str(out / "encoder.onnx"), providers=["CPUExecutionProvider"])
    raw = rec.catalogue.raw_ids
    histories = [["n1", raw[3], "n3"], [raw[0], raw[5], raw[2], "n2"], ["n2"]]
    for history in histories:
        items = np.array([rec.to_indices(history)], dtype=np.int64)
        outputs = encoder.run(None, {"items": items, "item_inputs": table})
        scores = (outputs[0] @ item_vectors.T)[0]
        if len(outputs) > 1:  # the history offsets (the run learned a history bias)
            np.add.at(scores, items[0], outputs[1][0])
        scores[0] = -np.inf
        top = np.argsort(-scores, kind="stable")[:10]
        assert_same_ranking(rec.recommend(history, k=10), [Recommendation(raw[i - 1], scores[i]) for i in top])


def test_onnx_engine_serves_a_text_model_as_its_catalogue_grows(text_run: Path) -> None:
    """The ONNX engine keeps a text model's item table beside the catalogue: items added (or re-texted)
    while it serves are encoded and ranked exactly as PyTorch does."""
    torch_rec, onnx_rec = Recommender.from_run(text_run), Recommender.from_run(text_run, engine="onnx")
    assert onnx_rec._onnx is not None and onnx_rec._onnx._table is not None
    raw = torch_rec.catalogue.raw_ids
    histories = [[raw[1], raw[4]], [raw[7], raw[2], raw[9], raw[11]]]
    for batch in ([], NEW_ITEMS, {raw[4]: "large green saw tool", "n4": "glue of the item"}):
        if batch:
            torch_rec.add_items(batch)
            onnx_rec.add_items(batch)
            histories += [[*histories[0], *batch]]
        for history in histories:
            assert_same_ranking(torch_rec.recommend(history, k=10), onnx_rec.recommend(history, k=10))
    assert onnx_rec._onnx._table.shape[0] == onnx_rec.n_items + 1


def assert_same_ranking(a: list[Any], b: list[Any], tol: float = 1e-4) -> None:
    """The same scores, and the same item at every rank whose score is not tied (within `tol`) with
    another's: the tiny encoder gives many items the same text vector (their titles differ in digits
    it does not know), and tied items come in either order."""
    np.testing.assert_allclose([r.score for r in a], [r.score for r in b], atol=tol)
    scores = np.array([r.score for r in a])
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if np.sum(np.abs(scores - scores[i]) <= tol) == 1:
            assert x.item == y.item, f"rank {i}: {x.item} != {y.item}"


def test_onnx_engine_table_grows_without_disturbing_readers(text_run: Path) -> None:
    """More items than the table's room: it moves to a larger buffer, a table taken before (a request
    under way) is left as it was, replaced rows go to a copy, and the answers stay PyTorch's."""
    torch_rec, onnx_rec = Recommender.from_run(text_run), Recommender.from_run(text_run, engine="onnx")
    engine = onnx_rec._onnx
    assert engine is not None and engine._table is not None
    before = engine._table
    snapshot = before.copy()
    room = len(engine._store)
    words = ["red", "blue", "green", "small", "large", "tool", "glue", "tape", "saw"]
    many = {f"m{i}": f"{words[i % 9]} {words[(i // 9) % 9]} {words[(i * 7) % 9]}" for i in range(room + 5)}
    torch_rec.add_items(many)
    onnx_rec.add_items(many)
    assert engine._table.shape[0] == onnx_rec.n_items + 1 > room and not np.shares_memory(engine._table, before)
    np.testing.assert_array_equal(before, snapshot)
    grown = engine._table
    replaced = {"m3": "large green saw tool", torch_rec.catalogue.raw_ids[2]: "red glue"}
    torch_rec.add_items(replaced)
    onnx_rec.add_items(replaced)
    assert not np.shares_memory(engine._table, grown) and engine._table.shape == grown.shape
    assert not np.array_equal(engine._table, grown)
    with pytest.raises(SeqrecError, match="next indices"):
        engine.set_rows([engine._table.shape[0] + 1], torch.zeros(1, engine._table.shape[1]))
    raw = torch_rec.catalogue.raw_ids
    for history in ([raw[1], "m3"], ["m7", "m40", raw[5]], [raw[2]]):
        assert_same_ranking(torch_rec.recommend(history, k=10), onnx_rec.recommend(history, k=10))


def test_export_and_checkpoint_files_have_the_usual_modes(tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    """Folders written atomically get the modes a plain mkdir / open gives (the umask's), not the
    temporary folder's 0700 or the 0600 some writers (safetensors) use: runs and exports are shared."""
    from seqrec.data.io import UMASK

    trained_checkpoint("sasrec", {}, tiny_dataset, tmp_path / "run" / "checkpoint")
    export_run(tmp_path / "run", tmp_path / "export")
    for folder in (tmp_path / "export", tmp_path / "run" / "checkpoint"):
        assert folder.stat().st_mode & 0o777 == 0o777 & ~UMASK
        files = [p for p in folder.iterdir() if p.is_file()]
        assert any(p.suffix == ".safetensors" for p in files)
        assert {p.name: p.stat().st_mode & 0o777 for p in files} == {p.name: 0o666 & ~UMASK for p in files}
