"""Pre-training's in-batch loss over the batch's distinct items against the loss over every target's key.

`seqrec pretrain` (configs/pretrain.toml: every position predicts its next item, batch 256) scores each
target against the batch's distinct items, each once with its log count (`seqrec.nn.contrastive.
info_nce_items`). Before, it scored each target against every other target's key, an (M, M) matrix
for M targets, the same item's other rows masked (`dense_loss` below, the code it replaced). The two
are the same loss when the rows of one item share its key, as they do (`UniSRec.embed_items` runs the
adaptor once per distinct item of a call, dropout included).

For each domain, `--repeats` processes per variant, alternating (each with its own peak RSS), run the
recipe's step on the recipe's batches: `--warmup` steps, then `--steps` timed ones (median); the
process of median step time is kept. A third pass in one process
computes both losses and their gradients on the same batches, weights and random draws (training mode)
and records their largest differences.

    python benchmarks/pretrain_loss.py [--datasets ml-100k amazon-games-2018 yelp-p5] [--steps 8]
    python benchmarks/pretrain_loss.py --tiny        # generated data, for the test suite

Writes results/pretrain_loss.json (or --out).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, machine, prepared, write_result

from seqrec.config import load_toml
from seqrec.data.batching import TrainBatches
from seqrec.data.dataset import PreparedDataset
from seqrec.models.unisrec import UniSRec, UniSRecConfig
from seqrec.nn.contrastive import _with_history_candidates
from seqrec.train.device import peak_rss_mb
from seqrec.train.pretrain import PretrainConfig, Pretrainer, join_domains

VARIANTS = ("distinct items", "every target (before)")


def dense_loss(q: torch.Tensor, k: torch.Tensor, temperature: float, ids: torch.Tensor,
               history: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """The loss as it was: (M, M) logits against every target's key, the same item's other rows masked.
    Written here with the library's history candidates over M columns (each row its own item's column)."""
    logits = (q @ k.T).float() / temperature
    m = len(q)
    eye = torch.eye(m, dtype=torch.bool, device=q.device)
    logits = logits.masked_fill((ids[:, None] == ids[None, :]) & ~eye, -torch.inf)
    if history is not None:
        rows = torch.arange(m, device=q.device)
        logits, candidates, positive = _with_history_candidates(logits, ids, rows, *history, temperature)
        logits = torch.cat([logits + torch.diag(positive), candidates], dim=1)
    return F.cross_entropy(logits, torch.arange(m, device=q.device))


def dense_items(q: torch.Tensor, keys: torch.Tensor, items: torch.Tensor, column: torch.Tensor,
                temperature: float, history: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
                ) -> torch.Tensor:
    """`info_nce_items` as it was computed: each row its item's key, the (M, M) loss over them (what
    `Pretrainer.losses` calls, patched in for the "before" variant)."""
    return dense_loss(q, keys[column], temperature, items[column], history)


def variant_code(variant: str) -> contextlib.AbstractContextManager[Any]:
    """The pre-training step's item loss as the variant computes it."""
    if variant == VARIANTS[1]:
        return mock.patch("seqrec.train.pretrain.info_nce_items", dense_items)
    return contextlib.nullcontext()


def recipe(paths: list[str]) -> tuple[PretrainConfig, UniSRecConfig]:
    raw = load_toml(ROOT / "configs" / "pretrain.toml")
    model = {k: v for k, v in raw["model"].items() if k != "name"}
    pre = {**raw["pretrain"], "datasets": paths, "threads": 0, "progress": False}
    return PretrainConfig(**pre), UniSRecConfig(**model)


def setup_trainer(paths: list[str]) -> tuple[Pretrainer, torch.optim.Optimizer, TrainBatches]:
    cfg, model_cfg = recipe(paths)
    torch.manual_seed(cfg.seed)
    domains = join_domains([PreparedDataset.load(Path(p)) for p in paths], model_cfg)
    model = UniSRec(model_cfg, domains.data.n_items, cfg.max_len, domains.text)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    return Pretrainer(model, cfg, domains.text_word_drop), opt, TrainBatches(domains.data, cfg.max_len,
                                                                              cfg.batch_size, cfg.seed)


def endless(batches: TrainBatches) -> Iterator[Any]:
    """Epoch after epoch (a small domain has fewer batches than the steps timed)."""
    while True:
        yield from batches


