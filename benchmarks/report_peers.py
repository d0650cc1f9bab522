"""The sections against other libraries: RecBole (SASRec speed, GRU4Rec and BERT4Rec) and gensim
(report.py renders them with the rest)."""

from __future__ import annotations

import json
from typing import Any

from tables import (
    DASH,
    f4,
    header,
    metric_cells,
    metric_row,
    num,
    row,
    seconds_or,
    section,
)

TIME_TO_BEST_GOAL = 30  # issue 18: time to RecBole's best validation NDCG@10 at most 1/30 of RecBole's


def speed(d: dict[str, Any]) -> list[str]:
    where = "same machine, RecBole's run reused" if d["runs"]["recbole"].get("reused") else "same machine, one run"
    lines = [f"## Speed: seqrec vs RecBole 1.2.1 SASRec on ml-100k ({where})", "",
             "Script: `benchmarks/speed_vs_recbole.py`; file: `results/speed_vs_recbole.json`. "
             f"Hyper-parameters: `{json.dumps(d['hyperparameters'])}`.", "",
             *header(["library", "best valid N@10", "test R@10", "test N@10", "test R@50", "test N@50", "wall s",
                      "CPU s", "peak RSS MB", "time to RecBole's best valid N@10"])]
    for name, r in d["runs"].items():
        t = r.get("test") or {}
        reach = r.get("time_to_reach_recbole_best_s", r.get("time_to_best_s"))
        # older files recorded the children's maximum RSS, not each process's own peak: not shown
        label = name + (" (earlier run, reused)" if r.get("reused") else "")
        label += f" (commit {r['machine']['commit']})" if r.get("machine", {}).get("commit") else ""
        lines.append(row([label, f4(r["best_valid_ndcg@10"]), *metric_cells(t), f"{r['wall_s']:.0f}",
                          f"{r['cpu_s']:.0f}", num(r.get("self_peak_rss_mb")), seconds_or(reach)]))
    if "recbole_epoch_cap" in d:
        lines += ["", f"RecBole was capped at {d['recbole_epoch_cap']} epochs (recorded in the file); its best "
                  "validation NDCG@10 is the best within the cap. A seqrec sample is a window of up to max_len "
                  "targets, a RecBole sample is one prefix (one target), so seqrec's batch sizes are given per run; "
                  "`stride` < 50 means overlapping windows that take the loss on their last `stride` targets."]
    if d.get("side_by_side"):
        lines += ["", "The libraries ran side by side, one thread each: RecBole on one core while the seqrec runs "
                  "went one after another on the other (and, once they were done, other single-thread jobs). The "
                  "machine is shared, so wall times are noisy; CPU seconds (user + sys of each process) are the "
                  "steadier comparison. `recbole-arch`: RecBole's SASRec layout (LayerNorm over item + position, "
                  "no √d scaling: `model.input_norm=true model.emb_scale=false`); `jitter`: the training windows' "
                  "boundaries are drawn afresh each epoch (`data.jitter=true`)."]
    if d["runs"]["recbole"].get("reused"):
        lines += ["", f"RecBole's run is an earlier one (commit {d['runs']['recbole']['reused_from']}), reused "
                  "(`--reuse-recbole`); the runs that name a commit ran later on the same machine, one thread each."]
    if d.get("over_seeds"):
        lines += ["", "Validation values are compared unrounded (RecBole's own are rounded to 4 decimals): a run shown "
                  "with the same 4-decimal value as RecBole's best can still fall short of it. `hist`: seqrec's "
                  "learned score offset for items already in the history (`model.history_bias`), which RecBole's "
                  "SASRec does not have; evaluation is the same (every item ranked, seen ones included). When wall "
                  "seconds are well above CPU seconds, other jobs shared the cores during the run."]
    for name, s in (d.get("over_seeds") or {}).items():
        med, worst = s["median_ratio_vs_recbole_time_to_best"], s["max_ratio_vs_recbole_time_to_best"]
        lines += ["", f"**{name}, over seeds {', '.join(s['seeds'])}**: {s['reached']} of {len(s['seeds'])} reach "
                  "RecBole's best validation NDCG@10; median time to it "
                  + ("not reached" if med is None else f"{med:.3f} × RecBole's time to its best")
                  + ("" if s["median_ratio_vs_recbole_total_wall"] is None
                     else f" ({s['median_ratio_vs_recbole_total_wall']:.3f} × RecBole's total wall time)")
                  + "; slowest seed " + ("never" if worst is None else f"{worst:.3f} ×")
                  + f"; goal: the median at most 1/{TIME_TO_BEST_GOAL} of RecBole's time to its best: "
                  + ("met." if med is not None and med <= 1 / TIME_TO_BEST_GOAL else "not met.")]
    for name, r in d["runs"].items():
        if r.get("ratio_vs_recbole_time_to_best") is not None and not d.get("over_seeds"):
            lines.append("")
            lines.append(f"{name}: reaches RecBole's best validation NDCG@10 in "
                         f"{r['ratio_vs_recbole_total_wall']:.3f} × RecBole's total wall time and "
                         f"{r['ratio_vs_recbole_time_to_best']:.3f} × the time RecBole took to reach it.")
    return lines


def _run_label(library: str, seed: str, r: dict[str, Any]) -> str:
    return library + (f" seed {seed}" if seed else "") + (" (earlier run, reused)" if r.get("reused") else "")


