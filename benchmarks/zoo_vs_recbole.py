"""seqrec GRU4Rec and BERT4Rec against RecBole 1.2.1's on ml-100k, side by side, on this machine.

Same data (the RecBole atomic ml-100k files), same protocol (leave-one-out in time
order, full ranking, valid NDCG@10 for model choice, test read once, max length 50),
the same hyper-parameters for both libraries, one thread each. The seqrec side is
`seqrec train --config configs/ml-100k-MODEL.toml` (plus --seqrec-set overrides) and
RecBole's arguments are derived from that resolved config (`recbole_hp`: d, layers,
heads, inner size, dropout, mask ratio, last-item-only share = RecBole's ft_ratio,
lr, max length), so the shipped configs and the comparison cannot drift apart. Each
run is a fresh process, one after the other; the script records wall and CPU time,
peak RSS and the time at which seqrec's validation NDCG@10 first reaches RecBole's best.

RecBole trains on one prefix per sample and is slow on this CPU, so its epochs are
capped (--recbole-epochs, recorded in the file); its "best" is the best within the
cap, with RecBole's early stopping at 10 evaluations. RecBole runs at seed 2020, the
reference for the time to its best; --recbole-seeds adds runs at other seeds for the
spread of its test metrics. seqrec runs to the config's
early stopping or training-time budget (--seqrec-budget overrides it; recorded in
each run's config). A seqrec sample is a window of up to 50 targets, a RecBole
sample one prefix, so batch sizes are not comparable units.

    bash benchmarks/setup_recbole.sh   # or --recbole-python PATH to an existing one
    python benchmarks/zoo_vs_recbole.py --recbole-epochs GRU4Rec=5 BERT4Rec=3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT, SHARED_DATA, WORK, machine, write_result
from speed_vs_recbole import RECBOLE_PY, ml100k_recbole_files, reach_stat, time_to_reach, timed

from seqrec.config import RunConfig, load_toml, resolve

CONFIGS = {"GRU4Rec": ROOT / "configs" / "ml-100k-gru4rec.toml", "BERT4Rec": ROOT / "configs" / "ml-100k-bert4rec.toml"}
# what the configs do not carry: RecBole's seed, early stopping and batch size, and one thread for both libraries
FIXED = {"seed": 2020, "threads": 1, "stopping_step": 10, "train_batch_size": 256}


def plain(model: str) -> list[str]:
    """What keeps the seqrec side as plain as RecBole's model: no history bias ("auto" would turn it on)."""
    return ["model.history_bias=false"] if model == "GRU4Rec" else []


def seqrec_config(model: str, extra: list[str]) -> RunConfig:
    """The shipped config of `model` with the run's overrides: the one source of both libraries' settings."""
    return resolve(load_toml(CONFIGS[model]), [*plain(model), *extra])


def recbole_hp(model: str, cfg: RunConfig, seed: int = FIXED["seed"]) -> list[str]:
    """RecBole's arguments for the settings of the seqrec config `cfg`, so the two cannot drift apart."""
    m, t = cfg.model, cfg.train
    if getattr(m, "loss", None) != "ce" or getattr(m, "history_bias", False) is not False:
        raise SystemExit(f"{model}: RecBole trains plain full-softmax CE; the seqrec side must too")
    common = ["--lr", str(t.lr), "--max-len", str(cfg.data.max_len), "--seed", str(seed),
              "--threads", str(FIXED["threads"]), "--stopping-step", str(FIXED["stopping_step"]),
              "--train-batch-size", str(FIXED["train_batch_size"])]
    if model == "GRU4Rec":
        return [*common, "--hidden-size", str(m.d), "--model-set", f"embedding_size={m.d}",
                "--model-set", f"num_layers={m.n_layers}", "--model-set", f"dropout_prob={m.dropout}"]
    if getattr(m, "norm_first", False):
        raise SystemExit("BERT4Rec: RecBole's Transformer is post-LN; set model.norm_first=false")
    return [*common, "--n-layers", str(m.n_layers), "--n-heads", str(m.n_heads), "--hidden-size", str(m.d),
            "--inner-size", str(m.d_ff), "--hidden-dropout-prob", str(m.dropout),
            "--attn-dropout-prob", str(m.attn_dropout), "--model-set", f"mask_ratio={m.mask_prob}",
            "--model-set", f"ft_ratio={m.last_mask_share}"]


