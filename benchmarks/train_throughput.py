"""Training throughput of `seqrec train --model sasrec` with no config: targets per second and the
achieved FLOP/s as a fraction of the matrix-product peak measured in the same run.

For each dataset and width d (d_ff = 4 d, everything else the model's defaults and the `auto`
decisions the data gets, as `fit` makes them), the library's own training step (seqrec.train.loop's
`setup`: model, optimiser, epoch feeder, weight average) runs a few warm-up steps and then `--steps`
timed ones, phase by phase: feeding the batch, forward and loss, backward, gradient clipping,
optimiser step, weight-average update. FLOPs per step are counted once by torch's FlopCounterMode
(the matrix products and attention of forward + backward; element-wise work is not counted, so
the fraction is of useful product work). Each row runs in float32 and under bf16 autocast; the
peak is a 4096² product in the same precision on the same threads, measured before and after the
rows (the median of both is used). `--recipes`: seqrec runs of benchmarks/speed_vs_recbole.py (the
plain recipe whose time to RecBole's best is reported there), measured the same way on its data;
`--unisrec`: UniSRec at its defaults (text from the dataset's encoder cache) on these datasets.
`--compare`: each row is measured a second time, right after, in the same process, with the code
the profile replaced patched back in (`reference_paths`): the speed-up of those changes.

    python benchmarks/train_throughput.py [--datasets ml-100k amazon-beauty-p5] [--dims 64 256] [--recipes R]
    python benchmarks/train_throughput.py --tiny          # generated data, for the test suite

Writes results/train_throughput.json (or --out).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, matmul_gflops, prepared, write_result
from speed_vs_recbole import SEQREC_RUNS, ml100k_recbole_files, seqrec_sets

from seqrec.config import resolve
from seqrec.data.dataset import PreparedDataset
from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.data.synthetic import LogShape, generated_dataset
from seqrec.nn.adaptors import PWLayer
from seqrec.nn.losses import CHUNK_ELEMENTS, full_ce, with_history
from seqrec.train.auto import resolve_auto, resolve_auto_data, resolve_auto_train
from seqrec.train.loop import setup, weight_average
from seqrec.train.sparse import clip_grad_norm

PHASES = ("feed", "forward", "backward", "clip", "optimizer", "average")


def config_for(d: int, data: PreparedDataset, precision: str, recipe: str | None = None
               ) -> tuple[Any, list[dict[str, Any]]]:
    """The default SASRec config at width d (or a seqrec run of benchmarks/speed_vs_recbole.py, its own d;
    or recipe "unisrec": UniSRec's defaults) with its `auto` decisions made for `data`, as `fit` makes
    them, and those decisions."""
    precision_sets = [f"train.threads={torch.get_num_threads()}", f"train.bf16={str(precision == 'bf16').lower()}"]
    if recipe == "unisrec":
        cfg = resolve({"model": {"name": "unisrec"}}, precision_sets)
    elif recipe is None:
        cfg = resolve({"model": {"name": "sasrec", "d": d, "d_ff": 4 * d}}, precision_sets)
    else:
        cfg = resolve({}, [*seqrec_sets(*SEQREC_RUNS[recipe]), *precision_sets])
    decisions = resolve_auto_train(cfg.model, cfg.train, cfg.data.max_len, data, torch.device("cpu"), None)
    decisions += resolve_auto(cfg.model, data, None) + resolve_auto_data(cfg.data, data)
    return cfg, decisions


def measure(data: PreparedDataset, d: int, precision: str, steps: int, warmup: int,
            recipe: str | None = None) -> dict[str, Any]:
    cfg, decisions = config_for(d, data, precision, recipe)
    device = torch.device("cpu")
    model, opt, batches, step = setup(cfg, data, device)
    ema = weight_average(model, cfg)
    model.train()
    feed = iter(batches)
    times, timed = [], []
    for i in range(warmup + steps):
        t = [time.perf_counter()]
        try:
            batch = next(feed)
        except StopIteration:  # a small dataset: the next epoch
            feed = iter(batches)
            batch = next(feed)
        t.append(time.perf_counter())
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.train.bf16):
            loss = step(batch)
        t.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t.append(time.perf_counter())
        if cfg.train.clip_grad > 0:
            clip_grad_norm(model.parameters(), cfg.train.clip_grad)
        t.append(time.perf_counter())
        opt.step()
        t.append(time.perf_counter())
        if ema is not None:
            ema.update(model)
        t.append(time.perf_counter())
        if i >= warmup:
            times.append([b - a for a, b in itertools.pairwise(t)])
            timed.append(batch)
    # the products of the same batches, counted afterwards (the counter slows what it watches)
    flops = 0
    for batch in timed:
        with FlopCounterMode(display=False) as counter:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.train.bf16):
                loss = step(batch)
            loss.backward()
        flops += counter.get_total_flops()
    opt.zero_grad(set_to_none=True)
    phases = {p: statistics.median(col) for p, col in zip(PHASES, zip(*times, strict=True), strict=True)}
    seconds = sum(map(sum, times))
    targets = sum(int((b.targets != 0).sum()) for b in timed)
    return {"config": recipe or "default", "model": cfg.model.name, "d": cfg.model.d, "precision": precision,
            "batch_size": cfg.train.batch_size, "loss": getattr(cfg.model, "loss", "ce"),
            "stride": cfg.data.stride, "history_bias": cfg.model.history_bias, "max_len": cfg.data.max_len,
            "items": data.n_items, "steps": steps, "median_phase_s": phases, "seconds": seconds,
            "targets": targets, "targets_per_s": targets / seconds,
            "gflop_per_step": flops / steps / 1e9, "gflop_per_s": flops / seconds / 1e9,
            "n_parameters": sum(p.numel() for p in model.parameters()),
            "auto": {x["key"]: x["value"] for x in decisions}}


# ---- the code the profile replaced (as of commit 0d88a4f), patched in to measure the same rows again ----

def _reference_keep_mask(shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype,
                         device: torch.device | str = "cpu") -> torch.Tensor:
    """A bool mask converted to `dtype`, then scaled."""
    cut = min(round(p * 256), 255)
    n = math.prod(shape)
    words = torch.randint(-(2**63), 2**63 - 1, ((n + 7) // 8,), dtype=torch.int64, device=device)
    return (words.view(torch.uint8)[:n].view(shape) >= cut).to(dtype) * (256 / (256 - cut))


def _reference_pw_forward(self: PWLayer, x: torch.Tensor) -> torch.Tensor:
    """(dropout(x) - b) W, the centred input materialised."""
    return self.lin(self.drop(x) - self.bias)


def _reference_full_ce(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, target: torch.Tensor,
                       chunk_elements: int = CHUNK_ELEMENTS,
                       history: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The dense path with the bias added after the product and the history through distinct items."""
    if h.shape[0] * (W.shape[0] - 1) > chunk_elements:  # the chunked path did not change
        return full_ce(h, W, b, target, chunk_elements, history)
    logits = h @ W[1:].T
    logits = (logits if b is None else logits + b[1:]).float()
    if history is None:
        return F.cross_entropy(logits, target - 1)
    lse, pos = torch.logsumexp(logits, dim=1), logits.gather(1, target[:, None] - 1).squeeze(1)
    lse, pos = with_history(lse, pos, target, *history)
    return (lse - pos).mean()


@contextlib.contextmanager
def reference_paths() -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch("seqrec.nn.dropout.keep_mask", _reference_keep_mask))
        stack.enter_context(mock.patch.object(PWLayer, "forward", _reference_pw_forward))
        for where in ("seqrec.nn.objective.full_ce", "seqrec.models.unisrec.full_ce"):
            stack.enter_context(mock.patch(where, _reference_full_ce))
        yield