def _median_row(model: str, library: str, over: dict[str, Any], reach_cell: str) -> str:
    t = over["test"]
    return row([model, f"{library}, median of {len(over['seeds'])} seeds", DASH, DASH, *metric_cells(t),
                DASH, DASH, DASH, reach_cell])


def zoo_vs_recbole(d: dict[str, Any]) -> list[str]:
    lines = ["## GRU4Rec and BERT4Rec: seqrec vs RecBole 1.2.1 on ml-100k (same machine, same files)", "",
             "Script: `benchmarks/zoo_vs_recbole.py`; file: `results/zoo_vs_recbole.json` (hyper-parameters, "
             "protocol and commands inside). One thread each, one run after the other. RecBole's epochs are "
             "capped (column \"epochs\"): its best validation NDCG@10 is the best within the cap.", "",
             *header(["model", "library", "epochs (cap)", "best valid N@10", "test R@10", "test N@10", "test R@50",
                      "test N@50", "s / train epoch", "wall s", "peak RSS MB", "time to RecBole's best valid N@10"])]
    for model, entry in d.items():
        seeds = entry.get("seqrec_seeds") or {"": entry["seqrec"]}
        rb_seeds = entry.get("recbole_seeds") or {"": entry["recbole"]}
        libs = [(_run_label("recbole", k if len(rb_seeds) > 1 else "", r), r, True) for k, r in rb_seeds.items()]
        libs += [(_run_label("seqrec", k, r), r, False) for k, r in seeds.items()]
        for lib, r, is_rb in libs:
            t = r.get("test") or {}
            epochs = f"{r['epochs_run']} (cap {r['epoch_cap']})" if is_rb else f"{r['epochs_run']}"
            reach = r.get("time_to_best_s") if is_rb else r.get("time_to_reach_recbole_best_s")
            lines.append(row([model, lib, epochs, f4(r["best_valid_ndcg@10"]), *metric_cells(t),
                              num(r.get("mean_train_epoch_s"), 1), f"{r['wall_s']:.0f}",
                              num(r.get("self_peak_rss_mb")), seconds_or(reach)]))
        rb_over = entry.get("recbole_over_seeds")
        if rb_over and len(rb_over["seeds"]) > 1:
            lines.append(_median_row(model, "recbole", rb_over, DASH))
        over = entry.get("seqrec_over_seeds")
        if over and len(over["seeds"]) > 1:
            reach = over["median_time_to_reach_recbole_best_s"]
            lines.append(_median_row(model, "seqrec", over, f"{over['reached_recbole_best']} of {len(over['seeds'])} "
                                     "reach it; median " + ("never" if reach is None else f"{reach:.0f} s")))
    lines += ["", "seqrec overrides beyond the shared hyper-parameters are recorded per run in the file (`overrides`); "
              "`-hist` rows add seqrec's learned history bias (`model.history_bias`), which RecBole's models do not "
              "have; `-stride10` rows train on overlapping windows that take the loss on their last 10 targets, their "
              "boundaries drawn afresh each epoch (`data.stride=10 data.jitter=true`), so every target sees a long "
              "context, as each of RecBole's one-prefix samples does; `-long` rows also raise seqrec's patience "
              "(`train.patience`, 20 for GRU4Rec, 30 for BERT4Rec) and its training-time budget, both recorded; "
              "`-config` rows run seqrec from `configs/ml-100k-MODEL.toml` as shipped (the `-stride10-long` recipe) "
              "and RecBole with arguments derived from that file (`config` and `resolved_config` in each run); the "
              "other rows come from the script's earlier form, which passed every seqrec setting as an override "
              "(all recorded in `overrides`). "
              "seqrec runs once per seed; RecBole runs at seed 2020, and at more seeds where the table lists them "
              "(`--recbole-seeds`); \"time to RecBole's best\" is always to the best of its seed-2020 run. "
              "A row marked reused is the run of an earlier invocation with the same hyper-parameters (and, for "
              "RecBole, cap) on this machine (`--reuse-recbole`, and `--reuse-seqrec` for seqrec runs; its command "
              "recorded as `reused_from`)."]
    return lines


def item2vec_gensim(d: dict[str, Any]) -> list[str]:
    lines = section(
        "item2vec: seqrec vs gensim Word2Vec on the same sentences",
        "Script: `benchmarks/item2vec_vs_gensim.py`; file: `results/item2vec_vs_gensim.json`. Same "
        "hyper-parameters, user state and cosine scoring, one thread each, run one after the other in one "
        "process; gensim's epoch count chosen on validation. `seqrec` shares 64 negatives across a batch's pairs, "
        "`seqrec_per_pair` draws k per pair as word2vec does. `to gensim's valid`: seqrec's training seconds "
        "(evaluation excluded) until its validation NDCG@10 first reaches gensim's best.",
        ["dataset", "library", "R@10", "N@10", "R@50", "N@50", "train s", "s / epoch", "to gensim's valid"])
    for name, r in d.items():
        for lib in ("gensim", "seqrec", "seqrec_per_pair"):
            if lib not in r:
                continue
            x = r[lib]
            reach = x["train_seconds"] if lib == "gensim" else x.get("train_seconds_to_gensim_valid")
            lines.append(metric_row(f"{name} | {lib}", x["test"], [
                f"{x['train_seconds']:.1f}", num(x.get("seconds_per_epoch"), 2), seconds_or(reach, digits=1)]))
    return lines
