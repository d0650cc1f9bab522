"""The transfer sections of the results pages: data efficiency, what pre-training carries, and
`seqrec tune` against the recipes (report.py renders them with the rest)."""

from __future__ import annotations

import statistics
from typing import Any

from common import RESULTS
from common import load_result as load
from tables import (
    DASH,
    f4,
    recorded,
    table,
    value_range,
    yes,
)


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
             "`-pNN`: patience NN epochs. " + _mixes(d) + "Test NDCG@10, median over "
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
            return recorded(p.get(key, (probe.get(name) or {}).get(key)))

        lines += ["", "Pre-trained models (`(name)` in the method column): `seqrec pretrain` on the CPU threads "
                  "shown (`pretrain.threads`), process peak RSS; text centred: `model.text_centre`; history bias "
                  "learnt: pre-trained with "
                  "`model.history_bias = true`, whose offsets fine-tuning and zero-shot start from; whitening init: "
                  "every adaptor expert started as an SVD whitening of the pre-training text (`model.whitening_init`;"
                  " – where the record predates the column); d: the model width (– where the record predates the "
                  "column: those models have the parameter count of d 64). Models that ran "
                  "a fixed number of steps (`pretrain.max_steps`, the steps `pretrained-games` made in its time "
                  "budget) beside other jobs have lower rates.", "",
                  *table(["model", "domains", "training events", "text centred", "history bias learnt",
                          "whitening init", "d", "parameters", "threads", "steps",
                          "epochs", "seconds", "sequences/s", "targets/s", "peak RSS MB"],
                         [[name, ", ".join(r["domain"] for r in p["data_card"]["domains"]),
                           f"{p['data_card']['training_events']:,}", flag(p, "text_centre", name),
                           flag(p, "history_bias", name), flag(p, "whitening_init", name),
                           str(p.get("d") or (probe.get(name) or {}).get("d") or DASH),
                           f"{p['n_parameters']:,}" if p.get("n_parameters") else DASH,
                           str(p["data_card"].get("pretrain", {}).get("threads", DASH)),
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
    start = ("SASRec's defaults (no config, as `seqrec tune --model sasrec`; its first trial is the defaults "
             "themselves)" if d.get("base") == "defaults" else "the recipe's config")
    intro = (f"A validation-only search (TPE, median pruning) from {start} on {d['dataset']}, then the "
             "best settings trained again (with refit) and tested once; the hand-made rows are the runs "
             "validation picked among the SASRec configurations tried. Script: `benchmarks/tune_vs_recipe.py`; "
             f"file: `results/{d.get('_file', 'tune_' + d['dataset'] + '.json')}`; command: `{d['command']}`.")
    if "threads_per_trial" in d:
        intro += f" Each trial ran on {d['threads_per_trial']} thread(s)" + (
            f", {d['jobs']} at a time." if "jobs" in d else ".")
    first = d.get("base_trial")
    if first and first.get("valid_ndcg@10") is not None and d.get("base") == "defaults":
        intro += (f" Trial 0 (the defaults, capped like every trial) validated at {f4(first['valid_ndcg@10'])}.")
    intro += (f" No trial trained longer than the budget × {d.get('jobs', 1)} / {d['min_trials']}."
              if "min_trials" in d else
              " This study predates the cap of each trial at its share of the budget (`--min-trials`).")
    got = t["best_run"]["test"]["ndcg@10"]
    verdicts = []
    for key, label in (("recipe", "against the recipe"), ("recipe_history_bias", "against the recipe + history bias")):
        if d.get(key):
            want = d[key]["test"]["ndcg@10"]
            verdicts.append(f"{label}: {got / want:.2f} × ({'met' if got >= want else 'not met'})")
    if d.get("seeds"):
        verdicts.append(seed_verdict(d))
    earlier = "" if "min_trials" in d else " (a study before the per-trial cap)"
    if d.get("study"):
        earlier += f" (study `{d['study']}`)"
    if d.get("space"):
        intro += " Searched: " + ", ".join(f"`{k}`" for k in d["space"]) + "."
    title = "from SASRec's defaults against the recipe" if d.get("base") == "defaults" else "against the recipe"
    return [f"## `seqrec tune` {title} on {d['dataset']}{earlier}", "", intro, "",
            *table(["run", "settings", "valid N@10", "test R@10", "test N@10"], rows), "",
            "Goal: the same or better test NDCG@10 than the hand-made recipe; " + "; ".join(verdicts) + "."]


def seed_verdict(d: dict[str, Any]) -> str:
    """The tuned settings against the recipe + history bias over every seed they were trained with."""
    tests: dict[str, list[float]] = {}
    for key, first in (("tuned", d["tune"]["best_run"]), ("recipe_history_bias", d["recipe_history_bias"])):
        seed = str(resolve_seed(first))
        runs = {seed: first["test"]["ndcg@10"], **{s: r["test_ndcg@10"] for s, r in d["seeds"][key].items()}}
        tests[key] = [runs[s] for s in sorted(runs)]
    seeds = sorted({str(resolve_seed(d["tune"]["best_run"])), *d["seeds"]["tuned"]})
    got, want = (statistics.median(tests[k]) for k in ("tuned", "recipe_history_bias"))
    spread = ", ".join(f"{k.replace('_', ' ')} {min(v):.4f}-{max(v):.4f}" for k, v in tests.items())
    return (f"over seeds {', '.join(seeds)} (`{d['seeds']['command']}`), median test N@10 {got:.4f} against "
            f"{want:.4f}: {got / want:.2f} × ({'met' if got >= want else 'not met'}; range {spread})")


def resolve_seed(run: dict[str, Any]) -> int:
    """The training seed of a results row with a config (42, the default, when it names none)."""
    return int(run.get("config", {}).get("train", {}).get("seed", 42))


def transfer_probe(d: dict[str, Any]) -> list[str]:
    """Validation NDCG@10 on the target of each pre-trained model and its parts, with no training."""
    target = d["target"]
    kinds = list(dict.fromkeys(k for r in d["runs"].values() for k in r["valid_ndcg@10"]))
    intro = (f"What a pre-trained UniSRec carries to {target} with no training: validation NDCG@10 of the "
             "pre-trained model (zero-shot), of the same never recommending items already in the history, with "
             "each adaptor expert re-centred on the target's mean text vector (runs pre-trained with "
             "`model.text_centre` centre every catalogue themselves), and of its adaptor or Transformer alone "
             "beside fresh parts (a learnt history bias goes with the Transformer). Steps: the pre-training "
             "optimiser steps; d: the model width (– where the record predates the column: d 64, the recipe's "
             "width until then). An untrained UniSRec scores "
             f"{f4(d['untrained_valid_ndcg@10'])}: its near-identity Transformer ranks items by text similarity to "
             "the history. Script: `benchmarks/transfer_probe.py`; file: "
             f"`results/transfer_probe_{target}.json`.")
    return [f"## Transfer: what pre-training carries to {target}", "", intro, "",
            *table(["pre-trained model", "domains", "steps", "text centred", "history bias learnt", "whitening init",
                    "d", *kinds],
                   [[name, ", ".join(r["domains"]), r.get("pretrain_steps", DASH), yes(r.get("text_centre"), "no"),
                     yes(r.get("history_bias"), "no"),
                     recorded(r.get("whitening_init")), str(r.get("d") or DASH),
                     *(f4(r["valid_ndcg@10"][k]) if k in r["valid_ndcg@10"] else DASH for k in kinds)]
                    for name, r in d["runs"].items()])]


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


def _mixes(d: dict[str, Any]) -> str:
    """What the `-mix` rows are, and the mixes validation kept in them."""
    mixed = [r["interpolation"] for r in d.get("runs", []) if r.get("interpolation")]
    if not mixed:
        return ""
    kept = [m["alpha"] for m in mixed]
    chosen = ", ".join(f"{a:g} × {kept.count(a)}" for a in sorted(set(kept), reverse=True))
    tried = ", ".join(sorted({a for m in mixed for a in m["valid"]}, key=float))
    return ("`-mix`: after fine-tuning, the weights a × fine-tuned + (1 − a) × pre-trained were validated for a in "
            f"{tried} and a mix kept where it beat both ends (`train.interpolate`, the fine-tuning default "
            f"since; the other fine-tuned rows have none); the weight a kept, over those runs: {chosen} (1: the "
            "fine-tuned model itself). ")


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
