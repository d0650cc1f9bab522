"""Render the results pages from the JSON files the benchmark scripts wrote.

No number on these pages is typed by hand: each table reads one results file.

    benchmarks/RESULTS.md   every benchmark
    docs/results.md         the quality, speed and serving results, every configuration tried
    README.md               a headline table of the picked runs, between the results markers

    python benchmarks/report.py

Sections, by what they measure: quality against published numbers (SASRec, UniSRec, the model zoo,
losses, side features, the output layer, positions), speed against other libraries (RecBole, gensim),
cost (evaluation, serving, retrieval, text encoding) and transfer (data efficiency). Table and number
formats are in `tables.py`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT
from common import load_result as load
from report_cost import eval_cost, scale, train_throughput
from tables import (
    DASH,
    f4,
    header,
    history_bias,
    loss_name,
    mean_std,
    metric_cells,
    metric_row,
    num,
    row,
    run_cells,
    seconds_or,
    section,
    table,
    value_range,
    yes,
)

OUT = ROOT / "benchmarks" / "RESULTS.md"
DOCS = ROOT / "docs" / "results.md"
README = ROOT / "README.md"


# ---- quality against published numbers and between variants --------------------------------------

PROTOCOL_STATED_UNFILTERED = {"amazon-scientific-unisrec"}


def meets(test: dict[str, float], published: dict[str, Any]) -> str:
    if not test:
        return DASH
    return "yes" if all(test[k] >= v for k, v in published.items() if k != "source") else "no"


def sasrec_quality(d: dict[str, Any]) -> list[str]:
    # several configurations were tried per dataset: the fair one to hold against a published number is
    # the one validation picks among them, not the one with the best test numbers; runs with the learned
    # history bias (a seqrec option) are picked among themselves, so plain SASRec keeps its own pick
    best_valid: dict[tuple[str, bool], float] = {}
    for r in d.values():
        group = (r["dataset"], history_bias(r))
        best_valid[group] = max(best_valid.get(group, -1.0), r["valid"]["ndcg@10"])
    lines = ["## SASRec quality against the strongest published numbers", "",
             "Leave-one-out, full ranking over all items, max length 50, chosen on validation NDCG@10, "
             "seen items not filtered. `refit`: the tested model was trained again from scratch on training + "
             "validation events for the validation-chosen number of epochs (`train.refit`). `weight avg`: the decay "
             "of the running average of the weights that was validated and tested (`train.ema`; blank = off); "
             "its warm-up caps the decay at (1 + t) / (10 + t) after t updates, which passes 0.997 only after "
             "about 3,000 updates, so in runs shorter than that (Sports: about 280 updates an epoch, best epoch "
             "4) 0.997 and 0.999 give the same average and the same numbers. "
             "The `seen filtered` "
             "columns rank the same model's test users with already-seen items removed: the Amazon P5 builds "
             "hold no repeated item, so that filter only removes wrong answers, and RecTools (which the eSASRec "
             "benchmark uses) can filter viewed items when it recommends; which protocol the published "
             "Beauty/Sports numbers used is not stated, so both are shown, each with its own `meets`. "
             "`history bias`: the model has seqrec's learned score offset for items already in the history "
             "(`model.history_bias`, see Training); the evaluation is unchanged (every item ranked, seen ones "
             "included), but on these builds, which hold no repeated item, the offset learns to push seen items "
             "down, much as the seen-item filter does, so those rows are a different model from the published "
             "SASRec and are picked separately. "
             "Every configuration tried is listed; `valid N@10` is the validation-chosen checkpoint's (before "
             "any refit), and `picked` marks, per dataset (and with or without the history bias), the run that "
             "validation would choose among them: that row, not the best test row, is the fair comparison with "
             "a published number. "
             "Script: `benchmarks/sasrec_quality.py`; files: `results/sasrec_quality*.json`.", "",
             *header(["run", "history bias", "refit", "weight avg", "valid N@10", "picked", "R@10", "N@10", "R@50",
                      "N@50", "published R@10 / N@10", "meets", "seen filtered R@10", "seen filtered N@10",
                      "meets (seen filtered)", "best epoch", "train s"])]
    rows = sorted(d.items(), key=lambda kv: (kv[1]["dataset"], history_bias(kv[1])))  # stable otherwise
    picked_keys = {key for key, r in rows if r["valid"]["ndcg@10"] == best_valid[(r["dataset"], history_bias(r))]}
    for key, r in rows:
        t, pub, sf = r["test"], r["published"], r.get("test_seen_filtered", {})
        refit = "yes" if r["protocol"].get("refit") else "no"
        ema = r["config"]["train"].get("ema") or ""
        hist = history_bias(r)
        picked = "yes" if key in picked_keys else ""
        # the UniSRec paper states its protocol (seen items not filtered): no filtered comparison there
        meets_filtered = "n/a" if r["dataset"] in PROTOCOL_STATED_UNFILTERED else meets(sf, pub)
        lines.append(f"| {key} | {'yes' if hist else ''} | {refit} | {ema} | {f4(r['valid']['ndcg@10'])} | {picked} | "
                     f"{f4(t['recall@10'])} | {f4(t['ndcg@10'])} | {f4(t['recall@50'])} | "
                     f"{f4(t['ndcg@50'])} | {f4(pub.get('recall@10'))} / {f4(pub.get('ndcg@10'))} "
                     f"({pub.get('source', '')}) | {meets(t, pub)} | {f4(sf.get('recall@10'))} | "
                     f"{f4(sf.get('ndcg@10'))} | {meets_filtered} | {r['best_epoch']} | {r['train_seconds']:.0f} |")
    lines += ["", "The picked runs, each reproduced by (`--tag` names the run; the base settings are "
              "`benchmarks/configs/sasrec-DATASET.toml`, and each run's file holds its full resolved config):", ""]
    for key, r in rows:
        if key in picked_keys:
            words = ["python", "benchmarks/sasrec_quality.py", r["dataset"],
                     *(f"--set {shlex.quote(o)}" for o in r["overrides"]), f"--tag={key.removeprefix(r['dataset'])}"]
            lines.append(f"- `{key}`: `{' '.join(words)}`")
    return lines


def unisrec(d: dict[str, Any]) -> list[str]:
    lines = ["## UniSRec on the Scientific files", "", "Script: `benchmarks/unisrec_runs.sh` + "
             "`benchmarks/unisrec_report.py`; file: `results/unisrec.json` (each entry records its command). "
             "Leave-one-out (the UniSRec split), full ranking, max length 50, chosen on validation NDCG@10; "
             "`refit`: trained again on training + validation events for the chosen epoch count before the "
             "test. d=64 (the paper: 300); text from all-MiniLM-L6-v2 (the paper: BERT-base); pre-training on "
             "yelp-p5 + ml-100k (the paper: five Amazon domains). `valid N@10`: the validation-chosen model's "
             "(before any refit); several recipes were tried, so compare recipes on it, not on the test columns. "
             "`unisrec-text-then-id*`: two stages on the domain's own training events, text only "
             "(`unisrec-scratch-text-norefit`), then text + ID starting from it with every weight trained. "
             "`*-hist`: the same with seqrec's learned score offset for items already in the history "
             "(`model.history_bias`); the evaluation is unchanged (seen items stay in the ranking), but this "
             "Amazon build holds no repeated item, so the offset learns to push them down, much as a seen-item "
             "filter would: a seqrec addition, not part of the paper's model.", "",
             *header(["run", "refit", "valid N@10", "R@10", "N@10", "R@50", "N@50", "published (R@10 / N@10)",
                      "best epoch", "train s"])]
    for key, r in d.get("quality", {}).items():
        pub = r.get("published") or {}
        lines.append(metric_row(f"{key} | {'yes' if r.get('refit') else 'no'} | {f4(r.get('valid_ndcg@10'))}",
                                 r["test"],
                                 [f"{f4(pub.get('recall@10'))} / {f4(pub.get('ndcg@10'))}",
                                  str(r.get("best_epoch", "")), f"{r.get('train_seconds', 0):.0f}"]))
    cold = {k: v for k, v in d.get("cold", {}).items() if k != "split"}
    if cold:
        lines += ["", "Cold items: a split whose test targets (20% of the test-target items) never occur before "
                  "the test; metrics by target kind.", "",
                  *header(["run", "cold users", "cold R@10", "cold N@10", "cold R@50", "warm R@10", "warm N@10",
                           "all N@10"])]
        for key, r in cold.items():
            c, w = r["cold"], r["warm"]
            lines.append(f"| {key} | {r['n_cold']} | {c['recall@10']:.4f} | {c['ndcg@10']:.4f} | "
                         f"{c['recall@50']:.4f} | {w['recall@10']:.4f} | {w['ndcg@10']:.4f} | "
                         f"{r['all']['ndcg@10']:.4f} |")
        lines += _cold_goal(cold)
    pre = d.get("pretraining", {})
    if pre:
        lines += ["", "Pre-training throughput and peak memory (process RSS), one CPU thread.", "",
                  *header(["run", "negatives", "batch", "queue", "positions", "steps", "epochs", "sequences/s",
                           "targets/s", "final loss", "peak RSS MB"])]
        for key, r in pre.items():
            lines.append(f"| {key} | {r['negatives']} | {r['batch_size']} | "
                         f"{r['queue_size'] if r['negatives'] == 'moco' else '–'} | {r['positions']} | {r['steps']} | "
                         f"{r['epochs_run']} | {r['sequences_per_s']:.0f} | {r['targets_per_s']:.0f} | "
                         f"{r['final_loss']:.3f} | {r['peak_rss_mb']:.0f} |")
    enc = d.get("text_encoding", {})
    if enc:
        lines += ["", "Text encoding when each cache was first built (frozen encoder, both views: original and "
                  "word-dropped; the machine was shared with other runs; `benchmarks/text_encode.py` measures "
                  "it on its own).", "",
                  *header(["dataset/cache key", "encoder", "items", "views", "seconds", "texts/s"])]
        for key, r in enc.items():
            lines.append(f"| {key} | {r['encoder']} | {r['items']} | {r['views']} | {r['seconds']:.0f} | "
                         f"{r['texts_per_s']:.0f} |")
    return lines


ZOO_DATASETS = ["ml-100k", "amazon-beauty-p5", "amazon-sports-p5", "amazon-scientific-unisrec", "yelp-p5"]


ZOO_MODELS = ["item2vec", "gru4rec", "sasrec", "bert4rec", "unisrec"]


def zoo(d: dict[str, Any]) -> list[str]:
    lines = ["## Model zoo", "", "Script: `benchmarks/zoo.py` (settings per dataset and model in its `DATASETS` and "
             "`MODELS`); file: `results/zoo.json` (each entry records its command and full config). Leave-one-out, "
             "full ranking over all items, seen items not filtered, model chosen on validation NDCG@10 "
             "(patience 5; BERT4Rec 20), one thread on a shared 2-core CPU; \"budget\" marks a cell stopped by "
             "its training-time budget. UniSRec here is text only, from scratch, and runs where items have "
             "real text (not Beauty or Sports, whose item text is generated ids). "
             "Peak RSS is the cell's own process. Tags: `-long`, a 420 s (ml-100k) or 900 s budget instead of "
             "the dataset's; `-recipe`, max length 50 with overlapping windows drawn afresh each epoch "
             "(`data.stride=10 data.jitter=true`; for SASRec RecBole's layout too), as in "
             "configs/ml-100k-*.toml (patience and budget may differ); `-hist`, the learned history bias; "
             "`-p10`, patience 10; the overrides are in each entry.", "",
             *header(["dataset", "model", "R@10", "N@10", "R@50", "N@50", "loss", "max len", "best / run epochs",
                      "train s", "peak RSS MB"])]
    order = {(ds, m): i for i, (ds, m) in enumerate((ds, m) for ds in ZOO_DATASETS for m in ZOO_MODELS)}
    keys = sorted((k for k in d if "test" in d[k]),
                  key=lambda k: (order.get((d[k]["dataset"], d[k]["model"]), len(order)), k))
    for key in keys:
        r = d[key]
        cfg = r.get("config", {})
        name = r["model"] + key.split("/", 1)[-1].removeprefix(r["model"])  # the model and the run's tag
        lines.append(metric_row(f"{r['dataset']} | {name}", r["test"],
                                 [loss_name(cfg.get("model", {})), str(cfg.get("data", {}).get("max_len", "")),
                                  *run_cells(r)]))
    return lines


def losses(d: dict[str, Any]) -> list[str]:
    lines = ["## SASRec losses", "", "Script: `benchmarks/loss_compare.py`; file: `results/loss_compare.json` "
             "(each entry records its command and full config). One small SASRec (d 64, 1 block, 1 head, d_ff 64, "
             "dropout 0.2, lr 1e-3, batch 128, max length 50), only the loss changed; leave-one-out, full ranking, "
             "chosen on validation NDCG@10 (patience 10), one thread, the same training-time budget per loss "
             "(\"budget\" marks a run it stopped). gBCE and BCE with k > 1 shift every logit by log(beta/k) "
             "(see `seqrec/nn/losses.py`).", "",
             *header(["run", "R@10", "N@10", "R@50", "N@50", "loss", "best / run epochs", "train s", "peak RSS MB"])]
    for key, r in d.items():
        if "test" in r:
            lines.append(metric_row(key, r["test"], [loss_name(r["config"]["model"]), *run_cells(r)]))
    return lines


def _summary_table(d: dict[str, Any]) -> list[str]:
    lines = [*header(["dataset / model / variant", "seeds", "R@10", "N@10", "R@50", "N@50", "parameters",
                      "runs stopped by budget"])]
    for key, cell in d["summary"].items():
        metrics = [mean_std(cell, m) for m in ("recall@10", "ndcg@10", "recall@50", "ndcg@50")]
        lines.append(f"| {key} | {len(cell['seeds'])} | " + " | ".join(metrics)
                     + f" | {cell['n_parameters']:,} | {cell['stopped_by_budget']}/{len(cell['seeds'])} |")
    return lines


def features(d: dict[str, Any]) -> list[str]:
    commands = sorted({r["command"] for r in d["runs"].values()})
    return ["## Side features: none vs soft one-hot vs linear vs bucketised", "",
            "Script: `benchmarks/features.py features`; file: `results/features.json` (every run, its config "
            "and command). Test metrics, mean ± sample std over seeds. ml-100k: time gap (log1p), release year "
            "(continuous, the variant's encoding) and genres (multi-valued embedding); diginetica-sample: time "
            "gap. d=64, one block (SASRec) or one GRU layer, full CE, patience 5, and a training-time budget per "
            "run, equal for every variant of a (dataset, model) pair. Commands: "
            + "; ".join(f"`{c}`" for c in commands), "",
            *_summary_table(d)]


def output_layer(d: dict[str, Any]) -> list[str]:
    commands = sorted({r["command"] for r in d["runs"].values()})
    return ["## Output layer: tied + bias vs tied vs untied (SASRec)", "",
            "Script: `benchmarks/features.py output`; file: `results/output_layer.json`. d=64, one block, full CE, "
            "patience 5, equal training-time budget per run. Commands: " + "; ".join(f"`{c}`" for c in commands), "",
            *_summary_table(d)]


def positions(d: dict[str, Any]) -> list[str]:
    lines = ["## Positions from the end or from the start (SASRec, ml-100k demo recipe)", "",
             f"`{d['config']}` with `model.positions_from` end (default) or start (sessions can keep a KV cache), "
             "one thread, no time budget; leave-one-out, full ranking, chosen on validation NDCG@10. "
             "Script: `benchmarks/positions.py`; file: `results/positions.json`.", "",
             *header(["positions from", "seed", "valid N@10", "test R@10", "test N@10", "test R@50", "test N@50",
                      "best epoch"])]
    for r in sorted(d["runs"], key=lambda r: (r["align"], r["seed"])):
        lines.append(f"| {r['align']} | {r['seed']} | {r['valid_ndcg@10']:.4f} | {r['test_recall@10']:.4f} | "
                     f"{r['test_ndcg@10']:.4f} | {r['test_recall@50']:.4f} | {r['test_ndcg@50']:.4f} | "
                     f"{r['best_epoch']} |")
    for align, m in d["median"].items():
        lines.append(f"| {align}, median | | {m['valid_ndcg@10']:.4f} | {m['test_recall@10']:.4f} | "
                     f"{m['test_ndcg@10']:.4f} | | {m['test_ndcg@50']:.4f} | |")
    return lines


# ---- speed and quality against other libraries (RecBole, gensim) ---------------------------------

def speed(d: dict[str, Any]) -> list[str]:
    lines = ["## Speed: seqrec vs RecBole 1.2.1 SASRec on ml-100k (same machine, one run)", "",
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
                  + "; slowest seed " + ("never" if worst is None else f"{worst:.3f} ×") + "."]
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


# ---- cost: evaluation, serving, retrieval, text encoding -----------------------------------------

COLD_BASELINE = "unisrec-cold20-scratch-text"  # the best cold-item run when issue 17 set its goal (2x)


def _cold_goal(cold: dict[str, Any]) -> list[str]:
    """The cold-item goal against the baseline run, and what leaving untrained items out of the
    training softmax changed (the two runs that differ only in model.softmax_items)."""
    if COLD_BASELINE not in cold or not cold[COLD_BASELINE]["cold"]["recall@50"]:
        return []
    base = cold[COLD_BASELINE]["cold"]["recall@50"]
    best_key = max(cold, key=lambda k: cold[k]["cold"]["recall@50"])
    best = cold[best_key]["cold"]["recall@50"]
    out = ["", f"Goal: cold R@50 at least twice that of {COLD_BASELINE} ({base:.4f}), i.e. {2 * base:.4f}; best "
               f"{best_key} {best:.4f} ({best / base:.2f}×): {'met' if best >= 2 * base else 'not met'}."]
    pair = [cold.get(f"unisrec-cold20-pretrained-hist-inductive-softmax-{w}") for w in ("all", "trained")]
    if all(pair):
        a, t = pair
        out[-1] += (f" The same fine-tuning with the items that have no training event left out of the training "
                    f"softmax (softmax-trained against softmax-all) moves cold R@50 from {a['cold']['recall@50']:.4f}"
                    f" to {t['cold']['recall@50']:.4f} and cold N@10 from {a['cold']['ndcg@10']:.4f} to "
                    f"{t['cold']['ndcg@10']:.4f}, while warm N@10 goes from {a['warm']['ndcg@10']:.4f} to "
                    f"{t['warm']['ndcg@10']:.4f}"
                    + (": a trade, for catalogues whose new items must be found (so not the default)."
                       if t["warm"]["ndcg@10"] < a["warm"]["ndcg@10"] else "."))
    return out


SERVE_GOAL = {"p50_ms": 5.0, "p99_ms": 25.0, "requests_per_s": 500.0}  # issue 16, at concurrency 8


def _serve_goal_met(r: dict[str, Any] | None) -> bool:
    return (r is not None and r["failed"] == 0 and r["p50_ms"] < SERVE_GOAL["p50_ms"]
            and r["p99_ms"] < SERVE_GOAL["p99_ms"] and r["requests_per_s"] >= SERVE_GOAL["requests_per_s"])


def serve_load(d: dict[str, Any]) -> list[str]:
    rec, live, sess = d["recommend"], d["live"], d["sessions"]
    lines = ["## Serving: `seqrec serve` under load (loopback, this machine)", "",
             f"{d['n_items']:,}-item catalogue; `seqrec serve` with 1 torch thread, top-10 from the index named in "
             "each row (the sessions use the exact one); a loopback load generator "
             "(`benchmarks/loadgen.py`) on the other core. Random weights (latency does not depend on them). "
             "Script: `benchmarks/serve_load.py`; file: `results/serve_load.json`.", "",
             *header(["POST /recommend: index", "concurrency", "requests", "failed", "requests/s", "p50 ms", "p90 ms",
                      "p99 ms"])]
    for index, rows in rec.items():
        for c, r in rows.items():
            lines.append(f"| {index} | {c} | {r['requests']:,} | {r['failed']} | {r['requests_per_s']:.0f} | "
                         f"{r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} |")
    met = [index for index, rows in rec.items() if _serve_goal_met(rows.get("8"))]
    lines += ["", f"Goal at concurrency 8: p50 < {SERVE_GOAL['p50_ms']:g} ms, p99 < {SERVE_GOAL['p99_ms']:g} ms and "
              f"at least {SERVE_GOAL['requests_per_s']:g} requests/s: "
              + (f"met by {'; '.join(f'“{i}”' for i in met)}" if met else "not met by any row")
              + (f"; not by {'; '.join(f'“{i}”' for i in rec if i not in met)}." if len(met) < len(rec) else ".")]
    lives = [r for key, r in sorted(d.items()) if key.startswith("live")]
    lines += ["", f"Live catalogue (UniSRec, {live['added']:,} items added by text, one POST each, while /recommend "
              "ran at concurrency 8): failed requests, /recommend latency during the adds, POST /items latency "
              "(the text encoder runs in it), and the time from a POST's answer until the index returns the "
              "new item; after each POST a /recommend whose history holds the new item (failed: with the new "
              "item in the history). The rows change the index and the engine together: the /recommend "
              "table above separates the two.", "",
              *header(["index, engine", "failed POSTs", "failed, new item in the history", "/recommend requests",
                       "over s", "failed", "requests/s", "p50 ms", "p99 ms",
                       "POST /items p50 ms", "p99 ms", "visible after, median ms", "max ms", "within 1 s"])]
    for r in lives:
        load = r["load_during_adds"]
        history = r.get("new_in_history_failures")
        lines.append(f"| {r.get('index', 'exact')}, {r.get('engine', 'torch')} | {r['add_failures']} | "
                     f"{'–' if history is None else history} | "
                     f"{load['requests']:,} | {load['seconds']:.0f} | {load['failed']} | "
                     f"{load['requests_per_s']:.0f} | "
                     f"{load['p50_ms']:.1f} | {load['p99_ms']:.1f} | "
                     f"{r['post_ms_p50']:.1f} | {r['post_ms_p99']:.1f} | {r['visible_s_p50'] * 1e3:.1f} | "
                     f"{r['visible_s_max'] * 1e3:.1f} | {r['visible_within_1s']:,} of {r['added']:,} |")
    live_met = [f"{r.get('index', 'exact')}, {r.get('engine', 'torch')}" for r in lives
                if _serve_goal_met(r["load_during_adds"]) and r["add_failures"] == 0]
    lines += ["", "The /recommend goal at concurrency 8 while the items are added: "
              + (f"met by {'; '.join(f'“{x}”' for x in live_met)}." if live_met else "not met by any row."), "",
              *header(["session event at history length", "event, KV cache ms", "event, re-encoding ms", "speed-up",
                       "model alone, one cached step ms", "model alone, whole history ms", "speed-up"])]
    for length, r in sess.items():
        lines.append(f"| {length} | {r['kv_cache']:.2f} | {r['re_encode']:.2f} | {r['speedup']:.1f}× | "
                     f"{r['encoder_kv_cache']:.2f} | {r['encoder_re_encode']:.2f} | {r['encoder_speedup']:.1f}× |")
    lines += ["", "An event's time includes the exact top-10 over the whole catalogue, which the cache does not "
              "change; the model-alone columns show what the cache saves."]
    return lines


def retrieval(d: dict[str, Any]) -> list[str]:
    from retrieval import table  # the script's own table: one renderer for its stdout and this page

    return ["## Retrieval: exact, FAISS IVF and HNSW", "",
            "Recall of each index against exact top-k (the model's scores, output bias included), build time, "
            "memory, single-query latency (1 thread) and batched throughput (256 queries, 2 threads). Yelp: item "
            "vectors and validation-user states of a SASRec run; synthetic: 1M clustered items of width 64 with "
            "unequal norms and a bias. Script: `benchmarks/retrieval.py`; file: `results/retrieval.json`; plot "
            "`results/retrieval.png` (recall@10 against latency as ef_search / n_probe vary).", "",
            table(d), "", "![recall against latency](results/retrieval.png)"]


def text_encoding(d: dict[str, Any]) -> list[str]:
    lines = section(
        "Text encoding throughput (frozen encoder)",
        "Script: `benchmarks/text_encode.py`; file: `results/text_encoding.json`. Every item text of the "
        "dataset, mean pooling, max 128 tokens, batches of 64 sorted by length and padded per batch, median "
        "of repeats that alternate the precisions; the cache is not used. GFLOP/s counts 2 × the encoder's "
        "non-embedding parameters per token plus the attention products; the peak is a 4096² matmul in the "
        "same precision on the same threads, measured in the same run.",
        ["dataset", "encoder", "texts", "tokens", "threads", "precision", "texts/s", "tokens/s", "GFLOP/s",
         "fraction of matmul peak"])
    notes = []
    for r in d.values():
        for run in r["runs"]:
            frac = run.get("fraction_of_peak")
            lines.append(f"| {r['dataset']} | {r['encoder']} | {r['texts']} | {r['tokens']} | {run['threads']} | "
                         f"{run.get('precision', 'fp32')} | {run['texts_per_s']:.0f} | {run['tokens_per_s']:.0f} | "
                         + (f"{run['gflops']:.0f} | {frac:.2f} |" if frac is not None else "– | – |"))
        cos, goal = r.get("bf16_cosine_distance"), r.get("goal_texts_per_s")
        if cos and goal:
            best = max(r["runs"], key=lambda x: x["texts_per_s"])
            need = goal * r["gflop_per_text"]
            verdict = ("met" if best["texts_per_s"] >= goal else
                       f"not met: at {r['gflop_per_text']:.2f} GFLOP per text it needs {need:.0f} GFLOP/s, "
                       f"{need / best['matmul_peak_gflops']:.1f}× the measured {best['precision']} matmul peak"
                       + (f", beyond what this encoder can do on {best['threads']} thread(s)"
                          if need > best["matmul_peak_gflops"] else ""))
            where = f"{r['dataset']} ({r['note']})" if r.get("note") else r["dataset"]
            notes.append(f"{where}: bf16 vectors within {cos['max']:.1e} cosine distance of float32's "
                         f"(median {cos['median']:.1e}; goal ≤ {cos['goal_max']:g}); fastest "
                         f"{best['texts_per_s']:.0f} texts/s ({best['threads']} thread(s), {best['precision']}); "
                         f"goal {goal:,} texts/s {verdict}.")
    return lines + (["", *notes] if notes else [])


def _train_rows(device: str, d: dict[str, Any]) -> list[list[str]]:
    runs = [("SASRec ml-100k recipe", d.get("train", {}).get("fp32")),
            ("same, bf16 autocast", d.get("train", {}).get("bf16")),
            ("SASRec d 256, 3 epochs", d.get("train", {}).get("d256")),
            (f"same recipe, torchrun {d.get('ddp', {}).get('processes', '')} process(es), "
             f"{d.get('ddp', {}).get('backend', '')}", d.get("ddp")),
            ("UniSRec Scientific recipe", d.get("unisrec"))]
    return [[name, device, r["epochs_run"], num(r["train_seconds"]), num(r["median_epoch_s"], 2),
             num(r["median_targets_per_s"]), f4(r["test"]["recall@10"]), f4(r["test"]["ndcg@10"])]
            for name, r in runs if r and "test" in r]


def cuda(d: dict[str, Any]) -> list[str]:
    cpu = load("cuda_check_cpu.json") or {}
    rk, sv, pk = d["ranking"], d["serve"], d["peak"]
    cpu_eval = load("eval_cost.json")
    lines = ["## CUDA: the GPU paths against the CPU", "",
             f"{d['device']}, torch {d['machine']['torch']}; matrix-product peak measured in the same run: "
             f"fp32 {pk['fp32_tflops']:.0f} TFLOP/s (TF32 off, as seqrec leaves it), bf16 {pk['bf16_tflops']:.0f}. "
             "Script: `benchmarks/cuda_check.py` (run where a GPU is lent; the CPU rows are the same script "
             "with `--device cpu` on this 2-core machine); files: `results/cuda_check.json`, "
             "`results/cuda_check_cpu.json`.", "",
             "Blocked full ranking on the GPU against the CPU path (random states, planted exact ties, output "
             "bias, history offsets, filtered history). A differing user is explained when a competitor sits "
             "within float error of the tie boundary (margin: its distance from the boundary in units of the "
             "tie tolerance, in float64):", "",
             *table(["case", "users", "ranks that differ", "by at most", "margin of the nearest competitor"],
                    [[case, r["users"], r["mismatches"], r["max_abs_rank_difference"],
                      ", ".join(f"{m:.3f}" for m in r["boundary_margins"]) or DASH]
                     for case, r in rk["equal_to_cpu"].items()]), "",
             *table(["full ranking", "wall s (median of 3)", "TFLOP/s", "fraction of fp32 peak", "peak memory MB"],
                    [[f"{rk['users']:,} × {rk['items']:,}, D {rk['d']}, GPU", num(rk["seconds_median"], 2),
                      num(rk["tflops"], 1), num(rk["fraction_of_fp32_peak"], 2), num(rk.get("peak_gpu_memory_mb"))],
                     *([[f"same, CPU {cpu_eval['threads']} threads (`eval_cost.py`)",
                         num(cpu_eval["median"]["seconds"], 1), num(cpu_eval["median"]["gflops"] / 1e3, 2),
                         num(cpu_eval["median"]["fraction_of_peak"], 2), num(cpu_eval["median"]["peak_rss_mb"])]]
                       if cpu_eval else [])]), "",
             "Training with the shipped recipes (`seqrec train ... --set train.device=cuda`); test metrics "
             "of the validation-picked epoch. The CPU rows stop at the recipe's time budget, and ran while "
             "other jobs shared this machine: their times are upper bounds.", "",
             *table(["run", "device", "epochs", "train s", "s / epoch", "targets/s", "R@10", "N@10"],
                    [*_train_rows("GPU", d), *_train_rows("CPU (2 cores)", cpu)]), "",
             f"Serving a CUDA-loaded run: top-10 items equal to the CPU-loaded run's for "
             f"{sv['topk_items_equal_to_cpu']} of {sv['histories']} real ml-100k histories (largest score "
             f"difference {sv['max_score_difference']:.1e}); sessions with the KV cache ({sv['session_events_cached']} "
             f"cached events over {sv['session_histories']} histories) against `recommend` on the same history: "
             f"largest score difference {sv['session_vs_recommend_max_score_difference']:.1e}; the HTTP app's "
             f"/recommend equal to `Recommender.recommend` for {sv['app_recommend_equal']} of {sv['app_checked']}; "
             f"one request p50 {sv['recommend_latency_ms_p50']:.1f} ms, p99 {sv['recommend_latency_ms_p99']:.1f} ms."]
    if (pr := d.get("profile")) and "ms_per_step" in pr:
        launches = sum(e["calls_per_step"] for e in pr["top_self_cpu"] if e["op"].startswith("cudaLaunchKernel"))
        syncs = pr["syncs_per_step"].get("cudaStreamSynchronize", 0)
        lines += ["", f"Where a GPU training step of the ml-100k recipe (batch 64) goes, over {pr['steps']} steps "
                  f"under the torch profiler: the GPU is busy {pr['device_busy_ms_per_step']:.1f} ms of each step, "
                  f"which launches about {launches:.0f} kernels and waits for the device {syncs:.0f} times (boolean "
                  "indexing of the target positions). A step of this small model is bound by PyTorch's per-operator "
                  "host overhead, not by the GPU: recipes with bigger batches (UniSRec above, 256) use it better."]
    return lines


def ddp_scaling(d: dict[str, Any]) -> list[str]:
    return ["## Data-parallel scaling on this machine (CPU, gloo)", "",
            f"The {d['dataset']} SASRec recipe (`{d['config']}`), {d['epochs']} epochs each, no early stop, run one "
            "after the other. Script: `benchmarks/ddp_scaling.py`; file: `results/ddp_scaling.json`. The CUDA/NCCL "
            "run is in the CUDA section.", "",
            *table(["run", "s / epoch (median)", "speed-up over 1 thread", "targets/s", "test R@10", "test N@10"],
                   [[name, num(r["median_epoch_s"], 2), num(r["speedup_vs_1_thread"], 2, "×"),
                     num(r["median_targets_per_s"]), f4(r["test"]["recall@10"]), f4(r["test"]["ndcg@10"])]
                    for name, r in d["rows"].items()])]


def auto_decisions(d: dict[str, Any]) -> list[str]:
    """What the "auto" settings decide on every dataset (SASRec's; the other models share the rules)."""
    def cell(ds: list[dict[str, Any]], key: str) -> str:
        x = next((x for x in ds if x["key"] == key), None)
        if x is None:
            return DASH
        detail = {"model.loss": lambda: f"{x['epoch_output_seconds']:.3g} s/epoch",
                  "history_bias": lambda: f"repeat rate {x['repeat_rate']:.1%}",
                  "data.stride": lambda: f"{x['share_beyond_one_window']:.0%} beyond one window",
                  "train.batch_size": lambda: f"~{x['step_gib']:.2f} GiB a step"}.get(key)
        return f"{x['value']}" + (f" ({detail()})" if detail else "")

    rows = [[r["dataset"], f"{r['items']:,}", f"{r['interactions']:,}",
             *(cell(r["decisions"]["sasrec"], k) for k in ("model.loss", "train.sparse_items", "train.batch_size",
                                                          "history_bias", "data.stride", "data.jitter"))]
            for r in d["rows"] if "sasrec" in r["decisions"]]
    rate = next((x["matmul_gflops"] for r in d["rows"] for x in r["decisions"].get("sasrec", [])
                 if x["key"] == "model.loss"), None)
    intro = ("What `seqrec train --model sasrec` with no config decides from each dataset's training split "
             "(`seqrec.train.auto`; GRU4Rec and BERT4Rec take the same loss and batch size rules, UniSRec and "
             "GRU4Rec the same history-bias rule). The loss: the full softmax unless its output layer would take "
             "more than 600 s of matmul per epoch at the rate measured when deciding"
             + (f" ({rate:.0f} GFLOP/s, {d['threads']} thread{'s' if d['threads'] > 1 else ''})" if rate else "")
             + "; in parentheses its estimated seconds per epoch. Generated logs: benchmarks/scale.py's shapes. "
             f"Script: `benchmarks/auto_decisions.py`; file: `results/auto_decisions.json`; command: `{d['command']}`.")
    return ["## Settings read from the data: the `auto` decisions", "", intro, "",
            *table(["dataset", "items", "interactions", "model.loss", "train.sparse_items", "train.batch_size",
                    "model.history_bias", "data.stride", "data.jitter"], rows)]


def defaults(d: dict[str, Any]) -> list[str]:
    lines = ["## Defaults: `seqrec train --model M` with no config", "",
             "The command a new user types (progress bar off, one thread, the time cap in the file) on this 2-core "
             "CPU, or, where the device column says so, on a lent GPU (an NVIDIA H200, up to 22 runs side by side, "
             "each one CPU thread), against the "
             "best-validated run of the same model on the same data anywhere in the results files. Goal: "
             f"{d['goal']}. Script: `benchmarks/defaults.py`; file: `results/defaults.json`. A row with training "
             "defaults was run with each model's own (`TRAIN_DEFAULTS`: SASRec AdamW with decay 0.1 and a weight "
             "average, every sequence model a refit on train + valid); the previous default is the same command "
             "before them (`results/defaults_previous.json`), validation / test.", "",
             *header(["dataset", "model", "device", "training defaults", "default valid / test N@10",
                      "previous default", "epochs", "time cap s", "stopped by the cap", "auto decisions",
                      "best row test N@10", "best row", "ratio", "goal met"])]
    for r in d["rows"]:
        run, best = r["default"], r.get("best")
        if "test" not in run:
            lines.append(row([r["dataset"], r["model"], _device(run), DASH,
                              "failed: " + run.get("error", "").strip().splitlines()[-1],
                              *[DASH] * 8, "no"]))
            continue
        auto = "; ".join(f"{a['key']}={a['value']}" for a in run.get("auto", [])) or DASH
        cap = DASH if r.get("stopped_by_cap") is None else yes(r["stopped_by_cap"], "no")
        prev = r.get("previous_default")
        lines.append(row([r["dataset"], r["model"], _device(run), _train_defaults(run.get("train_defaults")),
                          f"{f4(run['valid']['ndcg@10'])} / {f4(run['test']['ndcg@10'])}",
                          f"{f4(prev['valid_ndcg@10'])} / {f4(prev['test_ndcg@10'])}" if prev else DASH,
                          run["epochs_run"], _time_cap(run.get("command", "")), cap, auto,
                          f4(best["test"]["ndcg@10"]) if best else DASH, f"`{best['from']}`" if best else DASH,
                          num(r.get("ratio"), 2), yes(r.get("meets_goal"), "no") if best else DASH]))
    return lines


def encoders(d: dict[str, Any]) -> list[str]:
    """The same UniSRec with each frozen text encoder: its cost, what its vectors know untrained, and the
    trained rows made with it beside the default encoder's."""
    rows, trained = [], []
    for r in d["rows"]:
        u = r["untrained"]
        name = "all-MiniLM-L6-v2 (packaged)" if r["encoder"] == "default" else Path(r["encoder"]).name
        rows.append([r["tag"], f"`{name}`", r["dim"], f"{r['texts_per_s']:.0f}",
                     f"{r['precision']}, {r['threads']} thread(s)",
                     f"{f4(u['valid_ndcg@10'])} / {f4(u['test_ndcg@10'])}"])
        for t in r["trained"]:
            base = t["default"]
            trained.append([t["method"], _share(t["fraction"]), t["seed"], r["tag"],
                            f"{f4(t['encoder']['valid_ndcg@10'])} / {f4(t['encoder']['test_ndcg@10'])}",
                            f"{f4(base['valid_ndcg@10'])} / {f4(base['test_ndcg@10'])}" if base else DASH])
    lines = [f"## Encoder choice on {d['target']}", "",
             "The same UniSRec (the target's config) with each frozen text encoder. Untrained: a fresh model "
             "(seed 0), whose adaptor and near-identity Transformer rank items by text similarity to the history, "
             "so what the encoder's vectors alone know. Texts/s: the target's first item texts, on this machine "
             "beside other jobs (a ratio, not a speed). Script: `benchmarks/encoders.py`; file: "
             f"`results/encoders_{d['target']}.json`; command: `{d['command']}`.", "",
             *table(["encoder", "model", "width", "texts/s", "precision", "untrained valid / test N@10"], rows)]
    if trained:
        lines += ["", "Trained from scratch with the encoder (`benchmarks/data_efficiency.py` runs with "
                  "`model.text_encoder`), against the same recipe, fraction and seed with the default encoder:", "",
                  *table(["recipe", "users", "seed", "encoder", "valid / test N@10", "default encoder valid / test"],
                         trained)]
    return lines


def _commands(d: dict[str, Any]) -> list[str]:
    """A results file's commands (files that grow over several runs keep each)."""
    return d.get("commands") or [d["command"]]


def history_bias_section(d: dict[str, Any]) -> list[str]:
    """Each model's defaults with the learned history bias on and off, where users return to items."""
    rows = []
    for r in d["rows"]:
        on, off = r["runs"]["on"], r["runs"]["off"]
        rows.append([r["dataset"], r["model"], r.get("seed", 0), f"{r['repeat_rate']:.1%}",
                     *[f"{f4(x['valid']['ndcg@10'])} / {f4(x['test']['ndcg@10'])}" if "valid" in x else "failed"
                       for x in (on, off)], r["validation_prefers"] or DASH])
    prefers_on = sum(r["validation_prefers"] == "on" for r in d["rows"])
    return ["## The history bias where users return", "",
            "`seqrec train --model M` (the defaults) with `model.history_bias` on and off, on the data whose users "
            "come back to items they had (repeat rate: the share of training events that return to an item of "
            f"the user's history). Validation prefers the bias on in {prefers_on} of {len(d['rows'])} rows; the "
            "`auto` rule turns it on whatever the repeat rate. Script: `benchmarks/history_bias.py`; file: "
            f"`results/history_bias.json`; commands: {'; '.join(f'`{c}`' for c in _commands(d))}.", "",
            *table(["dataset", "model", "seed", "repeat rate", "bias on: valid / test N@10",
                    "bias off: valid / test N@10", "validation prefers"], rows)]


def _device(run: dict[str, Any]) -> str:
    """Where a defaults run trained: this machine's CPU, or the GPU of the machine its file came from."""
    m = run.get("machine") or {}
    if run.get("device") != "cuda":
        return "CPU"
    return f"{m.get('gpu', 'GPU')} (torch {m['torch']})" if m.get("torch") else "GPU"


def _time_cap(command: str) -> str:
    """The training time cap a defaults run was given (its command line), in seconds."""
    found = re.search(r"train\.time_budget_s=([0-9.]+)", command)
    return f"{float(found.group(1)):.0f}" if found else DASH


def _train_defaults(t: dict[str, Any] | None) -> str:
    """What a defaults run trained with: None = before the models had training defaults of their own."""
    if t is None:
        return "previous (adam, no refit)"
    parts = [t["optimizer"] + (f" decay {t['weight_decay']:g}" if t["weight_decay"] else "")]
    parts += [f"ema {t['ema']:g}"] if t["ema"] else []
    return ", ".join(parts + (["refit"] if t["refit"] else []))


# ---- transfer -----------------------------------------------------------------------------------

def _share(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def data_efficiency(d: dict[str, Any]) -> list[str]:
    """Method × fraction of the target's users: median test NDCG@10 over seeds (min–max)."""
    target = d["target"]
    summary = d["summary"]
    zeros = [s for s in summary if s["fraction"] == 0]  # no target data: zero-shot, the untrained model
    fractions = sorted({s["fraction"] for s in summary if s not in zeros})
    cells = {(s["method"], s["fraction"]): s for s in summary}
    methods = list(dict.fromkeys(s["method"] for s in summary if s not in zeros))
    seeds = {f: max(s["seeds"] for s in summary if s["fraction"] == f) for f in fractions}

    def cell(s: dict[str, Any] | None) -> str:
        if s is None:
            return DASH
        if s["seeds"] == 1:
            return f4(s["test_ndcg@10_median"])
        return value_range(s["test_ndcg@10_median"], s["test_ndcg@10_min"], s["test_ndcg@10_max"])

    pretraining = d.get("pretraining") or {}
    games = ("Runs with the history bias: `-hist` rows and every row of the `games-*` pre-trained models "
             "(`model.history_bias` auto, on for this target; `games-centre-hist` learnt it in pre-training, so "
             "its fine-tuning and zero-shot start from the learnt offsets); the older rows are without it. "
             "`games-centre` was pre-trained with `model.text_centre`, `games-plain` without, `games-centre-hist` "
             "with both (same steps and seed). ") if "games-centre" in pretraining else ""
    auto = ("Every row has `model.history_bias` auto, on for this target (its users hardly come back to an "
            "item). ") if not games else ""
    intro = (f"Every method learns from the training events of a seeded fraction of {target}'s users "
             "(`data.train_fraction`); validation and test are every user's, unchanged: leave-one-out, full "
             "ranking, seen items not filtered, the model chosen on validation NDCG@10. " + games + auto +
             "`-pNN`: patience NN epochs. Test NDCG@10, median over "
             "seeds (min–max); seeds per fraction: "
             + ", ".join(f"{_share(f)} {n}" for f, n in seeds.items())
             + f". Script: `benchmarks/data_efficiency.py`; file: `results/data_efficiency_{target}.json` "
             "(every run and its command).")
    lines = [f"## Transfer: data efficiency on {target}", "", intro, "",
             *table(["method", *(f"{_share(f)} of users" for f in fractions)],
                    [[m, *(cell(cells.get((m, f))) for f in fractions)] for m in methods])]
    for zero in zeros:
        lines += ["", f"{zero['method']}, no training on {target} at all: test NDCG@10 "
                  f"{f4(zero['test_ndcg@10_median'])}, test R@10 {f4(zero['test_recall@10_median'])}."]
    lines += _transfer_goals(d)
    if pretraining:
        probe = (load(f"transfer_probe_{target}.json") or {}).get("runs") or {}

        def flag(p: dict[str, Any], key: str, name: str) -> str:  # older records: what the probe noted
            value = p.get(key, (probe.get(name) or {}).get(key))
            return DASH if value is None else ("yes" if value else "no")

        lines += ["", "Pre-trained models (`(name)` in the method column): `seqrec pretrain` on one CPU thread, "
                  "process peak RSS; text centred: `model.text_centre`; history bias learnt: pre-trained with "
                  "`model.history_bias = true`, whose offsets fine-tuning and zero-shot start from. Models that ran "
                  "a fixed number of steps (`pretrain.max_steps`, the steps `pretrained-games` made in its time "
                  "budget) beside other jobs have lower rates.", "",
                  *table(["model", "domains", "training events", "text centred", "history bias learnt", "steps",
                          "epochs", "seconds", "sequences/s", "targets/s", "peak RSS MB"],
                         [[name, ", ".join(r["domain"] for r in p["data_card"]["domains"]),
                           f"{p['data_card']['training_events']:,}", flag(p, "text_centre", name),
                           flag(p, "history_bias", name),
                           f"{p['steps']:,}" if p.get("steps") else DASH, str(p["epochs_run"]),
                           f"{p['train_seconds']:.0f}", f"{p['sequences_per_s']:.0f}", f"{p['targets_per_s']:.0f}",
                           f"{p['peak_rss_mb']:.0f}"]
                          for name, p in pretraining.items()])]
    png = RESULTS / f"data_efficiency_{target}.png"
    if png.is_file():
        lines += ["", f"![data efficiency on {target}](results/{png.name})"]
    return lines


def tune(d: dict[str, Any]) -> list[str]:
    """`seqrec tune` against the hand-made recipe on one dataset."""
    t, best = d["tune"], d["tune"]["best_trial"]
    states = ", ".join(f"{n} {s}" for s, n in sorted(d["states"].items()))
    params = ", ".join(f"{k.split('.')[-1]} {v:.3g}" if isinstance(v, float) else f"{k.split('.')[-1]} {v}"
                       for k, v in best["params"].items())
    rows = [[f"`seqrec tune` ({d['budget_s'] / 60:.0f} min, {t['n_trials']} trials: {states})", params,
             f4(t["best_run"]["valid"]["ndcg@10"]), f4(t["best_run"]["test"]["recall@10"]),
             f4(t["best_run"]["test"]["ndcg@10"])]]
    for key, label in (("recipe", "hand-made recipe"), ("recipe_history_bias", "hand-made recipe + history bias")):
        r = d.get(key)
        if r:
            rows.append([label, f"`{r['run']}`", f4(r["valid"]["ndcg@10"]), f4(r["test"]["recall@10"]),
                         f4(r["test"]["ndcg@10"])])
    intro = (f"A validation-only search (TPE, median pruning) from the recipe's config on {d['dataset']}, then the "
             "best settings trained again (the recipe's refit) and tested once; the hand-made rows are the runs "
             "validation picked among the SASRec configurations tried. Script: `benchmarks/tune_vs_recipe.py`; "
             f"file: `results/tune_{d['dataset']}.json`; command: `{d['command']}`.")
    if "threads_per_trial" in d:
        intro += f" Each trial ran on {d['threads_per_trial']} thread(s)."
    intro += (f" No trial trained longer than the budget / {d['min_trials']}." if "min_trials" in d else
              " This study predates the cap of each trial at its share of the budget (`--min-trials`).")
    got = t["best_run"]["test"]["ndcg@10"]
    verdicts = []
    for key, label in (("recipe", "against the recipe"), ("recipe_history_bias", "against the recipe + history bias")):
        if d.get(key):
            want = d[key]["test"]["ndcg@10"]
            verdicts.append(f"{label}: {got / want:.2f} × ({'met' if got >= want else 'not met'})")
    return [f"## `seqrec tune` against the recipe on {d['dataset']}", "", intro, "",
            *table(["run", "settings", "valid N@10", "test R@10", "test N@10"], rows), "",
            "Goal: the same or better test NDCG@10 than the hand-made recipe; " + "; ".join(verdicts) + "."]


def transfer_probe(d: dict[str, Any]) -> list[str]:
    """Validation NDCG@10 on the target of each pre-trained model and its parts, with no training."""
    target = d["target"]
    kinds = list(dict.fromkeys(k for r in d["runs"].values() for k in r["valid_ndcg@10"]))
    intro = (f"What a pre-trained UniSRec carries to {target} with no training: validation NDCG@10 of the "
             "pre-trained model (zero-shot), of the same never recommending items already in the history, with "
             "each adaptor expert re-centred on the target's mean text vector (runs pre-trained with "
             "`model.text_centre` centre every catalogue themselves), and of its adaptor or Transformer alone "
             "beside fresh parts (a learnt history bias goes with the Transformer). Steps: the pre-training "
             "optimiser steps. An untrained UniSRec scores "
             f"{f4(d['untrained_valid_ndcg@10'])}: its near-identity Transformer ranks items by text similarity to "
             "the history. Script: `benchmarks/transfer_probe.py`; file: "
             f"`results/transfer_probe_{target}.json`.")
    return [f"## Transfer: what pre-training carries to {target}", "", intro, "",
            *table(["pre-trained model", "domains", "steps", "text centred", "history bias learnt", *kinds],
                   [[name, ", ".join(r["domains"]), r.get("pretrain_steps", DASH), yes(r.get("text_centre"), "no"),
                     yes(r.get("history_bias"), "no"),
                     *(f4(r["valid_ndcg@10"][k]) if k in r["valid_ndcg@10"] else DASH for k in kinds)]
                    for name, r in d["runs"].items()])]


# ---- the pages --------------------------------------------------------------------------------------

Render = Callable[[Any], list[str]]
SECTIONS: list[tuple[str, Render]] = [
    ("sasrec_quality.json", sasrec_quality),
    ("speed_vs_recbole.json", speed),
    ("eval_cost.json", eval_cost),
    ("serve_load.json", serve_load),
    ("positions.json", positions),
    ("zoo.json", zoo),
    ("loss_compare.json", losses),
    ("zoo_vs_recbole.json", zoo_vs_recbole),
    ("item2vec_vs_gensim.json", item2vec_gensim),
    ("unisrec.json", unisrec),
    ("retrieval.json", retrieval),
    ("text_encoding.json", text_encoding),
    ("features.json", features),
    ("output_layer.json", output_layer),
    ("data_efficiency_*.json", data_efficiency),
    ("transfer_probe_*.json", transfer_probe),
    ("scale.json", scale),
    ("train_throughput.json", train_throughput),
    ("tune_*.json", tune),
    ("cuda_check.json", cuda),
    ("ddp_scaling.json", ddp_scaling),
    ("defaults.json", defaults),
    ("auto_decisions.json", auto_decisions),
    ("history_bias.json", history_bias_section),
    ("encoders_*.json", encoders),
]
# the sections of docs/results.md (the README's Results until the README became a manual)
RESULTS_PAGE = ("sasrec_quality.json", "speed_vs_recbole.json", "unisrec.json", "item2vec_vs_gensim.json",
                "features.json", "output_layer.json", "serve_load.json", "eval_cost.json", "retrieval.json",
                "data_efficiency_*.json", "transfer_probe_*.json", "scale.json", "train_throughput.json", "tune_*.json",
                "cuda_check.json", "ddp_scaling.json", "defaults.json", "auto_decisions.json", "history_bias.json",
                "encoders_*.json")
START, END = "<!-- results:start -->", "<!-- results:end -->"


def merged(prefix: str) -> dict[str, Any] | None:
    """Entries of every results/<prefix>*.json (runs that ran side by side write separate files)."""
    out: dict[str, Any] = {}
    for path in sorted(RESULTS.glob(f"{prefix}*.json")):
        out.update(json.loads(path.read_text()))
    return out or None


def sources(name: str) -> Iterator[Any]:
    """The data of a section: one file, the merged sasrec_quality*.json, or each file of a glob."""
    if name == "sasrec_quality.json":
        data = merged("sasrec_quality")
        yield from [] if data is None else [data]
    elif "*" in name:
        for path in sorted(RESULTS.glob(name)):
            yield json.loads(path.read_text())
    elif (data := load(name)) is not None:
        yield data


def rendered(names: tuple[str, ...] | None = None) -> list[str]:
    """The sections (all, or those named), each followed by a blank line."""
    lines: list[str] = []
    for name, render in SECTIONS:
        if names is None or name in names:
            for data in sources(name):
                lines += [*render(data), ""]
    return lines


# ---- the README's headline table ----------------------------------------------------------------------

def _picked(runs: dict[str, Any], group: Callable[[str, Any], Any], valid: Callable[[Any], Any]) -> list[str]:
    """Per group, the run with the best `valid` (validation NDCG@10: the run validation picks, not the best
    test); runs in a group are compared on `valid` alone, whatever their test numbers."""
    best: dict[Any, str] = {}
    for key, r in runs.items():
        g = group(key, r)
        if g not in best or valid(r) > valid(runs[best[g]]):
            best[g] = key
    return sorted(best.values(), key=lambda k: (str(group(k, runs[k])), k))


def _published(pub: dict[str, Any]) -> str:
    return f"{f4(pub.get('recall@10'))} / {f4(pub.get('ndcg@10'))}"


def _picked_pair(summary: list[dict[str, Any]], fraction: float
                 ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """At `fraction` of the target's users: the pre-trained method and the from-scratch one validation
    picks (highest median validation NDCG@10 among the variants run with the most seeds there)."""
    at = [s for s in summary if s["fraction"] == fraction]
    if not at:
        return None
    at = [s for s in at if s["seeds"] == max(s["seeds"] for s in at)]  # a one-seed probe is no pick
    pre = [s for s in at if s["method"].startswith("pt-")]
    scratch = [s for s in at if not s["method"].startswith("pt-") and s["method"] != "popularity"]
    if not pre or not scratch:
        return None
    return (max(pre, key=lambda s: s["valid_ndcg@10_median"]), max(scratch, key=lambda s: s["valid_ndcg@10_median"]))


def _transfer_rows(d: dict[str, Any], fraction: float = 0.1) -> list[list[str]]:
    """The headline row: at `fraction` of the target's users, the picked pre-trained method against the
    picked from-scratch one."""
    pair = _picked_pair(d["summary"], fraction)
    if pair is None:
        return []
    best_pre, best_scratch = pair
    return [[f"UniSRec pre-trained, fine-tuned on {fraction:.0%} of the users: test N@10 (median of "
             f"{best_pre['seeds']} seeds)", d["target"], f"`{best_pre['method']}`",
             f4(best_pre["test_ndcg@10_median"]),
             f"best from scratch on the same users: {f4(best_scratch['test_ndcg@10_median'])} "
             f"(`{best_scratch['method']}`)"]]


def _transfer_goals(d: dict[str, Any]) -> list[str]:
    """The transfer goals, from the summary: pre-trained against from scratch at each fraction up to 10%
    (goal +20%), zero-shot against popularity on every user (goal 3x), and at 100% (goal: not below)."""
    summary = d["summary"]
    out = []
    for fraction in sorted({s["fraction"] for s in summary if s["fraction"] > 0}):
        pair = _picked_pair(summary, fraction)
        if pair is None:
            continue
        pre, scratch = pair
        ratio = pre["test_ndcg@10_median"] / scratch["test_ndcg@10_median"]
        goal = "goal +20%" if fraction <= 0.1 else ("goal: not below" if fraction == 1.0 else "")
        met = (ratio >= 1.2) if fraction <= 0.1 else (ratio >= 1.0 if fraction == 1.0 else None)
        capped = [(side, sum(1 for r in runs if r.get("best_epoch") == r.get("epochs_run")), len(runs))
                  for side, m in (("pre-trained", pre), ("from scratch", scratch))
                  for runs in [[r for r in d["runs"] if r["method"] == m["method"] and r["fraction"] == fraction]]]
        still = ", ".join(f"{side} {n} of {total} seeds" for side, n, total in capped if n)
        out.append(f"{_share(fraction)} of users: pre-trained `{pre['method']}` {f4(pre['test_ndcg@10_median'])} "
                   f"against from scratch `{scratch['method']}` {f4(scratch['test_ndcg@10_median'])}: "
                   f"{ratio - 1:+.1%}" + (f" ({goal}: {'met' if met else 'not met'})" if goal else "")
                   + (f"; stopped by the time cap or the epoch limit at their best epoch, still improving: {still}"
                      if still else ""))
    popularity = next((s for s in summary if s["method"] == "popularity" and s["fraction"] == 1.0), None)
    shots = [s for s in summary if s["method"].startswith("zero-shot")]
    if popularity and shots:
        shot = max(shots, key=lambda s: s.get("valid_ndcg@10_median", 0.0))
        ratio = shot["test_ndcg@10_median"] / popularity["test_ndcg@10_median"]
        out.append(f"zero-shot (validation-picked: `{shot['method']}`) {f4(shot['test_ndcg@10_median'])} against "
                   f"popularity on every user {f4(popularity['test_ndcg@10_median'])}: {ratio:.1f} × "
                   f"(goal 3 ×: {'met' if ratio >= 3 else 'not met'})")
    return ["", "The goals, each side the variant validation picks (test NDCG@10, medians):", "",
            *(f"- {line}" for line in out)] if out else []


def headline(link: str = "docs/results.md") -> list[str]:
    """One table of the picked runs and the speed and cost numbers behind the README's claims."""
    rows: list[list[str]] = []
    quality = merged("sasrec_quality") or {}
    for key in _picked(quality, lambda _, r: (r["dataset"], history_bias(r)), lambda r: r["valid"]["ndcg@10"]):
        r = quality[key]
        rows.append([f"SASRec{' + history bias' if history_bias(r) else ''}: test R@10 / N@10", r["dataset"],
                     f"`{key}`", _published(r["test"]), f"{_published(r['published'])} "
                     f"({r['published'].get('source', '')})"])
    uni = {k: v for k, v in ((load("unisrec.json") or {}).get("quality") or {}).items() if k.startswith("unisrec")}
    for key in _picked(uni, lambda k, _: k.endswith("-hist"), lambda r: r["valid_ndcg@10"]):
        rows.append([f"UniSRec{' + history bias' if key.endswith('-hist') else ''}: test R@10 / N@10",
                     "amazon-scientific-unisrec", f"`{key}`", _published(uni[key]["test"]),
                     f"{_published(uni[key].get('published') or {})} (UniSRec, KDD 2022)"])
    speed_runs = (load("speed_vs_recbole.json") or {}).get("over_seeds") or {}
    reached = {k: s for k, s in speed_runs.items() if s["median_ratio_vs_recbole_time_to_best"] is not None}
    # the recipe whose seeds all get there, fastest at the median (with and without the history bias)
    for key in _picked(reached, lambda k, _: "-hist" in k,
                       lambda s: (s["reached"] == len(s["seeds"]), -s["median_ratio_vs_recbole_time_to_best"])):
        s = reached[key]
        rows.append(["SASRec: time to RecBole's best valid N@10 (median over seeds)", "ml-100k", f"`{key}`",
                     f"{s['median_ratio_vs_recbole_time_to_best']:.3f} ×, {s['reached']} of {len(s['seeds'])} "
                     "seeds reach it", "RecBole 1.2.1: 1 ×"])
    for path in sorted(RESULTS.glob("data_efficiency_*.json")):
        rows += _transfer_rows(json.loads(path.read_text()))
    cost = load("eval_cost.json")
    if cost:
        m = cost["median"]
        rows.append([f"full ranking, {cost['users']:,} users × {cost['items']:,} items", "synthetic",
                     f"{cost['threads']} threads", f"{m['seconds']:.1f} s, {m['fraction_of_peak']:.2f} of matmul peak",
                     f"dense scores: {cost['naive_matrix_gb']:.0f} GB"])
    throughput = load("train_throughput.json")
    for r in (throughput or {}).get("rows", []):
        if r["config"] == "default" and r["precision"] == "float32" and r["d"] == 64:
            was = r.get("reference")
            rows.append([f"SASRec with no config, d {r['d']}: one training step, 1 thread", r["dataset"],
                         f"{r['targets']:,} targets", f"{r['targets_per_s']:,.0f} targets/s, "
                         f"{r['fraction_of_peak']:.2f} of matmul peak",
                         f"the code it replaced: {was['targets_per_s']:,.0f} targets/s" if was else DASH])
    serve = load("serve_load.json")
    if serve:
        for index, by_concurrency in serve["recommend"].items():
            c, r = max(by_concurrency.items(), key=lambda kv: kv[1]["requests_per_s"])
            at8 = by_concurrency.get("8")
            rows.append([f"`seqrec serve` POST /recommend, top-10 ({index})", f"{serve['n_items']:,} items",
                         f"concurrency {c}", f"{r['requests_per_s']:.0f} requests/s, p99 {r['p99_ms']:.1f} ms"
                         + (f"; at concurrency 8 p50 {at8['p50_ms']:.1f} ms" if at8 else ""), DASH])
        for key, live in sorted(serve.items()):
            if key.startswith("live"):
                load_ = live["load_during_adds"]
                rows.append([f"`seqrec serve` UniSRec, {live['added']:,} items added by text under load "
                             f"({live.get('index', 'exact')}, {live.get('engine', 'torch')} engine)",
                             f"{serve['n_items']:,} items", "concurrency 8",
                             f"{live['add_failures'] + load_['failed']} failed; /recommend "
                             f"{load_['requests_per_s']:.0f} requests/s, p50 {load_['p50_ms']:.1f} ms, "
                             f"p99 {load_['p99_ms']:.1f} ms", DASH])
    defaults = [r for r in (load("defaults.json") or {}).get("rows", []) if "meets_goal" in r]
    if defaults:
        met = sum(r["meets_goal"] for r in defaults)
        ratios = sorted(r["ratio"] for r in defaults)
        rows.append(["`seqrec train --model M` with no config: test N@10 against the best-validated row",
                     f"{len({r['dataset'] for r in defaults})} datasets", f"{len(defaults)} (dataset, model) pairs",
                     f"{met} of {len(defaults)} reach 95%; lowest {ratios[0]:.2f} ×, median "
                     f"{ratios[len(ratios) // 2]:.2f} ×", "the best-validated run of the same model: 1 ×"])
    if not rows:
        return []
    return ["Leave-one-out, full ranking over all items, seen items not filtered; each quality row is the run "
            f"validation picked among every configuration tried ([docs/results.md]({link})).", "",
            *table(["result", "dataset", "run", "seqrec", "reference"], rows)]


# ---- writing --------------------------------------------------------------------------------------------

def inject(path: Path, block: list[str]) -> None:
    """Replace a page's generated block (between the markers) with `block`."""
    text = path.read_text()
    if START not in text or END not in text:
        return
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(head + START + "\n" + "\n".join(block) + "\n" + END + tail)


def results_page() -> list[str]:
    """docs/results.md: every configuration tried of the quality, speed and cost benchmarks."""
    intro = ["# Results", "",
             "Generated by `benchmarks/report.py` from `benchmarks/results/*.json`; do not edit by hand. Every "
             "number here and in [benchmarks/RESULTS.md](../benchmarks/RESULTS.md) (all benchmarks: model zoo, "
             "losses, UniSRec, evaluation cost) is written by a script in `benchmarks/` into "
             "`benchmarks/results/*.json`; `python benchmarks/report.py` generates both from those files. "
             "Machine: 2-core Intel Xeon (AMX), no GPU; timings are noisy on this shared machine, so compare "
             "ratios measured in one run.", "", "## Headline", "", *headline("results.md"), ""]
    body = [line.replace("](results/", "](../benchmarks/results/") for line in rendered(RESULTS_PAGE)]
    return intro + body


def main() -> None:
    lines = ["# Benchmark results", "", "Generated by `benchmarks/report.py` from `benchmarks/results/*.json`; "
             "do not edit by hand. Machine: 2-core Intel Xeon (AMX), no GPU; timings are noisy on this shared "
             "machine, so compare ratios measured in one run.", "", *rendered()]
    OUT.write_text("\n".join(lines))
    DOCS.parent.mkdir(exist_ok=True)
    DOCS.write_text("\n".join(results_page()))
    inject(README, headline())
    print(f"wrote {OUT}, {DOCS} and the README's headline table")


if __name__ == "__main__":
    main()