def run_recbole(model: str, out: Path, epochs: int, python: Path, cfg: RunConfig, seed: int) -> dict[str, Any]:
    """One RecBole run, summarised as a result row (test metrics, its best validation NDCG@10 and when)."""
    cmd = [str(python), "benchmarks/recbole_run.py", "--out", str(out), "--model", model,
           "--data-dir", str(SHARED_DATA / "ml-100k" / "recbole"), "--epochs", str(epochs),
           *recbole_hp(model, cfg, seed)]
    proc = timed(cmd, out.with_suffix(".log"))
    result = json.loads(out.read_text())
    epochs_seen = result["epochs"]
    best = max(e["valid_ndcg@10"] for e in epochs_seen)
    return {**proc, "seed": seed, "epoch_cap": epochs, "epochs_run": len(epochs_seen), "best_valid_ndcg@10": best,
            "time_to_best_s": min(e["elapsed_s"] for e in epochs_seen if e["valid_ndcg@10"] >= best),
            "mean_train_epoch_s": result.get("time_s", {}).get("mean_train_epoch"),
            "self_peak_rss_mb": result.get("memory", {}).get("peak_rss_mib"),
            "test": result.get("test"), "hyperparameters": result.get("hyperparameters"),
            "protocol": result.get("protocol")}


def run_seqrec(model: str, run_dir: Path, extra: list[str], budget: float | None) -> dict[str, Any]:
    """`seqrec train --config configs/ml-100k-MODEL.toml` on the RecBole files, one thread, with `extra`."""
    data_dir = ml100k_recbole_files().path
    sets = [f'data.dataset="{data_dir}"', f"train.threads={FIXED['threads']}", "train.progress=false",
            "eval.ks=[10, 50]", *([f"train.time_budget_s={budget}"] if budget is not None else []),
            *plain(model), *extra]
    cmd = [sys.executable, "-m", "seqrec.cli", "train", "--config", str(CONFIGS[model]), "--out", str(run_dir)]
    for s in sets:
        cmd += ["--set", s]
    proc = timed(cmd, run_dir.with_suffix(".log"))
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"process": proc, "result": json.loads((run_dir / "results.json").read_text()), "epochs": epochs,
            "config": str(CONFIGS[model].relative_to(ROOT)), "overrides": sets,
            "resolved_config": json.loads((run_dir / "config.json").read_text())}


def seqrec_row(model: str, run_dir: Path, extra: list[str], rb_best: float, budget: float | None) -> dict[str, Any]:
    sq = run_seqrec(model, run_dir, extra, budget)
    res = sq["result"]
    return {**sq["process"], "epochs_run": res["epochs_run"], "best_epoch": res["checkpoint"]["epoch"],
            "best_valid_ndcg@10": res["valid"]["ndcg@10"], "train_seconds": res["train_seconds"],
            "mean_train_epoch_s": sum(e["train_s"] for e in sq["epochs"]) / max(1, len(sq["epochs"])),
            "time_to_reach_recbole_best_s": time_to_reach(sq["epochs"], rb_best),
            "self_peak_rss_mb": res["peak_rss_mb"], "test": res["test"], "config": sq["config"],
            "overrides": sq["overrides"], "resolved_config": sq["resolved_config"],
            "protocol": res.get("protocol")}


