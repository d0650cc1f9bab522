"""seqrec SASRec against RecBole 1.2.1 SASRec on ml-100k, side by side, in one run.

Same data (the RecBole atomic ml-100k files), same protocol (leave-one-out in time
order, full ranking, valid NDCG@10 for model choice, test read once), same
hyper-parameters (2 layers, 2 heads, d=64, inner 256, dropout 0.2/0.2, post-LN, GELU,
lr 1e-3, max length 50, CE loss, patience 10, 1 thread each). Batch size: RecBole's 256
prefixes per step (one target each); seqrec's batch is a number of windows of up to 50
targets, so its batch sizes are listed per run, with the window stride (`data.stride`).
Each library runs in its own fresh process; with --parallel (the default) RecBole runs
on one core while the seqrec runs go one after another on the other, so both see the
same machine. The script records wall time, CPU time (user + sys) and peak RSS of each,
and the time at which seqrec's validation NDCG@10 first reaches RecBole's best.

    bash benchmarks/setup_recbole.sh
    python benchmarks/speed_vs_recbole.py            # writes benchmarks/results/speed_vs_recbole.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import PLAIN_TRAIN, RESULTS, ROOT, SHARED_DATA, WORK, machine, write_result

from seqrec.data.dataset import PreparedDataset

RECBOLE_PY = ROOT / "benchmarks" / ".venv-recbole" / "bin" / "python"
HP = {"n_layers": 2, "n_heads": 2, "d": 64, "d_ff": 256, "dropout": 0.2, "attn_dropout": 0.2, "lr": 1e-3,
      "batch_size": 256, "max_len": 50, "patience": 10, "epochs": 200, "seed": 2020, "threads": 1}


def timed(cmd: list[str], log: Path) -> dict[str, float]:
    """Run `cmd` to completion; wall seconds and CPU seconds (user + sys) of that child."""
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd[0]} failed; see {log}")
    # the peak RSS of each run is recorded by that process itself (resource usage of children is shared)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": usage.ru_utime + usage.ru_stime}


def run_recbole(out: Path, epochs: int) -> dict[str, Any]:
    cmd = [str(RECBOLE_PY), "benchmarks/recbole_run.py", "--out", str(out), "--model", "SASRec",
           "--data-dir", str(SHARED_DATA / "ml-100k" / "recbole"), "--n-layers", str(HP["n_layers"]),
           "--n-heads", str(HP["n_heads"]), "--hidden-size", str(HP["d"]), "--inner-size", str(HP["d_ff"]),
           "--hidden-dropout-prob", str(HP["dropout"]), "--attn-dropout-prob", str(HP["attn_dropout"]),
           "--lr", str(HP["lr"]), "--train-batch-size", str(HP["batch_size"]), "--epochs", str(epochs),
           "--stopping-step", str(HP["patience"]), "--seed", str(HP["seed"]), "--max-len", str(HP["max_len"]),
           "--threads", str(HP["threads"])]
    proc = timed(cmd, out.with_suffix(".log"))
    return {"process": proc, "result": json.loads(out.read_text())}


# seqrec runs: name -> (batch size in windows, window stride, extra overrides). "recbole-arch" is
# RecBole's SASRec layout (LayerNorm on item + position, no sqrt(d) scaling of the item embeddings);
# "jitter" draws the training windows' boundaries afresh each epoch (data.jitter).
RECBOLE_ARCH = ["model.input_norm=true", "model.emb_scale=false"]
SEQREC_RUNS: dict[str, tuple[int, int, list[str]]] = {
    "seqrec-batch64-stride0": (64, 0, []),
    "seqrec-batch64-stride0-recbole-arch-jitter": (64, 0, [*RECBOLE_ARCH, "data.jitter=true"]),
    "seqrec-batch64-stride10-recbole-arch-jitter": (64, 10, [*RECBOLE_ARCH, "data.jitter=true"]),
    # smaller batches: more optimiser steps per epoch (RecBole's 256 one-target samples take ~390 steps
    # per ml-100k epoch; 64 windows of 10 targets ~160, 16 windows ~620)
    "seqrec-batch16-stride10-recbole-arch-jitter": (16, 10, [*RECBOLE_ARCH, "data.jitter=true"]),
    "seqrec-batch32-stride10-recbole-arch-jitter": (32, 10, [*RECBOLE_ARCH, "data.jitter=true"]),
    # the same with patience 20: at batch 32 the validation curve is noisy, and patience 10 stopped a seed
    # before it peaked
    "seqrec-batch32-stride10-recbole-arch-jitter-p20": (32, 10, [*RECBOLE_ARCH, "data.jitter=true",
                                                                 "train.patience=20"]),
    # the same in bf16 autocast (train.bf16): the matrix products at the CPU's bf16 rate
    "seqrec-batch32-stride10-recbole-arch-jitter-p20-bf16": (32, 10, [*RECBOLE_ARCH, "data.jitter=true",
                                                                      "train.patience=20", "train.bf16=true"]),
    "seqrec-batch64-stride10-recbole-arch-jitter-seed2021": (64, 10, [*RECBOLE_ARCH, "data.jitter=true",
                                                                      "train.seed=2021"]),
    # + the learned history bias (seqrec.nn.history): a seqrec model option RecBole does not have
    "seqrec-batch64-stride10-recbole-arch-jitter-hist": (64, 10, [*RECBOLE_ARCH, "data.jitter=true",
                                                                  "model.history_bias=true"]),
    "seqrec-batch64-stride25": (64, 25, []),
    "seqrec-batch256-stride0": (256, 0, []),
}


def ml100k_recbole_files() -> PreparedDataset:
    """ml-100k prepared from RecBole's atomic files, the ones RecBole reads (prepared once)."""
    from seqrec.data.catalog import load_known
    from seqrec.data.prepare import PrepareOptions, prepare

    data_dir = WORK / "prepared" / "ml-100k-recbole-files"
    if (data_dir / "meta.json").is_file():
        return PreparedDataset.load(data_dir)
    return prepare(load_known("ml-100k", SHARED_DATA / "ml-100k" / "recbole"), PrepareOptions(), data_dir)


