"""Checkpoint integrity: sha256 of every file in model.json, checked on load; damaged files are one-line errors."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch

from seqrec.config import build
from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel
from seqrec.registry import build_model, model_config_class
from seqrec.train.checkpoint import (
    CHUNK,
    file_digest,
    load_checkpoint,
    load_weights,
    save_checkpoint,
    verify_checkpoint,
)

N_ITEMS = 30
REPO = Path(__file__).resolve().parents[1]


def tiny_sasrec() -> SequentialModel:
    torch.manual_seed(0)
    cfg = build(model_config_class("sasrec"), {"name": "sasrec", "d": 16, "n_heads": 2, "d_ff": 32}, "model")
    return build_model(cfg, N_ITEMS, 8).eval()


def item_table() -> pl.DataFrame:
    return pl.DataFrame({"idx": list(range(1, N_ITEMS + 1)), "item": [f"i{i}" for i in range(N_ITEMS)]})


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    dest = tmp_path / "run" / "checkpoint"
    save_checkpoint(tiny_sasrec(), dest, max_len=8, item_table=item_table(),
                    extra={"dataset_fingerprint": "abc"})
    return dest


def strip_hashes(ckpt: Path) -> None:
    """Make `ckpt` look like a checkpoint written before the hashes were stored."""
    meta = json.loads((ckpt / "model.json").read_text())
    del meta["files"]
    (ckpt / "model.json").write_text(json.dumps(meta))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_byte(path: Path, at: float = 0.75) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    path.write_bytes(bytes(data))


def one_line_error(ckpt: Path, *needles: str) -> str:
    with pytest.raises(SeqrecError) as info:
        load_checkpoint(ckpt)
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    for needle in needles:
        assert needle in message, message
    return message


def test_round_trip_records_and_checks_every_file(ckpt: Path) -> None:
    meta = json.loads((ckpt / "model.json").read_text())
    assert set(meta["files"]) == {"model.safetensors", "items.parquet"}
    for name, entry in meta["files"].items():
        data = (ckpt / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    verify_checkpoint(ckpt)
    model, loaded = load_checkpoint(ckpt)
    assert loaded["dataset_fingerprint"] == "abc"
    reference = tiny_sasrec().state_dict()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, reference[key], rtol=0, atol=0)


def test_extra_files_of_the_folder_are_hashed_too(tmp_path: Path) -> None:
    """Whatever the folder holds when model.json is written is vouched for (here via a subclass's extra file)."""
    from seqrec.train.checkpoint import folder_digests

    (tmp_path / "model.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "vocab.txt").write_text("a\nb\n")
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert set(folder_digests(tmp_path)) == {"model.safetensors", "sub/vocab.txt"}


def test_hashing_is_chunked_and_exact(tmp_path: Path) -> None:
    data = os.urandom(2 * CHUNK + 123)  # crosses chunk boundaries
    (tmp_path / "blob").write_bytes(data)
    assert file_digest(tmp_path / "blob") == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def test_truncated_weights_name_the_file(ckpt: Path) -> None:
    truncate(ckpt / "model.safetensors")
    message = one_line_error(ckpt, "model.safetensors", "truncated", "bytes")
    assert "Traceback" not in message
    with pytest.raises(SeqrecError, match=r"model\.safetensors"):
        verify_checkpoint(ckpt)


@pytest.mark.parametrize("name", ["model.safetensors", "items.parquet"])
def test_flipped_byte_is_caught_by_the_hash(ckpt: Path, name: str) -> None:
    flip_byte(ckpt / name)
    one_line_error(ckpt, name, "corrupt", "sha256")


def test_missing_listed_file(ckpt: Path) -> None:
    (ckpt / "items.parquet").unlink()
    one_line_error(ckpt, "items.parquet", "missing")


def test_old_checkpoint_without_hashes_loads(ckpt: Path) -> None:
    strip_hashes(ckpt)
    verify_checkpoint(ckpt)
    model, meta = load_checkpoint(ckpt)
    assert "files" not in meta
    torch.testing.assert_close(model.item_embeddings(), tiny_sasrec().item_embeddings(), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["model.safetensors", "items.parquet"])
def test_old_checkpoint_truncated_is_a_one_line_error(ckpt: Path, name: str) -> None:
    strip_hashes(ckpt)
    truncate(ckpt / name)
    one_line_error(ckpt, name, "corrupt or truncated")


def test_old_checkpoint_with_a_damaged_header(ckpt: Path) -> None:
    strip_hashes(ckpt)
    flip_byte(ckpt / "model.safetensors", at=0.001)  # inside the JSON header
    one_line_error(ckpt, "model.safetensors")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"model": "sasrec", "config": {}}', "missing n_items, max_len"),
        ('{"model": "sasrec", "config": {}, "n_items": "30", "max_len": 8}', "integers"),
        ('{"model": "sasrec", "config": {}, "n_items": 30, "max_len": 8, "files": {"a": 1}}', "files"),
    ],
)
def test_malformed_model_json(ckpt: Path, text: str, needle: str) -> None:
    (ckpt / "model.json").write_text(text)
    one_line_error(ckpt, "model.json", needle)