def median_test(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The seeds and their median test metrics."""
    tests = [r["test"] for r in rows.values()]
    return {"seeds": list(rows), "test": {k: statistics.median(t[k] for t in tests) for k in tests[0]}}


def median_over_seeds(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Median test metrics over the seqrec seeds, and how many reached RecBole's best validation NDCG@10."""
    reach = [r["time_to_reach_recbole_best_s"] for r in rows.values()]
    return {**median_test(rows), "reached_recbole_best": sum(x is not None for x in reach),
            "median_time_to_reach_recbole_best_s": reach_stat(reach)}


def mark_reused(run: dict[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
    """`run`, from the row `earlier`, marked reused with the command that first produced it."""
    return {**run, "reused": True, "reused_from": run.get("reused_from", earlier.get("command"))}


def reused(earlier: dict[str, Any] | None, runs: str, seed: int) -> dict[str, Any] | None:
    """The run of `seed` in `earlier[runs]`, marked reused; None if absent."""
    done = (earlier or {}).get(runs, {}).get(str(seed))
    return mark_reused(done, earlier) if done and earlier else None


def compare(model: str, cap: int, python: Path, seeds: list[int], extra: list[str],
            earlier: dict[str, Any] | None = None, tag: str = "", budget: float | None = None,
            recbole_seeds: tuple[int, ...] = (), reuse_seqrec: bool = False) -> dict[str, Any]:
    """RecBole once (seed 2020: the time reference), then seqrec once per seed. `earlier`: a previous row of
    this model whose RecBole runs (same cap), and with `reuse_seqrec` its seqrec runs of the same seeds, are
    reused instead of run again, marked `reused` with the command that produced them. `recbole_seeds`: more
    RecBole runs, for the spread of its test metrics."""
    out_dir = WORK / "speed"
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = seqrec_config(model, extra)
    reusable = earlier if earlier is not None and earlier["recbole"]["epoch_cap"] == cap else None
    if reusable is not None:
        rb_row = mark_reused(reusable["recbole"], reusable)
        protocol = reusable.get("protocol")
    else:
        rb_row = run_recbole(model, out_dir / f"recbole-{model.lower()}.json", cap, python, cfg, FIXED["seed"])
        protocol = rb_row["protocol"]
    rb_seeds = {str(FIXED["seed"]): rb_row}
    for seed in (s for s in recbole_seeds if str(s) not in rb_seeds):
        done = reused(reusable, "recbole_seeds", seed)
        rb_seeds[str(seed)] = done or run_recbole(model, out_dir / f"recbole-{model.lower()}-seed{seed}.json", cap,
                                                  python, cfg, seed)
    rb_best = rb_row["best_valid_ndcg@10"]
    sq_rows = {str(seed): (reuse_seqrec and reused(reusable, "seqrec_seeds", seed))
               or seqrec_row(model, out_dir / f"seqrec-{model.lower()}{tag}-seed{seed}",
                             [*extra, f"train.seed={seed}"], rb_best, budget) for seed in seeds}
    first = sq_rows[str(seeds[0])]
    return {"model": model, "recbole": rb_row, "recbole_seeds": rb_seeds, "recbole_over_seeds": median_test(rb_seeds),
            "seqrec": first, "seqrec_seeds": sq_rows, "seqrec_over_seeds": median_over_seeds(sq_rows),
            "protocol": protocol, "seqrec_protocol": first.get("protocol")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--recbole-epochs", nargs="+", default=["GRU4Rec=5", "BERT4Rec=3"], metavar="MODEL=N",
                   help="models to compare and RecBole's epoch cap for each")
    p.add_argument("--recbole-python", type=Path, default=RECBOLE_PY)
    p.add_argument("--seqrec-seeds", default=str(FIXED["seed"]),
                   help="comma-separated seeds: seqrec runs once per seed (RecBole at seed 2020, see "
                        "--recbole-seeds); the report shows each and the median test metrics")
    p.add_argument("--recbole-seeds", default="",
                   help="comma-separated seeds of more RecBole runs (besides seed 2020, the time reference): the "
                        "report shows each and RecBole's median test metrics")
    p.add_argument("--reuse-recbole", nargs="?", const="", default=None, metavar="KEY",
                   help="reuse the RecBole run already in --out for a model when its epoch cap is the same "
                        "(marked `reused` in the file) instead of running it again; KEY: the row whose RecBole "
                        "run to reuse (default: the model's own row, e.g. GRU4Rec)")
    p.add_argument("--reuse-seqrec", action="store_true",
                   help="with --reuse-recbole: also reuse that row's seqrec runs of the same seeds (marked `reused`)")
    p.add_argument("--seqrec-budget", type=float, default=None,
                   help="seqrec's training-time budget per run, seconds (default: the config's; recorded in each "
                        "run's config)")
    p.add_argument("--tag", default="", help="suffix of the result key and run folders (e.g. -hist)")
    p.add_argument("--seqrec-set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra seqrec config overrides (recorded in each run's overrides)")
    p.add_argument("--out", type=Path, default=RESULTS / "zoo_vs_recbole.json")
    args = p.parse_args()
    table = json.loads(args.out.read_text()) if args.out.exists() else {}
    for spec in args.recbole_epochs:
        model, _, cap = spec.partition("=")
        row = compare(model, int(cap), args.recbole_python, [int(x) for x in args.seqrec_seeds.split(",")],
                      args.seqrec_set, None if args.reuse_recbole is None else table[args.reuse_recbole or model],
                      args.tag, args.seqrec_budget,
                      tuple(int(x) for x in args.recbole_seeds.split(",") if x), args.reuse_seqrec)
        row["command"] = " ".join(["python", "benchmarks/zoo_vs_recbole.py", *sys.argv[1:]])
        row["machine"] = machine()
        table = json.loads(args.out.read_text()) if args.out.exists() else {}  # runs may go side by side
        table[model + args.tag] = row
        write_result(args.out, table)
        print(json.dumps({k: row[k] for k in ("recbole", "seqrec")}, indent=1), flush=True)


if __name__ == "__main__":
    main()
