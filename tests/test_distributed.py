"""Data-parallel training under torchrun (gloo on CPU): shards, synchronised replicas, one run folder."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seqrec.data.batching import TrainBatches
from seqrec.data.dataset import PreparedDataset
from seqrec.train.distributed import ShardedBatches, World

RANK_SCRIPT = """
import hashlib, json, sys
from pathlib import Path
import logging
import torch
from seqrec.config import resolve
from seqrec.data.dataset import PreparedDataset
from seqrec.train import loop

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
data = PreparedDataset.load(Path(sys.argv[1]))
out = Path(sys.argv[2])
cfg = resolve({{}}, [f'data.dataset="{{data.path}}"', "data.max_len=8", 'model.name="{model}"', "model.d=16",
                    "model.dropout=0.3", "train.epochs=3", "train.patience=50", "train.batch_size=8",
                    "train.progress=false", "train.threads=1", {extra}])
epochs = []
real = loop.train_epoch
class Recorded:  # the epoch's batches as training consumes them (iterating twice would move the feeder's RNG)
    def __init__(self, batches, users):
        self.batches, self.users, self.n_targets = batches, users, batches.n_targets
    def __len__(self):
        return len(self.batches)
    def __iter__(self):
        for b in self.batches:
            self.users.append(b.users.tolist())
            yield b
def spy(model, batches, *rest):
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    epochs.append({{"weights": digest, "users": []}})
    return real(model, Recorded(batches, epochs[-1]["users"]), *rest)
loop.train_epoch = spy
loop.fit(cfg, data, out / "run")
(out / f"rank{{torch.distributed.get_rank()}}.json").write_text(json.dumps(epochs))
"""


def test_shards_split_an_epoch_evenly_and_disjointly(tiny_dataset: PreparedDataset) -> None:
    full = list(TrainBatches(tiny_dataset, 8, 4, seed=3))
    shards = [list(ShardedBatches(TrainBatches(tiny_dataset, 8, 4, seed=3), World(r, 3))) for r in range(3)]
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) == len(full) // 3
    for r, shard in enumerate(shards):  # rank r takes batches r, r + 3, ... of the same seeded order
        for i, batch in enumerate(shard):
            assert batch.items.equal(full[r + 3 * i].items)


@pytest.mark.parametrize(("model", "extra"), [("sasrec", '"data.jitter=true"'), ("gru4rec", '"train.refit=true"')])
def test_torchrun_trains_synchronised_replicas(model: str, extra: str, tiny_dataset: PreparedDataset,
                                               tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(model=model, extra=extra))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(script), str(tiny_dataset.path), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:  # a second launch when the first could not start (e.g. a port taken meanwhile)
        first = proc.stderr[-3000:]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"first launch:\n{first}\nsecond launch:\n{proc.stderr[-3000:]}"
    run = tmp_path / "run"
    results = json.loads((run / "results.json").read_text())  # rank 0 wrote the one run folder
    assert results["epochs_run"] == 3 and 0 <= results["test"]["recall@10"] <= 1 and results["processes"] == [2]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3
    assert not (run / "state").exists()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) >= 3  # the same epochs (and refit epochs) on both ranks
    for a, b in zip(*ranks, strict=True):
        # replicas start every epoch with identical weights (DDP averaged the gradients) ...
        assert a["weights"] == b["weights"], (a["weights"], b["weights"], proc.stderr[-2000:])
        # ... and train on different batches of the epoch, as many steps each
        assert len(a["users"]) == len(b["users"]) > 0 and a["users"] != b["users"]
    assert ranks[0][1]["weights"] != ranks[0][0]["weights"]  # and they did train
    logged = proc.stdout + proc.stderr  # rank 0's lines (epochs, auto decisions, refit), not one per process
    refit = ("refit epoch 1/",) if "refit" in extra else ()
    for line in ("seqrec.train.loop: epoch 3 ", "auto: data.stride = ", *refit):
        assert logged.count(line) == 1, (line, logged[-3000:])
    assert "find_unused_parameters=True was specified" not in logged  # DDP's note on every rank: noise


@pytest.mark.parametrize(("setting", "message"), [
    ("train.batch_size=100000", "1 training batch(es) an epoch for 2 processes"),  # each would step nothing
    ("train.device=cuda", "train.device 'cuda'"),  # it trained on the CPU and config.json said cuda
])
def test_torchrun_refuses_what_it_cannot_train(setting: str, message: str, tiny_dataset: PreparedDataset,
                                               tmp_path: Path) -> None:
    """One batch an epoch for two processes (the untrained model would be saved and tested as if trained), or a
    CUDA device on a machine without one: refused before the run folder is written."""
    if "cuda" in setting and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "seqrec.cli", "train", "--dataset", str(tiny_dataset.path), "--model", "sasrec", "--out",
           str(tmp_path / "run"), "--set", setting, "--set", "model.d=16",
           "--set", "train.threads=1", "--set", "train.progress=false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()
