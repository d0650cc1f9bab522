"""The serving sections of the results pages: `seqrec serve` under load and the ANN indexes
(report.py renders them with the rest)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common import load_result
from tables import (
    header,
)

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
    at = d.get("measured_at", {}).get("recommend")
    lines += ["", (f"Measured at commit {at['commit']} on {at.get('cpu_model', 'this machine')}, {at['date']}."
                   if at else RECOMMEND_MEASURED)]
    lines += ["", f"Goal at concurrency 8: p50 < {SERVE_GOAL['p50_ms']:g} ms, p99 < {SERVE_GOAL['p99_ms']:g} ms and "
              f"at least {SERVE_GOAL['requests_per_s']:g} requests/s: "
              + (f"met by {'; '.join(f'“{i}”' for i in met)}" if met else "not met by any row")
              + (f"; not by {'; '.join(f'“{i}”' for i in rec if i not in met)}." if len(met) < len(rec) else "."),
              *_floor_here(d)]
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
              + (f"met by {'; '.join(f'“{x}”' for x in live_met)}." if live_met else "not met by any row."),
              *_recommend_before_after(), *_recommend_against(), *_start(d), *_live_before_after(),
              *_deletes_before_after(), *_workers(),
              *_compaction(), *_deploy(),
              *_deploy_catalogue(), "",
              *header(["session event at history length", "event, KV cache ms", "event, re-encoding ms", "speed-up",
                       "model alone, one cached step ms", "model alone, whole history ms", "speed-up"])]
    for length, r in sess.items():
        lines.append(f"| {length} | {r['kv_cache']:.2f} | {r['re_encode']:.2f} | {r['speedup']:.1f}× | "
                     f"{r['encoder_kv_cache']:.2f} | {r['encoder_re_encode']:.2f} | {r['encoder_speedup']:.1f}× |")
    lines += ["", "An event's time includes the exact top-10 over the whole catalogue, which the cache does not "
              "change; the model-alone columns show what the cache saves." + _when(d, "sessions"),
              *_shared_sessions(d)]
    return lines


def _when(d: dict[str, Any], part: str) -> str:
    """Where a part of serve_load.json was measured apart from the others: its commit and day."""
    at = d.get("measured_at", {}).get(part)
    on = f" on {at['cpu_model']}" if at and at.get("cpu_model") else ""
    return "" if at is None else (f" Measured at commit {at['commit']}{on} on {at['date']}, apart from the tables "
                                  "above "
                                  "(this machine's speed varies by day: compare these rows with each other).")


def _shared_sessions(d: dict[str, Any]) -> list[str]:
    rows = d.get("shared_sessions")
    if not rows:
        return []
    lines = ["", "Sessions spread over worker processes: `seqrec serve --workers N` (SASRec, exact top-10), the "
             "workers sharing one session store; "
             f"{rows['1']['sessions']:,} sessions of {rows['1']['events'] // rows['1']['sessions']} events, "
             f"{rows['1']['concurrency']} at a time, every event on a new connection (so with 2 workers the kernel "
             "picks which one answers); each answer then checked against POST /recommend on the same history "
             "(the same items in the same order, scores within 1e-4). One event from a worker whose cache "
             "lacks the events another worker took extends it by those (not one cached step). "
             "`python benchmarks/serve_load.py --parts shared_sessions`." + _when(d, "shared_sessions"), "",
             *header(["workers", "events", "failed", "differ from /recommend", "one cached step", "events/s",
                      "p50 ms", "p99 ms"])]
    for r in rows.values():
        lines.append(f"| {r['workers']} | {r['events']:,} | {r['failures']} | {r['differ_from_recommend']} | "
                     f"{r['cached_events']:,} | {r['events_per_s']:.0f} | {r['event_ms_p50']:.1f} | "
                     f"{r['event_ms_p99']:.1f} |")
    runs = _ab_runs("serve_load_sessions", SESSIONS_AB)
    if runs:
        lines += ["", "Session events in the batches: the same measurement at the commit before the change and at "
                  "the change, one after the other on one day (files "
                  + ", ".join(f"`results/serve_load_sessions_{c}.json`" for c, _, _ in runs) + ").", "",
                  *header(["commit", "session events", "workers", "events/s", "p50 ms", "p99 ms",
                           "differ from /recommend"])]
        lines += [f"| {commit} | {what} | {r['workers']} | {r['events_per_s']:.0f} | {r['event_ms_p50']:.1f} | "
                  f"{r['event_ms_p99']:.1f} | {r['differ_from_recommend']} |"
                  for commit, what, d in runs for r in d["shared_sessions"].values()]
    return lines


# the same live-catalogue measurement at two commits, one after the other on one day: results files
# serve_load_live_<commit>.json written by `serve_load.py --parts live --out ...` at each
LIVE_AB = (("ef2717e", "each add copies the tables (torch.cat)"),
           ("97730dc", "rows appended into stores that grow by doubling"))
LIVE_AB_ROWS = (("77ea71d", "index rows rebuilt over every row per add; encoder weights reordered per call"),
                ("49664e9", "index rows changed where the add touches them; encoder weights kept in oneDNN's layout"))
RECOMMEND_RERUN = "serve_load_recommend_rerun_640efd6.json"  # the /recommend part again, the same day
# the /recommend measurement at two commits, the same way: serve_load_recommend_<commit>.json
RECOMMEND_AB = (("c462e63", "one row at a time (the history-bias merge in a loop)"),
                ("2420f38", "the whole batch as padded tensors (Recommender.top_k_padded)"))
# the deletion measurement at two commits, the same way: serve_load_deletes_<commit>.json
DELETE_AB = (("1b5ca61", "inside the DELETE"), ("08f6a0d", "in the background"))


# the shared-sessions measurement at two commits, the same way: serve_load_sessions_<commit>.json
SESSIONS_AB = (("b48048f", "one search per event"), ("7d04731", "in the batches: one search for all"))


def _recommend_before_after() -> list[str]:
    runs = _ab_runs("serve_load_recommend", RECOMMEND_AB)
    if not runs:
        return []
    cpu = runs[-1][2]["machine"].get("cpu_model", "this machine")
    lines = ["", "Top-k of a batch of requests in tensors: the /recommend measurement above at the commit before the "
             "change and at the change, run one after the other on one day on an fp32-only "
             f"{cpu}, slower than the machine of the table above (compare these rows with each other; "
             "`serve_load.py --parts recommend --out ...`). Files: "
             + ", ".join(f"`results/serve_load_recommend_{c}.json`" for c, _, _ in runs) + ".", "",
             *header(["commit", "top-k of a batch", "index", "concurrency", "requests/s", "p50 ms", "p99 ms",
                      "failed"])]
    lines += [f"| {commit} | {what} | {index} | {c} | {r['requests_per_s']:.0f} | {r['p50_ms']:.2f} | "
              f"{r['p99_ms']:.2f} | {r['failed']} |"
              for commit, what, d in runs for index, rows in d["recommend"].items() for c, r in rows.items()]
    met = [f"{index} at {commit}" for commit, _, d in runs for index, rows in d["recommend"].items()
           if _serve_goal_met(rows.get("8"))]
    said = (f"met by {'; '.join(met)}." if met else "not met by any row (the service saturates its one core "
            "first: at concurrency 8, p50 is about 8 / requests/s).")
    return [*lines, "", f"The goal at concurrency 8 on this machine: {said}", *_floor()]


AGAINST_FILE = "serve_load_recommend_ab.json"  # serve_load.py --parts recommend --against CHECKOUT --out <this>
# the change of a file written before serve_load.py took --change
AGAINST_CHANGE = "Recommender.top_k cuts a batch's rows as lists at once, not as per-row tensor slices and masks"


def _recommend_against() -> list[str]:
    """The /recommend part at this commit and at another, their services in turn (`--against`)."""
    d = load_result(AGAINST_FILE)
    if not d or "recommend_against" not in d:
        return []
    theirs = d["recommend_against"]
    ours, before = d["machine"]["commit"], theirs["commit"]
    lines = ["", f"{theirs.get('change', AGAINST_CHANGE)}: the /recommend measurement above at {ours} and at "
             f"{before}, a service of each in turn for every row, {theirs['repeats']} times, in one run on "
             f"{d['machine'].get('cpu_model', 'this machine')}; each cell the run of median time "
             f"(`serve_load.py --parts recommend --against CHECKOUT --change TEXT --out results/{AGAINST_FILE}`).", "",
             *header(["index", "concurrency", f"requests/s at {before}", f"at {ours}", "ratio",
                      f"p50 ms at {before}", f"at {ours}", f"p99 ms at {before}", f"at {ours}"])]
    ratios = []
    for index, rows in d["recommend"].items():
        for c, r in rows.items():
            o = theirs["recommend"][index][c]
            ratios.append(r["requests_per_s"] / o["requests_per_s"])
            lines.append(f"| {index} | {c} | {o['requests_per_s']:.0f} | {r['requests_per_s']:.0f} | "
                         f"{ratios[-1]:.2f} × | {o['p50_ms']:.2f} | {r['p50_ms']:.2f} | {o['p99_ms']:.2f} | "
                         f"{r['p99_ms']:.2f} |")
    eight = [r["8"] for r in d["recommend"].values() if _serve_goal_met(r.get("8"))]
    lines += ["", f"Requests/s at {ours} against {before}: median ratio {sorted(ratios)[len(ratios) // 2]:.2f} × over "
              f"the {len(ratios)} rows. The goal at concurrency 8 at {ours} in this run: "
              + ("met." if eight else "not met by any row.")]
    return lines


def _start(d: dict[str, Any]) -> list[str]:
    r = d.get("start")
    if not r:
        return []
    med = r["median_s"]
    return ["", f"Starting a service on the onnx engine (`seqrec serve`, {d['n_items']:,}-item SASRec, {r['index']} "
            "index): seconds until it answers /health when it exports the encoder to ONNX (no graph kept: a new "
            "`$SEQREC_HOME` each start) and when it loads the graph an earlier start kept under `$SEQREC_HOME/onnx`, "
            f"{len(r['start_s']['kept'])} starts each, alternating. `python benchmarks/serve_load.py --parts start`."
            + _when(d, "start"), "", *header(["start", "median s", "each s"]),
            *(f"| {'exports the graph' if k == 'export' else 'loads the kept graph'} | {med[k]:.1f} | "
              f"{', '.join(f'{t:.1f}' for t in times)} |" for k, times in r["start_s"].items()),
            "", f"Keeping the graph takes {med['export'] - med['kept']:.1f} s off each start "
            f"({med['export'] / med['kept']:.1f} × faster)."]


# where the /recommend rows of serve_load.json were measured, from the file's history (they were written
# before serve_load.py dated its parts): `git log -- benchmarks/results/serve_load.json`, commit f71f3e8
RECOMMEND_MEASURED = ("Measured at commit 311a490 on the 2-core Intel Xeon (AMX) of that day, 2026-11-26 (the "
                      "file's history: written before serve_load.py dated its parts); the same rows at a later "
                      "commit on another machine are under \u201cThe HTTP stack alone\u201d below.")
FAST_PATH_FILE = "serve_load_fast_path.json"
FLOOR_FILE = "serve_load_floor.json"  # serve_load.py --parts recommend floor --out benchmarks/results/<this>


def _floor_here(d: dict[str, Any]) -> list[str]:
    """GET /health on the service of the last /recommend row, measured with those rows (`--parts recommend floor`)."""
    floor, at = d.get("floor"), d.get("measured_at", {})
    if not floor or "floor" not in at or at["floor"] != at.get("recommend"):
        return []  # (a floor of another day is under "The HTTP stack alone")
    last = list(d["recommend"])[-1]
    rows = ", ".join(f"concurrency {c}: {r['requests_per_s']:.0f} requests/s, p50 {r['p50_ms']:.2f} ms, "
                     f"p99 {r['p99_ms']:.2f} ms" for c, r in floor.items())
    share = d["recommend"][last]["8"]["requests_per_s"] / floor["8"]["requests_per_s"]
    return ["", f"The HTTP stack alone, GET /health (no model, no search) on the service of the “{last}” row right "
            f"after its /recommend load: {rows}; at concurrency 8 the HTTP stack takes {share:.0%} of that row's "
            "/recommend time on the server core."]


def _floor() -> list[str]:
    """GET /health beside POST /recommend in one run: what the HTTP stack alone costs."""
    d = load_result(FLOOR_FILE)
    if not d or "floor" not in d:
        return []
    rows = [("POST /recommend, " + index, r) for index, r in d["recommend"].items()] + [("GET /health", d["floor"])]
    at = d.get("measured_at", {}).get("floor")
    day = f", {at['date']}" if at else ""
    lines = ["", "The HTTP stack alone: GET /health (no model, no search) against POST /recommend, one service "
             f"after the other in one run on {d['machine'].get('cpu_model', 'this machine')} (commit "
             f"{d['machine']['commit']}{day}; `serve_load.py --parts recommend floor --out results/{FLOOR_FILE}`).",
             "",
             *header(["request", "concurrency", "requests/s", "p50 ms", "p99 ms", "failed"])]
    lines += [f"| {what} | {c} | {r['requests_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['failed']} |"
              for what, by_c in rows for c, r in by_c.items()]
    floor, best = d["floor"]["8"], max((r["8"] for r in d["recommend"].values()), key=lambda r: r["requests_per_s"])
    said = (f"At concurrency 8 a request that does nothing is answered at {floor['requests_per_s']:.0f} "
            f"requests/s, p50 {floor['p50_ms']:.2f} ms; the fastest /recommend at {best['requests_per_s']:.0f} "
            f"requests/s: the HTTP stack takes {best['requests_per_s'] / floor['requests_per_s']:.0%} of a "
            "/recommend's time on the server core, the model and the search the rest.")
    met = [index for index, r in d["recommend"].items() if _serve_goal_met(r.get("8"))]
    goal = (f"The goal at concurrency 8 in this run: met by {'; '.join(met)}." if met else
            "The goal at concurrency 8 in this run: not met by any row.")
    return [*lines, "", said, "", goal, *_fast_path()]


def _fast_path() -> list[str]:
    """POST /recommend answered beneath FastAPI (seqrec.serve.fast_route) against FastAPI's routing."""
    d = load_result(FAST_PATH_FILE)
    if not d or "fast_path" not in d:
        return []
    fp = d["fast_path"]
    labels = [k for k, v in fp.items() if isinstance(v, dict)]
    n = len(fp[labels[0]]["runs"])
    lines = ["", "The fast path: POST /recommend answered beneath FastAPI's routing (`seqrec.serve.fast_route`, the "
             "default) and by FastAPI's routing (`seqrec serve --no-fast-path`), the same answers; ivf index, onnx "
             f"engine, concurrency 8, a new service for each of {n} runs per row, alternating, in one run on "
             f"{d['machine'].get('cpu_model', 'this machine')} (commit {d['machine']['commit']}; "
             f"`serve_load.py --parts fast_path --out results/{FAST_PATH_FILE}`). Each row is its median run; the "
             "server's CPU is its process's user and system time over the run, both threads.", "",
             *header(["POST /recommend answered by", "requests/s", "p50 ms", "p99 ms", "server CPU ms per request",
                      "requests/s, every run", "failed"])]
    for label in labels:
        r = fp[label]["median"]
        every = ", ".join(f"{x['requests_per_s']:.0f}" for x in fp[label]["runs"])
        failed = sum(x["failed"] for x in fp[label]["runs"])
        lines.append(f"| {label} | {r['requests_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                     f"{r['server_cpu_ms_per_request']:.2f} | {every} | {failed} |")
    return [*lines, "", f"The fast path's throughput is {fp['throughput_ratio']:.2f}× FastAPI routing's, at "
            f"{fp['cpu_ratio']:.2f}× its CPU per request (medians)."]


def _live_before_after() -> list[str]:
    runs = _ab_runs("serve_load_live", LIVE_AB)
    if not runs:
        return []
    rerun = load_result(RECOMMEND_RERUN)
    slower = ""
    if rerun:
        r = rerun["recommend"]["ivf, onnx engine"]["8"]
        slower = (f" (the /recommend measurement of the table above, run again that day at commit "
                  f"{rerun['machine']['commit']}: ivf with the onnx engine at concurrency 8, "
                  f"{r['requests_per_s']:.0f} requests/s, "
                  f"p50 {r['p50_ms']:.1f} ms; file `results/{RECOMMEND_RERUN}`)")
    lines = ["", "Adding items without copying the tables: the live-catalogue measurement above at the commit "
             "before the change and at the change, run one after the other on one day. This machine served "
             f"slower that day than when the tables above were measured{slower}, so compare these rows with "
             "each other. Files: " + ", ".join(f"`results/serve_load_live_{c}.json`" for c, _, _ in runs) + ".", "",
             *header(["commit", "POST /items", *LIVE_COLUMNS])]
    return lines + _live_rows(runs) + _live_rows_changed()


# the columns after the commit and the change of the live-catalogue before/after tables (`_live_rows`)
LIVE_COLUMNS = ["index, engine", "POST /items p50 ms", "p99 ms", "failed", "/recommend requests/s meanwhile", "p50 ms"]


def _live_rows(runs: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    return _ab_rows(runs, ("live", "live_ivf_onnx"), lambda r, load: (
        f"{r['index']}, {r['engine']} | {r['post_ms_p50']:.1f} | {r['post_ms_p99']:.1f} | "
        f"{r['add_failures'] + load['failed']} | {load['requests_per_s']:.0f} | {load['p50_ms']:.1f}"),
        "load_during_adds")


def _live_rows_changed() -> list[str]:
    runs = _ab_runs("serve_load_live", LIVE_AB_ROWS)
    if not runs:
        return []
    cpu = runs[-1][2]["machine"].get("cpu_model") or runs[-1][2]["machine"]["cpu"]
    return ["", f"Changes at the rows they touch (`seqrec.serve.index_rows`) and the encoder's weights kept in "
            f"oneDNN's layout: the same measurement at the commit before and at the change, one after the other on "
            f"one day on {cpu}, one run each: differences of this size are within what this machine drifts from one "
            f"run to the next (the costs of one change are measured side by side, repeated, in \"A live catalogue's "
            f"changes against its size\" and in the text encoding's one-text-at-a-time note). Files: "
            + ", ".join(f"`results/serve_load_live_{c}.json`" for c, _, _ in runs) + ".", "",
            *header(["commit", "change", *LIVE_COLUMNS]), *_live_rows(runs), "",
            *[f"The /recommend goal at concurrency 8 while the items are added, at {c}: "
              + ("met" if _serve_goal_met(d["live_ivf_onnx"]["load_during_adds"]) else "not met") + " by ivf, onnx."
              for c, _, d in runs]]


def _deletes_before_after() -> list[str]:
    runs = _ab_runs("serve_load_deletes", DELETE_AB)
    if not runs:
        return []
    n = runs[0][2]["n_items"]
    lines = ["", f"Deleting items: {n:,}-item SASRec services, DELETE /items one item at a time on one connection "
             "while /recommend runs at concurrency 8 (the index named in the row serves both); past a quarter of the "
             "index's rows dead the index is rebuilt over the live items, inside the DELETE that made it due or in "
             "a background thread. The commits ran one after the other on one day (`serve_load.py --parts deletes "
             "--out ...`); files: " + ", ".join(f"`results/serve_load_deletes_{c}.json`" for c, _, _ in runs) + ".",
             "", *header(["commit", "rebuild", "index", "DELETEs", "failed", "DELETE p50 ms", "p99 ms", "max ms",
                          "over 100 ms", "rebuilds logged", "/recommend requests/s meanwhile", "p50 ms", "p99 ms",
                          "max ms", "failed"])]
    return lines + _ab_rows(runs, ("deletes_hnsw", "deletes_ivf"), lambda r, load: (
        f"{r['index']} | {r['deleted']:,} | {r['delete_failures']} | {r['delete_ms_p50']:.1f} | "
        f"{r['delete_ms_p99']:.1f} | {r['delete_ms_max']:,.0f} | {r['delete_ms_over_100']} | {r['rebuilds_logged']} | "
        f"{load['requests_per_s']:.0f} | {load['p50_ms']:.1f} | {load['p99_ms']:.1f} | {load['max_ms']:,.0f} | "
        f"{load['failed']}"), "load_during_deletes")


WORKERS_FILE = "serve_load_workers.json"  # serve_load.py --parts workers --out benchmarks/results/<this>


def _workers() -> list[str]:
    d = load_result(WORKERS_FILE)
    if d is None:
        return []
    w = d["workers"]
    rows = [w[k] for k in sorted(k for k in w if k.isdigit())]
    lines = ["", "Several worker processes, one live catalogue: the live-catalogue measurement above through a "
             "catalogue log (`seqrec serve --workers N --catalogue-log FILE`: each worker writes its changes there and "
             "follows the others'), with 1 and 2 workers on this 2-core machine, one run "
             f"(commit {d['machine']['commit']}; compare its rows with each other). With 2 workers an item counts as "
             "visible once 5 answers in a row, each on a new connection and so from whichever worker takes it, "
             "return it. `python benchmarks/serve_load.py --parts workers --out "
             f"benchmarks/results/{WORKERS_FILE}`.", "",
             *header(["workers", "index, engine", "failed POSTs", "failed, new item in the history",
                      "/recommend requests/s meanwhile", "p50 ms", "p99 ms", "failed", "POST /items p50 ms",
                      "visible after, median ms", "max ms", "within 1 s"])]
    for r in rows:
        load = r["load_during_adds"]
        lines.append(f"| {r['workers']} | {r['index']}, {r['engine']} | {r['add_failures']} | "
                     f"{r['new_in_history_failures']} | {load['requests_per_s']:.0f} | {load['p50_ms']:.1f} | "
                     f"{load['p99_ms']:.1f} | {load['failed']} | {r['post_ms_p50']:.1f} | "
                     f"{r['visible_s_p50'] * 1e3:.1f} | {r['visible_s_max'] * 1e3:.1f} | "
                     f"{r['visible_within_1s']:,} of {r['added']:,} |")
    restart = w["restart"]
    times = restart["start_s_median"]
    lines += ["", f"A restart after those {restart['changes']:,} additions: seconds from starting `seqrec serve` "
              "(1 worker, exact index) until it answers /health, the median of "
              f"{len(restart['start_s']['no log'])} starts each, with no log, with the log the additions wrote "
              f"({restart['log_bytes'] / 1e6:.1f} MB: each line holds its texts' encoder vectors, so a replay runs "
              "only the model's adaptor), and with the same log stripped of its vectors (as logs were before: "
              f"{restart['log_without_vectors_bytes'] / 1e6:.2f} MB, every text through the encoder again).", "",
              *header(["start", "seconds", "over no log"])]
    for label, seconds in times.items():
        lines.append(f"| {label} | {seconds:.1f} | {seconds - times['no log']:+.1f} s |")
    return lines


def _compaction() -> list[str]:
    d = load_result("serve_compaction.json")
    if d is None:
        return []
    r, replay = d["result"], d["result"]["replay"]
    load = r["load_during_adds"]
    return ["", f"Compacting the log while the workers keep it: the 2-worker measurement above again, with "
            f"`seqrec compact-log` run on the log every {r['every_s']:g} s from another process while the items "
            f"are added (commit {d['machine']['commit']}, on its own day: compare with its own row). A compaction "
            "holds the file's lock while it folds and replaces it, so changes wait for it; each worker then reads "
            "the old file to its end and goes on after the folded lines of the new one. Afterwards the log is "
            "replayed into a fresh model. `python benchmarks/serve_compaction.py`; file: "
            "`results/serve_compaction.json`.", "",
            *header(["compactions", "held the file, p50 ms", "max ms", "failed POSTs", "/recommend requests/s",
                     "p99 ms", "failed", "visible after, median ms", "max ms", "within 1 s",
                     "replayed: items added found", "items recommendable"]),
            f"| {r['compactions']} | {r['compaction_ms_p50']:.1f} | {r['compaction_ms_max']:.1f} | "
            f"{r['add_failures']} | {load['requests_per_s']:.0f} | {load['p99_ms']:.1f} | {load['failed']} | "
            f"{r['visible_s_p50'] * 1e3:.1f} | {r['visible_s_max'] * 1e3:.1f} | "
            f"{r['visible_within_1s']:,} of {r['added']:,} | {replay['items_added_found']:,} of {r['added']:,} | "
            f"{replay['items_active']:,} of {replay['items_expected']:,} |"]


def _switched(r: dict[str, Any]) -> str:
    """Seconds until every worker served run B, or never (a deploy benchmark's result)."""
    return "never" if r["switched_after_s"] is None else f"{r['switched_after_s']:.1f}"


def _deploy() -> list[str]:
    d = load_result("serve_deploy.json")
    if d is None:
        return []
    r, load = d["result"], d["result"]["load"]
    switched = _switched(r)
    return ["", f"Deploying a new run into the running service: `seqrec serve LINK --workers {r['workers']}` "
            f"(SASRec, {d['n_items']:,} items, exact top-10) serving run A through a link; under /recommend load "
            "at concurrency 8 the link is switched to run B and the service sent SIGHUP, on which the workers are "
            "replaced one at a time. Switched: every worker of run A gone and 10 answers in a row, each on a new "
            "connection, from run B (its version in /health). A request whose keep-alive connection a retiring "
            "worker closed before answering is sent again on a new connection, as HTTP clients do; failed: its "
            f"retry failed too. Commit {d['machine']['commit']}, on its own day. `python benchmarks/serve_deploy.py`; "
            "file: `results/serve_deploy.json`.", "",
            *header(["requests", "answered with an error", "closed before the answer, retried", "failed",
                     "requests/s", "p50 ms", "p99 ms", "max ms", "switched after s", "answers then from run B"]),
            f"| {load['requests']:,} | {load['error_answers']} | {load['closed_before_answer_retried']} | "
            f"{load['failed_after_retry']} | {load['requests_per_s']:.0f} | {load['p50_ms']:.1f} | "
            f"{load['p99_ms']:.1f} | {load['max_ms']:.1f} | {switched} | "
            f"{r['answers_equal_run_b']} of {r['answers_checked']} |"]


def _deploy_catalogue() -> list[str]:
    d = load_result("serve_deploy_catalogue.json")
    if d is None:
        return []
    r, load = d["result"], d["result"]["load"]
    switched = _switched(r)
    window = ("none" if r["refused_from_s"] is None
              else f"{r['refused_from_s']:.1f} to {r['refused_until_s']:.1f}")
    return ["", f"Deploying a run trained again, with {r['n_items_b'] - d['n_items']:,} more items, into a service "
            f"with a live catalogue: UniSRec, {d['n_items']:,} items, `--workers {r['workers']}` and a catalogue "
            "log; the /recommend load above, and beside it a client adding items by text one after another "
            "throughout (each on a new connection; a 503 sent again after its Retry-After). Before the switch, 5 "
            "items run B was trained with were added to run A by text and 2 items removed; then `seqrec carry-log "
            "LOG --to B`, the link switched and SIGHUP. Afterwards every item whose addition was answered is "
            f"looked up in the service. Commit {d['machine']['commit']}. `python benchmarks/serve_deploy.py "
            "--catalogue`; file: `results/serve_deploy_catalogue.json`.", "",
            *header(["items added (answered)", "found after the deploy", "additions failed", "refused (503), retried",
                     "refused from / until s after the carry started", "carry-log s", "run B's own texts kept",
                     "removals kept", "/recommend requests", "errors", "failed after retry", "switched after s"]),
            f"| {r['items_added']:,} | {r['items_added_found_after']:,} | {r['add_failures']} | "
            f"{r['adds_refused_503']} | {window} | {r['carry_s']:.1f} | {r['own_texts_kept']} of 5 | "
            f"{r['removed_kept']} of 2 | {load['requests']:,} | {load['error_answers']} | "
            f"{load['failed_after_retry']} | {switched} |"]


def _ab_runs(prefix: str, ab: tuple[tuple[str, str], ...]) -> list[tuple[str, str, dict[str, Any]]]:
    """(commit, what changed, results) of a measurement run at two commits (`<prefix>_<commit>.json`), or []
    unless both files are there."""
    runs = [(commit, what, load_result(f"{prefix}_{commit}.json")) for commit, what in ab]
    return [(c, w, d) for c, w, d in runs if d is not None] if all(d is not None for _, _, d in runs) else []


def _ab_rows(runs: list[tuple[str, str, dict[str, Any]]], keys: tuple[str, ...],
             cells: Callable[[dict[str, Any], dict[str, Any]], str], load_key: str) -> list[str]:
    """A table row per commit and results key: the commit, what changed, then `cells(row, its load)`."""
    return [f"| {commit} | {what} | {cells(d[key], d[key][load_key])} |" for commit, what, d in runs for key in keys]


def retrieval(d: dict[str, Any]) -> list[str]:
    from retrieval import table  # the script's own table: one renderer for its stdout and this page

    return ["## Retrieval: exact, FAISS IVF and HNSW", "",
            "Recall of each index against exact top-k (the model's scores, output bias included), build time, "
            "memory, single-query latency (1 thread) and batched throughput (256 queries, 2 threads). Yelp: item "
            "vectors and validation-user states of a SASRec run; synthetic: 1M clustered items of width 64 with "
            "unequal norms and a bias. Script: `benchmarks/retrieval.py`; file: `results/retrieval.json`; plot "
            "`results/retrieval.png` (recall@10 against latency as ef_search / n_probe vary).", "",
            table(d), "", "![recall against latency](results/retrieval.png)"]


def catalogue_changes(d: dict[str, Any]) -> list[str]:
    from catalogue_changes import table  # the script's own table: one renderer for its stdout and this page

    against = d.get("against")
    lines = ["## A live catalogue's changes against its size", "",
             "What one change costs the retriever (`Retriever.add / update / remove / restore`, one item each; a "
             "service makes it under the catalogue's lock, inside the POST or DELETE that asks for it): synthetic "
             "catalogues of width 64, 1 thread, the median and p99 over "
             f"{d['ops']} changes of each kind. Script: `benchmarks/catalogue_changes.py`; file: "
             f"`results/catalogue_changes.json`; {_measured(d)}."]
    if against:
        lines[-1] += (f" Beside it, in the same run, commit {against['commit']} ({against['change']}): for each row a "
                      f"process of each checkout in turn, {d['repeats']} times, each cell the median over them.")
    return [*lines, "", *table(d)]


def _measured(d: dict[str, Any]) -> str:
    m = d["machine"]
    return f"measured at commit {m['commit']} on {m.get('cpu_model') or m['cpu']}, {d['date']}"


def batch_recommend(d: dict[str, Any]) -> list[str]:
    from tables import table

    rows = []
    for name, r in d["runs"].items():
        rows.append([f"`{name}`{' (history bias)' if r['history_bias'] else ''}", f"{r['users']:,}",
                     f"{r['items']:,}", r["d"], f"{r['history_median']:g} / {r['history_max']:,}",
                     f"{r['batch_s']:.2f}", f"{r['users_per_s']:,.0f}", f"{r['one_at_a_time_ms_median']:.2f}",
                     f"{r['one_at_a_time_all_users_s']:.1f}", f"{r['speed_up']:.1f} ×",
                     f"{r['sample_mismatched']} of {r['sample']}", f"{r['cli_s']:.1f}"])
    return ["## Top-k for every user, to a file", "",
            "`seqrec recommend RUN --users all --out FILE` against one request at a time, on the same "
            f"{d['threads']} threads in one run: top-{next(iter(d['runs'].values()))['k']} for every user of the "
            "run's dataset from the whole history (exact index). `batch s`: the median over repeats of reading the "
            "histories and ranking every user (`seqrec.serve.batch`); `one at a time`: `Recommender.recommend` on a "
            "seeded sample of the users, its median, and its mean times the users (what a loop over them would "
            "take); `differ`: sampled users whose top-k differs from the batch's (items, or scores by more than "
            "1e-4); `CLI s`: the command once, end to end (start, model load, histories, top-k, Parquet written). "
            f"Runs trained with a time budget (their quality is not measured here). Commit {d['machine']['commit']}. "
            f"Script: `benchmarks/batch_recommend.py`; file: `results/batch_recommend.json`; command: "
            f"`{d['command']}`.", "",
            *table(["run", "users", "items", "d", "history median / max", "batch s", "users/s",
                    "one at a time, ms (median)", "one at a time, all users s", "speed-up", "differ", "CLI s"], rows)]