def run_seqrec(run_dir: Path, batch_size: int, stride: int, extra: list[str]) -> dict[str, Any]:
    data = ml100k_recbole_files()
    cmd = [sys.executable, "-m", "seqrec.cli", "train", "--out", str(run_dir), "--overwrite"]
    for s in [f'data.dataset="{data.path}"', *seqrec_sets(batch_size, stride, extra)]:
        cmd += ["--set", s]
    proc = timed(cmd, run_dir.with_suffix(".log"))
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"process": proc, "result": json.loads((run_dir / "results.json").read_text()), "epochs": epochs}


def seqrec_sets(batch_size: int, stride: int, extra: list[str]) -> list[str]:
    """The `--set` overrides of a seqrec run: RecBole's hyper-parameters, seqrec's batch and stride, `extra`."""
    return [*PLAIN_TRAIN, f"data.max_len={HP['max_len']}", "model.name=\"sasrec\"", "model.history_bias=false",
            f"model.d={HP['d']}", f"model.n_layers={HP['n_layers']}", f"model.n_heads={HP['n_heads']}",
            f"model.d_ff={HP['d_ff']}", f"model.dropout={HP['dropout']}", f"model.attn_dropout={HP['attn_dropout']}",
            "model.norm_first=false", "model.output_bias=false", f"train.lr={HP['lr']}",
            f"train.batch_size={batch_size}",
            f"data.stride={stride}",
            f"train.epochs={HP['epochs']}", f"train.patience={HP['patience']}", f"train.seed={HP['seed']}",
            f"train.threads={HP['threads']}", "train.progress=false", *extra]


def recbole_row(rb: dict[str, Any]) -> dict[str, Any]:
    """A RecBole run as a row: its best validation NDCG@10 (within the cap) and when it first got there."""
    epochs = rb["result"]["epochs"]
    best = max(e["valid_ndcg@10"] for e in epochs)
    return {**rb["process"], "best_valid_ndcg@10": best,
            "self_peak_rss_mb": rb["result"].get("memory", {}).get("peak_rss_mib"),
            "time_to_best_s": min(e["elapsed_s"] for e in epochs if e["valid_ndcg@10"] >= best),
            "epochs_run": len(epochs), "test": rb["result"].get("test"), "protocol": rb["result"].get("protocol"),
            "curve": [(e["elapsed_s"], e["valid_ndcg@10"]) for e in epochs]}


def reused_recbole(earlier: dict[str, Any] | None) -> dict[str, Any]:
    """The RecBole row of an earlier results file, marked reused with the commit that ran it."""
    assert earlier is not None
    row = earlier["runs"]["recbole"]
    return {**row, "reused": True, "reused_from": row.get("reused_from", earlier["machine"].get("commit"))}


def time_to_reach(epochs: list[dict[str, Any]], target: float) -> float | None:
    for row in epochs:
        if row.get("valid", {}).get("ndcg@10", -1.0) >= target:
            return float(row["elapsed_s"])
    return None


def reach_stat(times: list[float | None], pick: Any = statistics.median) -> float | None:
    """`pick` (median, max) of times where None means never reached, counted as infinitely slow;
    None again when the pick is never (JSON has no infinity)."""
    value = pick(math.inf if t is None else t for t in times)
    return None if math.isinf(value) else value


