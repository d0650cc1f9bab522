"""UniSRec's training loss on large catalogues: the full softmax ("ce", the adaptor makes every item's vector
at every step) against the sampled softmax (model.loss = "sampled_softmax": the batch's targets and 1,024
popularity-drawn negatives with the logQ correction, the adaptor over those items only).

    speed    training targets/s of both losses, one after the other in one process, on amazon-games-2018
             (16,859 items, its titles through the packaged MiniLM) and on a generated catalogue of 100,000
             items (random text vectors, a log of 10 events per item): the median of
             `--repeats` timed runs of `--steps` steps each, after warm-up steps
    quality  `seqrec train` with the Scientific recipe (benchmarks/configs/unisrec-amazon-scientific-unisrec.toml,
             no refit, no history bias: the sampled loss has none) and each loss: validation-chosen test metrics

    python benchmarks/unisrec_sampled.py speed [--steps 10] [--repeats 3]
    python benchmarks/unisrec_sampled.py quality [--jobs 2]

Results: results/unisrec_sampled.json (each part kept when the other is run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, WORK, fresh_run, machine, prepared, write_result

from seqrec.config import resolve
from seqrec.data.batching import TrainBatches
from seqrec.data.dataset import PreparedDataset
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.data.synthetic import LogShape, generated_dataset
from seqrec.models.unisrec import UniSRec

OUT = RESULTS / "unisrec_sampled.json"
LOSSES = {"ce": [], "sampled_softmax": ['model.loss="sampled_softmax"', "model.n_negatives=1024"]}
CONFIG = ROOT / "benchmarks" / "configs" / "unisrec-amazon-scientific-unisrec.toml"


def targets_per_s(model: UniSRec, batches: TrainBatches, steps: int, warmup: int = 3) -> float:
    """Training targets per second over `steps` optimiser steps (forward, backward, Adam), after `warmup`."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model.train()
    it = iter(batches)
    done, t0 = 0, 0.0
    for step in range(warmup + steps):
        if step == warmup:
            done, t0 = 0, time.perf_counter()
        batch = next(it)
        loss = model.loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        done += int((batch.targets != 0).sum())
    return done / (time.perf_counter() - t0)


def speed(steps: int, repeats: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    rows = {}
    games = prepared("amazon-games-2018")
    catalogues: list[tuple[str, Any, torch.Tensor | None]] = [("amazon-games-2018", games, None)]
    for n_items in (100_000,):
        data = generated(n_items)
        catalogues.append((f"generated, {n_items:,} items asked", data, torch.randn(data.n_items + 1, 384)))
    for name, data, text in catalogues:
        times: dict[str, list[float]] = {loss: [] for loss in LOSSES}
        for r in range(repeats):
            for loss, sets in LOSSES.items():  # alternating, so that a slower spell of the machine hits both
                cfg = resolve({}, ["model.name=unisrec", "model.d=64", "model.history_bias=false", *sets])
                torch.manual_seed(r)
                model = (UniSRec.from_dataset(cfg.model, data, 50) if text is None
                         else UniSRec(cfg.model, data.n_items, 50, text_emb=text))
                model.fit_data(data)
                batches = TrainBatches(data, 50, 256, seed=r)
                times[loss].append(targets_per_s(model, batches, steps))
        row = {loss: statistics.median(v) for loss, v in times.items()}
        rows[name] = {"items": data.n_items, "targets_per_s": row, "each": times,
                      "speedup": row["sampled_softmax"] / row["ce"]}
        print(name, rows[name], flush=True)
    return {"setup": f"1 thread, batch 256, max_len 50, d 64, 8 experts; median of {repeats} runs of {steps} steps "
                     "after 3 warm-up steps, the two losses alternating", "rows": rows}


def generated(n_items: int) -> Any:
    """A generated log of 10 events per item (a user per 10 events, scale.py's shape), prepared once."""
    dest = WORK / "prepared" / f"unisrec-speed-{n_items}"
    if (dest / "meta.json").is_file():
        return PreparedDataset.load(dest)
    shape = LogShape(n_interactions=10 * n_items, n_users=n_items, n_items=n_items, seed=0)
    return prepare(generated_dataset(shape), PrepareOptions(), dest)


def quality(jobs: int) -> dict[str, Any]:
    data = prepared("amazon-scientific-unisrec")
    seqrec = str(ROOT / ".venv" / "bin" / "seqrec")

    def one(loss: str) -> dict[str, Any]:
        out = fresh_run(WORK / "runs" / f"unisrec-sampled-{loss}")
        cmd = [seqrec, "train", "--dataset", str(data.path), "--config", str(CONFIG), "--out", str(out),
               *(a for kv in [*LOSSES[loss], "model.history_bias=false", "train.refit=false", "train.progress=false",
                               "train.time_budget_s=2400"]
                 for a in ("--set", kv))]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        results = json.loads((out / "results.json").read_text())
        return {"loss": loss, "valid_ndcg@10": results["valid"]["ndcg@10"], "test": results["test"],
                "best_epoch": results["checkpoint"]["epoch"], "stopped_by": results.get("stopped_by"),
                "train_seconds": results["train_seconds"], "wall_s": time.perf_counter() - t0,
                "command": " ".join(cmd[1:]).replace(str(ROOT) + "/", "")}

    with ThreadPoolExecutor(jobs) as pool:
        rows = list(pool.map(one, LOSSES))
    return {"dataset": "amazon-scientific-unisrec", "config": str(CONFIG.relative_to(ROOT)),
            "protocol": "leave-one-out (the UniSRec split), full ranking, seen items not filtered, chosen on "
                        "validation NDCG@10, no refit, no history bias", "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=["speed", "quality"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    result[args.part] = speed(args.steps, args.repeats) if args.part == "speed" else quality(args.jobs)
    result[args.part]["machine"] = machine()
    result[args.part]["command"] = " ".join(["python", "benchmarks/unisrec_sampled.py", *sys.argv[1:]])
    write_result(args.out, result)
    print(f"-> {args.out}")


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
