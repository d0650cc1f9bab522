"""Tiny trained runs for the service's browser and fuzz tests: a SASRec (ID model) and a UniSRec (text
model, so items can be added by text), trained for a few epochs on the generated log in seconds."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from seqrec.cli import main
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.serve import Recommender
from tests.conftest import synthetic_log
from tests.unisrec_helpers import TEXT_DIM, make_tiny_encoder

TINY = ["--set", "model.d=16", "--set", "data.max_len=8", "--set", "train.progress=false", "--set", "train.lr=0.01",
        "--set", "model.n_layers=2", "--set", "model.n_heads=2", "--set", "model.d_ff=32"]


def train_tiny_runs(root: Path, names: tuple[str, ...] = ("sasrec", "unisrec"), extra: tuple[str, ...] = (),
                    n_items: int = 30) -> dict[str, Path]:
    """Train the named tiny runs under `root` (`extra`: more arguments for each) on the generated log of
    `n_items` items (i0, i1, ...); returns name -> run folder."""
    data = prepare(synthetic_log(n_items=n_items), PrepareOptions(), root / "data").path
    specs = {
        "sasrec": ["--model", "sasrec", "--set", 'model.positions_from="start"', "--set", "model.history_bias=true",
                   "--set", "train.epochs=5"],
        "unisrec": ["--model", "unisrec", "--set", 'model.positions_from="start"', "--set", "train.epochs=3",
                    "--set", f"model.text_dim={TEXT_DIM}", "--set", "model.text_max_length=16",
                    "--set", "model.n_experts=2"],
    }
    out = {}
    for name in names:
        argv = [*specs[name], *extra]
        if name == "unisrec":
            argv += ["--set", f'model.text_encoder="{make_tiny_encoder(root / "enc")}"']
        code = main(["train", "--dataset", str(data), "--out", str(root / name), *TINY, *argv])
        assert code == 0, f"training the tiny {name} run failed"
        out[name] = root / name
    return out


def hold_rebuilds(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """FAISS index rebuilds in the background wait (before building) until the returned event is set; the
    first build of an index does not."""
    from seqrec.serve.ann import FaissRetriever

    release = threading.Event()
    build = FaissRetriever._build

    def held_build(self, items, n_lists):  # type: ignore[no-untyped-def]
        if threading.current_thread().name == f"seqrec-{self.kind}-rebuild":  # (_builder is set after it starts)
            assert release.wait(60), "the test never released the rebuild"
        return build(self, items, n_lists)

    monkeypatch.setattr(FaissRetriever, "_build", held_build)
    return release


def same_catalogue(a: Recommender, b: Recommender) -> None:
    """The same items under the same indices, texts, removals, vectors and answers."""
    assert a.catalogue.raw_ids == b.catalogue.raw_ids and a.catalogue.titles == b.catalogue.titles
    assert a.catalogue.removed == b.catalogue.removed and a.catalogue.texts == b.catalogue.texts
    torch.testing.assert_close(a.catalogue.vectors, b.catalogue.vectors, atol=1e-5, rtol=0)
    for history in (["i3", "new1"], ["i5", "i6", "i7"], ["new3"]):
        got, want = b.recommend(history, 10), a.recommend(history, 10)
        assert [r.item for r in got] == [r.item for r in want]
        assert [r.score for r in got] == pytest.approx([r.score for r in want], abs=1e-4)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, seconds: float = 90.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"seqrec serve exited ({proc.returncode}):\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"seqrec serve not healthy after {seconds:.0f} s:\n{log.read_text()}")


def stop_process(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
