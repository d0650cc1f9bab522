"""Render the results pages from the JSON files the benchmark scripts wrote.

No number on these pages is typed by hand: each table reads one results file.

    benchmarks/RESULTS.md   every benchmark
    docs/results.md         the quality, speed and serving results, every configuration tried
    README.md               a headline table of the picked runs, between the results markers

    python benchmarks/report.py

Each section is a function of one results file, in a module by what it measures: quality against
published numbers (`report_quality.py`: SASRec, UniSRec, the model zoo, losses, side features, the
output layer, positions), other libraries (`report_peers.py`: RecBole, gensim), cost
(`report_cost.py`: evaluation, scale, training throughput, text encoding, CUDA, data parallel),
serving (`report_serving.py`), settings (`report_settings.py`: `auto`, defaults, the history bias,
encoders) and transfer (`report_transfer.py`: data efficiency, tuning). This module assembles the
pages and the README's headline table; table and number formats are in `tables.py`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT, median_run
from common import load_result as load
from report_cost import cuda, ddp_scaling, eval_cost, pretrain_loss, scale, text_encoding, train_throughput
from report_peers import item2vec_gensim, speed, zoo_vs_recbole
from report_quality import features, losses, output_layer, positions, sasrec_quality, unisrec, unisrec_sampled, zoo
from report_serving import batch_recommend, catalogue_changes, retrieval, serve_load
from report_settings import auto_decisions, defaults, defaults_candidate, encoders, history_bias_section
from report_transfer import _transfer_rows, data_efficiency, transfer_probe, tune
from tables import (
    DASH,
    f4,
    history_bias,
    table,
)

OUT = ROOT / "benchmarks" / "RESULTS.md"
DOCS = ROOT / "docs" / "results.md"
README = ROOT / "README.md"


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
    ("unisrec_sampled.json", unisrec_sampled),
    ("retrieval.json", retrieval),
    ("catalogue_changes.json", catalogue_changes),
    ("batch_recommend.json", batch_recommend),
    ("text_encoding*.json", text_encoding),
    ("features.json", features),
    ("output_layer.json", output_layer),
    ("data_efficiency_*.json", data_efficiency),
    ("transfer_probe_*.json", transfer_probe),
    ("pretrain_loss.json", pretrain_loss),
    ("scale.json", scale),
    ("train_throughput.json", train_throughput),
    ("tune_*.json", tune),
    ("cuda_check.json", cuda),
    ("ddp_scaling.json", ddp_scaling),
    ("defaults.json", defaults),
    ("defaults_candidate_*.json", defaults_candidate),
    ("auto_decisions.json", auto_decisions),
    ("history_bias.json", history_bias_section),
    ("encoders_*.json", encoders),
]
# the sections of docs/results.md (the README's Results until the README became a manual)
RESULTS_PAGE = ("sasrec_quality.json", "speed_vs_recbole.json", "unisrec.json", "unisrec_sampled.json",
                "item2vec_vs_gensim.json",
                "features.json", "output_layer.json", "serve_load.json", "eval_cost.json", "retrieval.json",
                "catalogue_changes.json", "batch_recommend.json",
                "data_efficiency_*.json", "transfer_probe_*.json", "pretrain_loss.json", "scale.json",
                "train_throughput.json", "tune_*.json",
                "cuda_check.json", "ddp_scaling.json", "defaults.json", "defaults_candidate_*.json",
                "auto_decisions.json", "history_bias.json", "encoders_*.json")
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
            data = json.loads(path.read_text())
            yield {**data, "_file": path.name} if isinstance(data, dict) else data  # which file, for its section
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
        m = median_run(cost)
        rows.append([f"full ranking, {cost['users']:,} users × {cost['items']:,} items", "synthetic",
                     f"{cost['threads']} threads, {cost['machine'].get('cpu_model') or 'CPU'}",
                     f"{m['seconds']:.1f} s, {m['fraction_of_peak']:.2f} of matmul peak",
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
    for r in ((load("batch_recommend.json") or {}).get("runs") or {}).values():
        rows.append([f"`seqrec recommend --users all`: top-{r['k']} for every user, to a file ({r['model']})",
                     r["dataset"], f"{r['users']:,} users", f"{r['users_per_s']:,.0f} users/s, "
                     f"{r['speed_up']:.0f} × one request at a time", "one request at a time: 1 ×"])
    deploy = load("serve_deploy.json")
    if deploy:
        r, load_ = deploy["result"], deploy["result"]["load"]
        rows.append([f"`seqrec serve --workers {r['workers']}`: a new run deployed under load (link switched, SIGHUP)",
                     f"{deploy['n_items']:,} items", "concurrency 8",
                     f"{load_['error_answers'] + load_['failed_after_retry']} failed of {load_['requests']:,} "
                     f"({load_['closed_before_answer_retried']} retried on a new connection); all workers on the "
                     f"new run after {r['switched_after_s']:.1f} s", DASH])
    moved = load("serve_deploy_catalogue.json")
    if moved:
        r = moved["result"]
        rows.append([f"`seqrec carry-log` + SIGHUP: a run with {r['n_items_b'] - moved['n_items']:,} more items "
                     "deployed while items are added by text", f"{moved['n_items']:,} items", "concurrency 8",
                     f"{r['items_added_found_after']:,} of {r['items_added']:,} added items kept; "
                     f"{r['add_failures'] + r['load']['error_answers'] + r['load']['failed_after_retry']} failed; "
                     f"{r['adds_refused_503']} additions refused (503) and retried", DASH])
    compaction = load("serve_compaction.json")
    if compaction:
        r = compaction["result"]
        rows.append([f"`seqrec compact-log` every {r['every_s']:g} s while 2 workers take "
                     f"{r['added']:,} items by text under load", f"{compaction['n_items']:,} items", "concurrency 8",
                     f"{r['add_failures'] + r['load_during_adds']['failed']} failed; {r['compactions']} compactions, "
                     f"each holding the log {r['compaction_ms_p50']:.0f} ms (median); "
                     f"{r['replay']['items_added_found']:,} of {r['added']:,} items in the replayed log", DASH])
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
             "Machines: 2 cores, no GPU (an Intel Xeon with AMX on some days, an AMD EPYC on others: each results "
             "file records its CPU, and a table measured apart says where); timings are noisy on these shared "
             "machines, so compare ratios measured in one run.", "", "## Headline", "", *headline("results.md"), ""]
    body = [line.replace("](results/", "](../benchmarks/results/") for line in rendered(RESULTS_PAGE)]
    return intro + body


def main() -> None:
    lines = ["# Benchmark results", "", "Generated by `benchmarks/report.py` from `benchmarks/results/*.json`; "
             "do not edit by hand. Machines: 2 cores, no GPU (an Intel Xeon with AMX on some days, an AMD EPYC on "
             "others: each results file records its CPU, and a table measured apart says where); timings are noisy "
             "on these shared machines, so compare ratios measured in one run.", "", *rendered()]
    OUT.write_text("\n".join(lines))
    DOCS.parent.mkdir(exist_ok=True)
    DOCS.write_text("\n".join(results_page()))
    inject(README, headline())
    print(f"wrote {OUT}, {DOCS} and the README's headline table")


if __name__ == "__main__":
    main()
