"""What the `"auto"` settings decide on every dataset: `seqrec train --model M` with no config reads
the training split (and, for the loss and batch size, the machine) and records each decision with its
reason (seqrec.train.auto). This script makes those decisions, without training, on every known dataset
in ../shared/data and on generated logs as large as benchmarks/scale.py's, for SASRec, GRU4Rec,
BERT4Rec and UniSRec (each model's own auto keys), and writes results/auto_decisions.json.

    python benchmarks/auto_decisions.py [--datasets ml-100k ...] [--sizes 1e6 1e7] [--threads 1]

The loss decision takes the nominal rate of the device (seqrec.train.auto.NOMINAL_FLOPS, per CPU thread):
the file records it with the thread count; the batch size depends on the memory free when deciding.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, SHARED_DATA, machine, prepared, write_result
from scale import shape_for

from seqrec.config import resolve
from seqrec.data.catalog import KNOWN_DATASETS
from seqrec.data.dataset import PreparedDataset
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.data.synthetic import generated_dataset
from seqrec.train.auto import resolve_auto, resolve_auto_data, resolve_auto_train

MODELS = ("sasrec", "gru4rec", "bert4rec", "unisrec")


def decide(data: PreparedDataset, model: str) -> list[dict[str, Any]]:
    """The decisions `seqrec train --model M` makes on `data`, on this machine, before training."""
    cfg = resolve({"model": {"name": model}})
    return (resolve_auto_train(cfg.model, cfg.train, cfg.data.max_len, data, torch.device("cpu"))
            + resolve_auto(cfg.model, data) + resolve_auto_data(cfg.data, data))


def row(name: str, data: PreparedDataset, models: list[str]) -> dict[str, Any]:
    print(name, flush=True)
    return {"dataset": name, "users": data.n_users, "items": data.n_items, "interactions": len(data.items),
            "decisions": {m: decide(data, m) for m in models}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="*", default=list(KNOWN_DATASETS))
    p.add_argument("--sizes", type=float, nargs="*", default=[1e6, 1e7], help="generated logs (interactions)")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS / "auto_decisions.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = [row(name, prepared(name), args.models) for name in args.datasets if (SHARED_DATA / name).is_dir()]
    with tempfile.TemporaryDirectory() as tmp:
        for n in map(int, args.sizes):
            shape = shape_for(n)
            data = prepare(generated_dataset(shape, f"generated-{n}"), PrepareOptions(), Path(tmp) / str(n))
            rows.append(row(f"generated, {n:,} interactions", data, args.models))
    command = " ".join(["python", "benchmarks/auto_decisions.py", *sys.argv[1:]])
    write_result(args.out, {"rows": rows, "threads": args.threads, "machine": machine(), "command": command})
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