def measure_both(data: PreparedDataset, d: int, precision: str, args: argparse.Namespace,
                 recipe: str | None = None) -> dict[str, Any]:
    """`measure` with today's code, then (`--compare`) with the replaced code, right after in the same process."""
    row = measure(data, d, precision, args.steps, args.warmup, recipe)
    if args.compare:
        with reference_paths():
            ref = measure(data, d, precision, args.steps, args.warmup, recipe)
        row["reference"] = {k: ref[k] for k in ("seconds", "targets", "targets_per_s", "median_phase_s")}
    print(row, flush=True)
    return row


def peaks(threads: int, n: int = 4096) -> dict[str, float]:
    """The n x n matmul peak in each precision (a smaller n in the tiny mode: its numbers are not reported)."""
    return {"float32": matmul_gflops(threads, n), "bf16": matmul_gflops(threads, n, dtype=torch.bfloat16)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="*", default=["ml-100k", "amazon-beauty-p5"])
    p.add_argument("--dims", type=int, nargs="+", default=[64, 256])
    p.add_argument("--precisions", nargs="+", default=["float32", "bf16"], choices=["float32", "bf16"])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--recipes", nargs="*", default=["seqrec-batch32-stride10-recbole-arch-jitter-p20"],
                   choices=sorted(SEQREC_RUNS), help="seqrec runs of speed_vs_recbole.py, on its ml-100k files")
    p.add_argument("--unisrec", nargs="*", default=["amazon-scientific-unisrec"],
                   help="datasets (with item text) for UniSRec rows at its defaults")
    p.add_argument("--compare", action="store_true",
                   help="measure each row again with the code the profile replaced (reference_paths), right after")
    p.add_argument("--tiny", action="store_true", help="a small generated log instead of --datasets")
    p.add_argument("--out", type=Path, default=RESULTS / "train_throughput.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    before = peaks(args.threads, 512 if args.tiny else 4096)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ["generated-tiny"] if args.tiny else args.datasets:
            if args.tiny:
                shape = LogShape(n_interactions=4000, n_users=300, n_items=200)
                data = prepare(generated_dataset(shape, name), PrepareOptions(), Path(tmp) / name)
            else:
                data = prepared(name)
            for d in args.dims:
                for precision in args.precisions:
                    rows.append({"dataset": name, **measure_both(data, d, precision, args)})
        for name in [] if args.tiny else args.unisrec:
            for precision in args.precisions:
                rows.append({"dataset": name, **measure_both(prepared(name), 0, precision, args, "unisrec")})
        for recipe in [] if args.tiny else args.recipes:
            for precision in args.precisions:
                rows.append({"dataset": "ml-100k (RecBole's files)",
                             **measure_both(ml100k_recbole_files(), 0, precision, args, recipe)})
    after = peaks(args.threads, 512 if args.tiny else 4096)
    peak = {k: statistics.median([before[k], after[k]]) for k in before}
    for r in rows:
        r["peak_gflop_per_s"] = peak[r["precision"]]
        r["fraction_of_peak"] = r["gflop_per_s"] / peak[r["precision"]]
    write_result(args.out, {"rows": rows, "peak_gflop_per_s": {"before": before, "after": after, "used": peak},
                            "threads": args.threads, "machine": machine(),
                            "command": " ".join(["python", "benchmarks/train_throughput.py", *sys.argv[1:]])})
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
