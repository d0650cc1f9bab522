"""The sections on settings: the `auto` decisions, the defaults, the history bias and the encoder
choice (report.py renders them with the rest)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common import command_sets
from report_transfer import _share
from tables import (
    DASH,
    f4,
    header,
    num,
    row,
    table,
    yes,
)


def auto_decisions(d: dict[str, Any]) -> list[str]:
    """What the "auto" settings decide on every dataset (SASRec's; the other models share the rules)."""
    def cell(ds: list[dict[str, Any]], key: str) -> str:
        x = next((x for x in ds if x["key"] in (key, key.removeprefix("model."))), None)  # older files: no "model."
        if x is None:
            return DASH
        detail = {"model.loss": lambda: f"{x['epoch_output_seconds']:.3g} s/epoch",
                  "model.history_bias": lambda: f"repeat rate {x['repeat_rate']:.1%}",
                  "data.stride": lambda: f"{x['share_beyond_one_window']:.0%} beyond one window",
                  "train.batch_size": lambda: f"~{x['step_gib']:.2f} GiB a step"}.get(key)
        return f"{x['value']}" + (f" ({detail()})" if detail else "")

    rows = [[r["dataset"], f"{r['items']:,}", f"{r['interactions']:,}",
             *(cell(r["decisions"]["sasrec"], k) for k in ("model.loss", "train.sparse_items", "train.batch_size",
                                                          "model.history_bias", "data.stride", "data.jitter"))]
            for r in d["rows"] if "sasrec" in r["decisions"]]
    loss = next((x for r in d["rows"] for x in r["decisions"].get("sasrec", []) if x["key"] == "model.loss"), {})
    nominal = "nominal_gflops" in loss  # files before the fixed rate hold the one measured when deciding
    rate = loss.get("nominal_gflops", loss.get("matmul_gflops"))
    intro = ("What `seqrec train --model sasrec` with no config decides from each dataset's training split "
             "(`seqrec.train.auto`; GRU4Rec and BERT4Rec take the same loss and batch size rules, UniSRec and "
             "GRU4Rec the same history-bias rule). The loss: the full softmax unless its output layer would take "
             "more than 600 s per epoch at " + ("the nominal rate of the device" if nominal else
                                                  "the matmul rate measured when deciding")
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
             "before them (`results/defaults_previous.json`), validation / test." + _candidate_rows(d), "",
             *header(["dataset", "model", "device", "training defaults", "default valid / test N@10",
                      "previous default", "epochs", "time cap s", "stopped by the cap", "auto decisions",
                      "best row test N@10", "best row", "ratio", "goal met"])]
    ran = {(r["dataset"], r["model"]) for r in d["rows"]}
    no_text = sorted({r["dataset"] for r in d["rows"]} - {ds for ds, m in ran if m == "unisrec"})
    if no_text:  # a text model needs item text; these datasets have none (or only numeric tag ids)
        lines[2] += (" No UniSRec row on " + ", ".join(f"`{n}`" for n in no_text) + ": their items have no text "
                     "(../shared/data/README.md), and UniSRec refuses a catalogue without it. A row without a best "
                     "row (–) is a dataset and model that no other benchmark ran: nothing to compare with.")
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


def _candidate_rows(d: dict[str, Any]) -> str:
    """Rows run as a candidate with model settings that have since become the defaults."""
    sets = {(r["model"], tuple(f"{k}={v}" for k, v in command_sets(r["default"].get("command", "")).items()
                               if k.startswith("model.")))
            for r in d["rows"]}
    said = [f"the {model} rows were run as a candidate with " + " ".join(f"`{s}`" for s in found)
            for model, found in sorted(sets) if found]
    text = "; ".join(said)
    return (" " + text[:1].upper() + text[1:] + ", settings that are its defaults since (the runs they replaced are in "
            "the candidate table below).") if said else ""


def defaults_candidate(d: dict[str, Any]) -> list[str]:
    """A change of the defaults tried before it was made: each run beside the default run it would replace."""
    rows, compared = [], [r for r in d["rows"] if "valid_ratio" in r]

    def cell(x: dict[str, Any] | None) -> str:
        return f"{f4(x['valid_ndcg@10'])} / {f4(x['test_ndcg@10'])}" if x else DASH

    for r in d["rows"]:
        new = r.get("candidate")
        rows.append([r["dataset"], r["model"], _device(r.get("default") or {}), _device(new or {}),
                     cell(r.get("default")), cell(new), num(r.get("valid_ratio"), 3), num(r.get("test_ratio"), 3)])
    better = sum(r["valid_ratio"] > 1 for r in compared)
    sets = " ".join(f"`{s}`" for s in d["sets"])
    return [f"## A candidate default: {d['candidate']}", "",
            f"`seqrec train --model M` with no config and {sets}, beside the default run it would replace (the "
            "same time cap and thread where the default ran on this CPU; where it ran on a lent GPU, the candidate ran "
            "here under the command's `--budget`). "
            f"Validation prefers the candidate in {better} of {len(compared)} pairs. Script: "
            f"`benchmarks/defaults.py --candidate`; file: `results/defaults_candidate_{d['candidate']}.json`; "
            f"command: `{d['command']}`.", "",
            *table(["dataset", "model", "default on", "candidate on", "default valid / test N@10",
                    "candidate valid / test N@10", "valid ratio", "test ratio"], rows)]


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
    cap = command_sets(command).get("train.time_budget_s")
    return f"{float(cap):.0f}" if cap else DASH


def _train_defaults(t: dict[str, Any] | None) -> str:
    """What a defaults run trained with: None = before the models had training defaults of their own."""
    if t is None:
        return "previous (adam, no refit)"
    parts = [t["optimizer"] + (f" decay {t['weight_decay']:g}" if t["weight_decay"] else "")]
    parts += [f"ema {t['ema']:g}"] if t["ema"] else []
    return ", ".join(parts + (["refit"] if t["refit"] else []))