def over_seeds(rows: dict[str, Any], names: list[str], seeds: list[str]) -> dict[str, Any]:
    """Per seqrec run: how many seeds reached RecBole's best, and the median ratio of the time to reach it
    to RecBole's time to its best (a seed that never reached it counts as infinitely slow)."""
    out = {}
    for name in names:
        ratios = [rows[f"{name}-seed{seed}"]["ratio_vs_recbole_time_to_best"] for seed in seeds]
        walls = [rows[f"{name}-seed{seed}"]["ratio_vs_recbole_total_wall"] for seed in seeds]
        out[name] = {"seeds": seeds, "reached": sum(r is not None for r in ratios),
                     "median_ratio_vs_recbole_time_to_best": reach_stat(ratios),
                     "median_ratio_vs_recbole_total_wall": reach_stat(walls),
                     "max_ratio_vs_recbole_time_to_best": reach_stat(ratios, max)}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seqrec-runs", default="seqrec-batch64-stride0,seqrec-batch64-stride0-recbole-arch-jitter,"
                   "seqrec-batch64-stride10-recbole-arch-jitter,seqrec-batch64-stride10-recbole-arch-jitter-seed2021",
                   help=f"comma-separated names of seqrec runs, from {sorted(SEQREC_RUNS)}; a seqrec sample is a "
                        "window of up to max_len targets, a RecBole sample is one prefix (one target)")
    p.add_argument("--seeds", default="",
                   help="comma-separated seeds: every named seqrec run once per seed (named RUN-seedN), and the "
                        "median time to RecBole's best per run over the seeds")
    p.add_argument("--sequential", action="store_true", help="run RecBole first, then seqrec (default: side by side)")
    p.add_argument("--recbole-epochs", type=int, default=HP["epochs"],
                   help="cap RecBole's epochs (recorded); the target is then its best within the cap")
    p.add_argument("--reuse-recbole", action="store_true",
                   help="take RecBole's run from the results file (same epoch cap) instead of running it again; "
                        "marked reused")
    p.add_argument("--keep", action="store_true", help="keep the file's other seqrec runs (and their seed summaries)")
    args = p.parse_args()
    out_dir = WORK / "speed"
    out_dir.mkdir(parents=True, exist_ok=True)
    names = args.seqrec_runs.split(",")
    unknown = sorted(set(names) - set(SEQREC_RUNS))
    if unknown:
        raise SystemExit(f"unknown seqrec runs {unknown}; known: {sorted(SEQREC_RUNS)}")
    out = RESULTS / "speed_vs_recbole.json"
    earlier = json.loads(out.read_text()) if (args.reuse_recbole or args.keep) and out.is_file() else None
    if args.keep and not args.reuse_recbole:
        raise SystemExit("--keep needs --reuse-recbole: the kept runs are timed against the file's RecBole run")
    if args.reuse_recbole and (earlier is None or earlier.get("recbole_epoch_cap") != args.recbole_epochs):
        raise SystemExit(f"--reuse-recbole: {out} holds no RecBole run capped at {args.recbole_epochs} epochs")
    with ThreadPoolExecutor(max_workers=1) as pool:
        rb_future = None if args.reuse_recbole else pool.submit(run_recbole, out_dir / "recbole-sasrec.json",
                                                                args.recbole_epochs)
        if args.sequential and rb_future is not None:
            rb_future.result()
        plan = {name: SEQREC_RUNS[name] for name in names}
        if args.seeds:
            plan = {f"{name}-seed{seed}": (bs, st, [*extra, f"train.seed={seed}"])
                    for name, (bs, st, extra) in plan.items() for seed in args.seeds.split(",")}
        sq_runs = {name: (*cfg, run_seqrec(out_dir / name, *cfg)) for name, cfg in plan.items()}
        rb_row = recbole_row(rb_future.result()) if rb_future is not None else reused_recbole(earlier)
    rb_best, rb_best_at, rb_wall = rb_row["best_valid_ndcg@10"], rb_row["time_to_best_s"], rb_row["wall_s"]
    kept = {k: v for k, v in earlier["runs"].items() if k != "recbole"} if args.keep and earlier else {}
    rows: dict[str, Any] = {"recbole": rb_row, **kept}
    for name, (bs, st, extra, sq) in sq_runs.items():
        reach = time_to_reach(sq["epochs"], rb_best)
        rows[name] = {**sq["process"], "batch_size": bs, "stride": st, "overrides": extra,
                      "curve": [(e["elapsed_s"], e["valid"]["ndcg@10"]) for e in sq["epochs"]],
                      "self_peak_rss_mb": sq["result"]["peak_rss_mb"],
                      "best_valid_ndcg@10": sq["result"]["valid"]["ndcg@10"],
                      "epochs_run": sq["result"]["epochs_run"], "test": sq["result"]["test"],
                      "time_to_reach_recbole_best_s": reach,
                      "ratio_vs_recbole_total_wall": None if reach is None else reach / rb_wall,
                      "ratio_vs_recbole_time_to_best": None if reach is None else reach / rb_best_at,
                      "machine": machine()}
    summaries = {**((earlier or {}).get("over_seeds") or {} if args.keep else {}),
                 **(over_seeds(rows, names, args.seeds.split(",")) if args.seeds else {})}
    result = {"hyperparameters": HP, "recbole_epoch_cap": args.recbole_epochs, "over_seeds": summaries or None,
              "side_by_side": not args.sequential and not args.reuse_recbole,
              "protocol": rb_row.get("protocol") or (earlier or {}).get("protocol"), "runs": rows,
              "machine": machine(),
              "note": "elapsed times include per-epoch validation for both libraries"}
    write_result(out, result)
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