def time_variant(paths: list[str], variant: str, warmup: int, steps: int) -> dict[str, Any]:
    """One variant's median step time and this process's peak RSS (run in a process of its own)."""
    trainer, opt, batches = setup_trainer(paths)
    times, targets, distinct = [], [], []
    with variant_code(variant):
        for i, batch in enumerate(endless(batches)):
            if i == warmup + steps:
                break
            t0 = time.perf_counter()
            si, ss = trainer.losses(batch)
            loss = si + trainer.cfg.lam * ss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
                keep = batch.targets != 0
                targets.append(int(keep.sum()))
                distinct.append(int(torch.unique(batch.targets[keep]).numel()))
    return {"step_ms": 1000 * statistics.median(times), "targets_per_batch": statistics.median(targets),
            "distinct_items_per_batch": statistics.median(distinct),
            "peak_rss_mb": peak_rss_mb()}


def differences(paths: list[str], batches_n: int) -> dict[str, float]:
    """The largest |distinct-items - every-target| difference of the losses and of their gradients (relative
    to the largest gradient entry) over the first batches: same weights, training mode (dropout, item drop)
    with the random state reset between the two, so both see the same draws."""
    trainer, _, batches = setup_trainer(paths)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    worst = {"loss": 0.0, "gradient": 0.0}
    for i, batch in enumerate(endless(batches)):
        if i == batches_n:
            break
        state = torch.random.get_rng_state()
        got = []
        for variant in VARIANTS:
            torch.random.set_rng_state(state)
            with variant_code(variant):
                si, ss = trainer.losses(batch)
            loss = si + trainer.cfg.lam * ss
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            got.append((loss.item(), torch.cat([torch.zeros(p.numel()) if g is None else g.flatten()
                                                for p, g in zip(params, grads, strict=True)])))
        (new, g_new), (old, g_old) = got
        worst["loss"] = max(worst["loss"], abs(new - old))
        scale = float(g_old.abs().max()) or 1.0
        worst["gradient"] = max(worst["gradient"], float((g_new - g_old).abs().max()) / scale)
    return worst


def tiny_paths(folder: Path) -> list[str]:
    from seqrec.data.prepare import PrepareOptions, prepare
    from seqrec.data.synthetic import LogShape, generated_dataset

    shape = LogShape(n_interactions=1200, n_users=40, n_items=60, seed=3)  # items' text: "item <id>"
    data = prepare(generated_dataset(shape), PrepareOptions(), folder / "tiny")
    return [str(data.path)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", nargs="+", default=["ml-100k", "amazon-games-2018", "yelp-p5"])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="processes per variant, alternating")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS / "pretrain_loss.json")
    ap.add_argument("--child", nargs=2, metavar=("PATHS_JSON", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(time_variant(json.loads(args.child[0]), args.child[1], args.warmup, args.steps)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        domains = {"generated": tiny_paths(Path(scratch))} if args.tiny else {
            name: [str(prepared(name).path)] for name in args.datasets}
        for name, paths in domains.items():
            row: dict[str, Any] = {"domain": name}
            measured: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
            for _ in range(args.repeats):  # the variants alternate: a slow spell of the machine hits both
                for variant in VARIANTS:
                    cmd = [sys.executable, __file__, "--child", json.dumps(paths), variant, "--warmup",
                           str(args.warmup), "--steps", str(args.steps)]
                    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                    measured[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
                    print(name, variant, measured[variant][-1], flush=True)
            for variant, runs in measured.items():  # the process of median step time, and every one's
                row[variant] = {**sorted(runs, key=lambda r: r["step_ms"])[len(runs) // 2],
                                "step_ms_runs": [r["step_ms"] for r in runs]}
            row["speed_up"] = row[VARIANTS[1]]["step_ms"] / row[VARIANTS[0]]["step_ms"]
            diff = differences(paths, 3)
            row["max_loss_difference"], row["max_gradient_difference"] = diff["loss"], diff["gradient"]
            rows.append(row)
    cfg, model_cfg = recipe([])
    write_result(args.out, {
        "machine": machine(), "tiny": args.tiny, "threads": torch.get_num_threads(),
        "recipe": {"pretrain": dataclasses.asdict(cfg) | {"datasets": "each domain alone"},
                   "model": dataclasses.asdict(model_cfg)},
        "setup": f"configs/pretrain.toml's step on each domain alone, {args.warmup} warm-up + {args.steps} timed "
                 f"steps (median), in {args.repeats} processes per variant, alternating (the one of median step "
                 "time kept; its peak RSS its own)",
        "command": "python benchmarks/pretrain_loss.py " + " ".join(sys.argv[1:]),
        "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