def test_no_model_json(tmp_path: Path) -> None:
    one_line_error(tmp_path, "not a checkpoint")


def test_cli_recommend_on_a_truncated_checkpoint(ckpt: Path) -> None:
    """Through the real entry point: exit status 2, one line on stderr, no traceback."""
    truncate(ckpt / "model.safetensors")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # faiss logs its CPU-feature probing at INFO when seqrec.serve imports it: not this test's business
    script = ("import logging, sys; logging.getLogger('faiss').setLevel(logging.WARNING); "
              "from seqrec.cli import main; sys.exit(main(sys.argv[1:]))")
    argv = ["recommend", str(ckpt.parent), "--history", "i1 i2"]
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("seqrec: error:") and "model.safetensors" in lines[0], lines


def test_weights_packed_into_one_buffer_are_saved(tmp_path: Path) -> None:
    """On CUDA, cuDNN packs a GRU's weights into one buffer (each weight a view of it), which safetensors
    refuses to save as it is (a GRU4Rec trained on a GPU could not be checkpointed). The same packing
    made on the CPU: saved, loaded back equal, and the model itself left as it was."""
    from safetensors.torch import load_model, save_model

    torch.manual_seed(0)
    cfg = build(model_config_class("gru4rec"), {"name": "gru4rec", "d": 16}, "model")
    model = build_model(cfg, N_ITEMS, 8).eval()
    weights = [getattr(model.gru, name) for name in model.gru._flat_weights_names]
    flat = torch.cat([w.detach().reshape(-1) for w in weights])
    offset = 0
    for w in weights:
        w.data = flat[offset : offset + w.numel()].view_as(w)
        offset += w.numel()
    with pytest.raises(RuntimeError, match="entire storage"):
        save_model(model, str(tmp_path / "as-is.safetensors"))
    save_checkpoint(model, tmp_path / "ckpt", max_len=8, item_table=item_table())
    loaded, _ = load_checkpoint(tmp_path / "ckpt")
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert all(w.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for w in weights)
    # loading into the packed model (a resumed run on CUDA): copied into the buffer, which stays packed
    with torch.no_grad():
        flat.zero_()
    with pytest.raises(RuntimeError, match="entire storage"):
        load_model(model, str(tmp_path / "ckpt" / "model.safetensors"))
    load_weights(model, tmp_path / "ckpt" / "model.safetensors")
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert all(w.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for w in weights)


def test_load_weights_keeps_tied_weights_and_names_what_does_not_fit(tmp_path: Path) -> None:
    model = tiny_sasrec()
    save_checkpoint(model, tmp_path / "ckpt", max_len=8, item_table=item_table())
    other = tiny_sasrec()
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    load_weights(other, tmp_path / "ckpt" / "model.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values(),
                                                 strict=True))
    cfg = build(model_config_class("sasrec"), {"name": "sasrec", "d": 8, "n_heads": 2, "d_ff": 32}, "model")
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_weights(build_model(cfg, N_ITEMS, 8), tmp_path / "ckpt" / "model.safetensors")
