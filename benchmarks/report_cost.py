"""The cost sections of the results pages: evaluation, scale and training throughput (report.py
renders them with the rest)."""

from __future__ import annotations

from typing import Any

from common import RESULTS, median_run
from common import load_result as load
from tables import DASH, f4, header, num, section, table

EVAL_COST_OTHER = "eval_cost_epyc.json"  # the same benchmark on the other machine: --out results/<this>
# a change measured against the commit before it (--against CHECKOUT --out results/<this>), on a later day
EVAL_COST_AB = "eval_cost_epyc_ab.json"


def eval_cost(d: dict[str, Any]) -> list[str]:
    files = [("eval_cost.json", d)] + [(name, f) for name in (EVAL_COST_OTHER, EVAL_COST_AB) if (f := load(name))]
    rows = []
    for name, f in files:
        m = median_run(f)
        rows.append(f"| {f['machine'].get('cpu_model') or f['machine']['cpu']} | {f['machine']['commit']} | "
                    f"{m['seconds']:.1f} | {m['gflops']:.0f} | {m['matmul_peak_gflops']:.0f} | "
                    f"{m['fraction_of_peak']:.2f} | {m['peak_rss_mb']:.0f} | {m['rss_before_mb']:.0f} | `{name}` |")
    compared = [(name, f["against"]) for name, f in files if "against" in f]
    notes = [f"`{name}` ran each repeat right after the same ranking at commit {a['commit']} (`--against`): median "
             f"{a['median_seconds']:.1f} s there, so this commit takes {a['seconds_ratio']:.2f}× its time on the same "
             "machine at the same moments (the machine's speed drifts between days: compare rows of one file, or "
             "the fraction of peak)." for name, a in compared]
    return ["## Evaluation cost: full ranking, blocked", "",
            f"{d['users']:,} users × {d['items']:,} items, D = {d['d']}, {d['threads']} threads, exact ranks "
            f"(a dense score matrix would take {d['naive_matrix_gb']:.0f} GB). The median of {len(d['runs'])} runs "
            "(that run's own numbers), each in a fresh process that also measures the matmul peak (a 4096² float32 "
            "product on the same threads); one row per machine it ran on. Script: `benchmarks/eval_cost.py`.", "",
            *header(["CPU", "commit", "wall s", "GFLOP/s", "matmul peak GFLOP/s", "fraction of peak", "peak RSS MB",
                     "RSS before ranking MB", "file"]), *rows, *(["", *notes] if notes else [])]


ITEM_GRADIENTS = {True: "sparse", False: "dense", None: "dense (before sparse_items)"}


def _gb(mb: float | None) -> str:
    return DASH if mb is None else f"{mb / 1024:.2f}"


def scale(d: dict[str, Any]) -> list[str]:
    """Cost against size on generated logs: prepare, an epoch, full evaluation, the IVF build."""
    rows = [[f"{r['interactions']:,}", f"{r['users']:,}", f"{r['items']:,}", f"{r['prepare']['total_s']:.1f}",
             f"{r['prepare']['peak_rss_mb'] / 1024:.2f}", ITEM_GRADIENTS.get(r["epoch"].get("sparse_items"), DASH),
             f"{r['epoch']['targets_per_s']:,.0f}",
             f"{r['epoch']['epoch_s']:.0f}" + (" (est.)" if r["epoch"]["extrapolated"] else ""),
             f"{r['evaluation']['all_users_s']:.0f}" + (" (est.)" if r["evaluation"]["extrapolated"] else ""),
             f"{r['evaluation']['gflop_per_s']:.0f}", f"{r['index']['build_s']:.1f}",
             *(_gb(r[stage].get("peak_rss_mb")) for stage in ("epoch", "evaluation", "index"))] for r in d["rows"]]
    intro = ("Generated logs (`seqrec.data.synthetic`: Zipf item popularity, log-normal history lengths; users = "
             "n/10, items = n/20). `prepare`: `seqrec data prepare` on the log as Parquet, in its own process (its "
             "peak RSS). Epoch: SASRec d 64, 2 blocks, sampled softmax with 1024 shared negatives, batch 256, 2 "
             "threads, set up and stepped as `seqrec train` does (item-table gradients: what its `auto` decides; "
             "rows without it ran before `train.sparse_items` and were dense); the rate of the first batches "
             "times every training target. Evaluation: exact full ranking "
             "of sampled validation users against every item, scaled to all users. IVF: FAISS build over the item "
             f"vectors. Script: `benchmarks/scale.py`; file: `results/scale.json`; command: `{d['command']}`. "
             "What grows faster than the data: full evaluation is users × items, and both grow with n, so it is "
             "quadratic by definition (the rate stays near the matmul peak); with dense item-table gradients the "
             "training rate falls as the item table grows, and the step profile below says why; the IVF build "
             "clusters N items into 2 √N lists (k-means: N × lists work per pass), so it grows as N^1.5.")
    lines = ["## Scale: cost against size", "", intro, "",
             *table(["interactions", "users", "items", "prepare s", "prepare peak GB", "item-table gradients",
                     "train targets/s", "epoch s",
                     "full evaluation s", "evaluation GFLOP/s", "IVF build s", "epoch peak GB",
                     "evaluation peak GB", "IVF build peak GB"], rows)]
    if (RESULTS / "scale.png").is_file():
        lines += ["", "![cost against size](results/scale.png)"]
    prof = load("step_profile.json")
    if prof:
        phases = list(prof["rows"][0]["median_s"])
        dense = {r["interactions"]: r for r in prof["rows"] if not r.get("sparse_items")}
        lines += ["", "Where a training step's time goes (the same model and logs, one step's phases, median over "
                  f"{prof['rows'][0]['steps']} steps after a warm-up, {prof['threads']} thread). With dense "
                  "gradients the backward pass grows with the item table, not with the batch: the embedding lookup "
                  "and the gathers of the targets and the sampled negatives each write a gradient the size of the "
                  "whole table, which autograd sums, and Adam and the clipping read every row of it. With "
                  "`train.sparse_items` (on by default for a sampled loss over 100,000 items or more) the table "
                  "gets sparse gradients and only the rows a batch touched are updated (`seqrec.train.sparse`), "
                  "in the same process on the same batches. Script: `benchmarks/step_profile.py`; file: "
                  f"`results/step_profile.json`; command: `{prof['command']}`.", "",
                  *table(["interactions", "items", "item table MB", "gradients", *(f"{p} ms" for p in phases),
                          "step ms", "dense / sparse"],
                         [[f"{r['interactions']:,}", f"{r['items']:,}", f"{r['item_table_mb']:.0f}",
                           "sparse" if r.get("sparse_items") else "dense",
                           *(f"{1e3 * r['median_s'][p]:.1f}" for p in phases), f"{1e3 * r['step_s']:.1f}",
                           f"{dense[r['interactions']]['step_s'] / r['step_s']:.1f} ×"
                           if r.get("sparse_items") and r["interactions"] in dense else DASH]
                          for r in prof["rows"]])]
    quality = load("sparse_items.json")
    if quality:
        lines += ["", "What the lazy updates cost in quality: SASRec with a sampled softmax on "
                  f"{quality['dataset']}, otherwise the defaults, one thread, with dense and with sparse item-table "
                  "gradients. No dataset here has the 100,000 items from which `auto` turns them on, so this is a "
                  "small catalogue, where they bring no speed. Script: `benchmarks/sparse_items.py`; file: "
                  f"`results/sparse_items.json`; command: `{quality['command']}`.", "",
                  *table(["train.sparse_items", "epochs (best)", "train s", "valid N@10", "test R@10", "test N@10"],
                         [[str(r["sparse_items"]).lower(), f"{r['epochs_run']} ({r.get('best_epoch', DASH)})",
                           f"{r['train_seconds']:.0f}", f4(r["valid"]["ndcg@10"]), f4(r["test"]["recall@10"]),
                           f4(r["test"]["ndcg@10"])] for r in quality["runs"].values() if "test" in r])]
    return lines


def _phases_ms(r: dict[str, Any]) -> str:
    p = r["median_phase_s"]
    return " / ".join(f"{1e3 * p[k]:.1f}" for k in ("forward", "backward", "optimizer"))


def train_throughput(d: dict[str, Any]) -> list[str]:
    """Targets/s and achieved FLOP/s of the training step, and the speed-up over the code the profile replaced."""
    peak = d["peak_gflop_per_s"]["used"]
    intro = ("`seqrec train --model sasrec` with no config (d_ff = 4 d; the `auto` decisions each dataset gets, "
             "recorded per row), `seqrec train --model unisrec` with no config, and the plain recipe of the RecBole "
             "comparison above (its run name), each through the library's own training step "
             "(`seqrec.train.loop.setup`: model, optimiser, feeder, weight average), "
             f"{d['rows'][0]['steps']} timed steps after a warm-up, {d['threads']} thread. "
             "GFLOP counts the matrix products and attention of forward + backward (torch's FlopCounterMode on "
             "the same batches, afterwards); the fraction is of the peak measured in the same run, a 4096² "
             f"product in the same precision on the same threads ({peak['float32']:.0f} GFLOP/s float32, "
             f"{peak['bf16']:.0f} bf16, the median of before and after the rows). bf16 rows train under "
             "`train.bf16=true` (autocast). Phases: median milliseconds of one step. Script: "
             f"`benchmarks/train_throughput.py`; file: `results/train_throughput.json`; command: `{d['command']}`.")
    if any("reference" in r for r in d["rows"]):
        intro += (" \"Replaced code\": each row measured again right after, in the same process, with the code "
                  "the profile replaced patched back in (`--compare`, `reference_paths` in the script). What the "
                  "profile showed and what changed: a history bias on the full softmax reduced each target's history "
                  "to distinct items with an (M, L, L) comparison and took the log-sum-exp in double precision, where "
                  "now the offsets are added onto their items' logits (`scatter_add`, as serving does) and the "
                  "cross-entropy is the fused one; the output bias is added inside the product (addmm); the dropout "
                  "mask's comparison writes straight into the activation dtype (a bool mask converted afterwards cost "
                  "twice the draw); UniSRec's whitening experts, which run over the whole item table every step, "
                  "compute x W - b W with the dropout scale after the product, so no centred or scaled copy of the "
                  "item-text table is made and the bias gradient is a vector product.")
    rows = []
    for r in d["rows"]:
        was = r.get("reference")
        config = {"default": "SASRec defaults", "unisrec": "UniSRec defaults"}.get(r["config"], r["config"])
        rows.append([r["dataset"], config, str(r["d"]), r["precision"], str(r["batch_size"]),
                     f"{r['loss']}{' + history bias' if r['history_bias'] else ''}, stride {r['stride']}",
                     f"{r['targets_per_s']:,.0f}", f"{was['targets_per_s']:,.0f}" if was else DASH,
                     f"{r['targets_per_s'] / was['targets_per_s']:.2f} ×" if was else DASH,
                     f"{r['gflop_per_step']:.2f}", f"{r['gflop_per_s']:.0f}", f"{r['fraction_of_peak']:.2f}",
                     _phases_ms(r)])
    return ["## Training throughput: targets/s and the fraction of the matmul peak", "", intro, "",
            *table(["dataset", "model", "d", "precision", "batch", "loss", "targets/s", "replaced code", "speed-up",
                    "GFLOP / step", "GFLOP/s", "fraction of peak", "forward / backward / optimizer ms"], rows)]


# the paths of benchmarks/text_encode.py the fastest is compared with, and how a note names each
COMPARED_PATHS = (("bf16, replaced batching", "the replaced batching"),
                  ("bf16, the model's own forward", "the model's own forward"),
                  ("bf16, fused on padded tokens", "the fused pass on padded tokens"),
                  ("bf16, fused, weights reordered per call", "the fused pass with its weights reordered per call"))


def _one_text(r: dict[str, Any]) -> str:
    """The note on texts encoded one at a time (text_encode.py's `one_text`), the fastest path against the others."""
    rows = r["one_text"]
    best = min(rows, key=lambda p: rows[p]["ms_p50"])
    others = ", ".join(f"{p} {x['ms_p50']:.2f} ms ({x['ms_p50'] / rows[best]['ms_p50']:.2f}×)"
                       for p, x in rows.items() if p != best)
    return (f"{r['dataset']}, one text at a time (as `POST /items` encodes a new item; "
            f"{next(iter(rows.values()))['texts']} texts timed after a warm-up, the paths in turn on each, 1 thread): "
            f"{best} p50 {rows[best]['ms_p50']:.2f} ms, p99 {rows[best]['ms_p99']:.2f} ms; {others}.")


def text_encoding(d: dict[str, Any]) -> list[str]:
    """One section per results/text_encoding*.json: each file is one machine's (they differ in native bf16)."""
    name = d.get("_file", "text_encoding.json")
    entries = [r for r in d.values() if isinstance(r, dict) and "runs" in r]
    cpu = next((r["machine"].get("cpu_model") for r in entries if r.get("machine", {}).get("cpu_model")), "")
    bf16 = any("bf16" in run.get("precision", "") for r in entries for run in r["runs"])
    where = f" on {cpu}" + (" with native bf16" if bf16 else ", float32 only")  # two AMD EPYC models differ in it
    lines = section(
        "Text encoding throughput (frozen encoder)" + (where if name != "text_encoding.json" else ""),
        f"Script: `benchmarks/text_encode.py`; file: `results/{name}`. Every item text of the "
        "dataset, mean pooling, max 128 tokens, batch size 64: batches of 64 × 64 padded tokens sorted by token "
        "length (`TextEncoder`), and in bf16 the batching it replaced (64 texts a batch sorted by characters, "
        "padded to the longest), and, where `TextEncoder` runs its fused bf16 pass (`seqrec.data.fused_bert`), "
        "the same batches through the model's own forward (“the model's own forward”) and through the fused pass "
        "with its products over the padded positions too (“fused on padded tokens”) or with the weights as the "
        "model keeps them, which oneDNN reorders into its blocked layout at every call (“weights reordered per "
        "call”); after one warm-up pass "
        "each; median of repeats that alternate the paths; "
        "the cache is not used. GFLOP/s counts 2 × the encoder's "
        "non-embedding parameters per token plus the attention products; the peak is a 4096² matmul in the "
        "same precision on the same threads, measured in the same run.",
        ["dataset", "encoder", "texts", "tokens", "threads", "precision", "texts/s", "tokens/s", "GFLOP/s",
         "fraction of matmul peak"])
    notes = []
    for r in entries:
        for run in r["runs"]:
            frac = run.get("fraction_of_peak")
            lines.append(f"| {r['dataset']} | {r['encoder']} | {r['texts']} | {r['tokens']} | {run['threads']} | "
                         f"{run.get('precision', 'fp32')} | {run['texts_per_s']:.0f} | {run['tokens_per_s']:.0f} | "
                         + (f"{run['gflops']:.0f} | {frac:.2f} |" if frac is not None else "– | – |"))
        cos, goal = r.get("bf16_cosine_distance"), r.get("goal_texts_per_s")
        if goal and "gflop_per_text" in r:
            best = max(r["runs"], key=lambda x: x["texts_per_s"])
            against = [(x, phrase) for path, phrase in COMPARED_PATHS
                       for x in r["runs"] if x["precision"] == path and x["threads"] == best["threads"]
                       and x is not best]
            need = goal * r["gflop_per_text"]
            verdict = ("met" if best["texts_per_s"] >= goal else
                       f"not met: at {r['gflop_per_text']:.2f} GFLOP per text it needs {need:.0f} GFLOP/s, "
                       f"{need / best['matmul_peak_gflops']:.1f}× the measured {best['precision']} matmul peak"
                       + (f", beyond what this encoder can do on {best['threads']} thread(s)"
                          if need > best["matmul_peak_gflops"] else ""))
            where = f"{r['dataset']} ({r['note']})" if r.get("note") else r["dataset"]
            precision = (f"bf16 vectors within {cos['max']:.1e} cosine distance of float32's (median "
                         f"{cos['median']:.1e}; goal ≤ {cos['goal_max']:g})" if cos else
                         "no native bf16 on this CPU, so float32 only (what `precision = \"auto\"` picks)")
            notes.append(f"{where}: {precision}; fastest "
                         f"{best['texts_per_s']:.0f} texts/s ({best['threads']} thread(s), {best['precision']}"
                         + "".join(f", {best['texts_per_s'] / x['texts_per_s']:.2f}× {phrase}" for x, phrase in against)
                         + "); "
                         f"goal {goal:,} texts/s {verdict}.")
        if r.get("one_text"):
            notes.append(_one_text(r))
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
                         num(median_run(cpu_eval)["seconds"], 1), num(median_run(cpu_eval)["gflops"] / 1e3, 2),
                         num(median_run(cpu_eval)["fraction_of_peak"], 2), num(median_run(cpu_eval)["peak_rss_mb"])]]
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


def pretrain_loss(d: dict[str, Any]) -> list[str]:
    """Pre-training's in-batch loss over the batch's distinct items against the one over every target's key."""
    before, after = "every target (before)", "distinct items"
    intro = (f"The step of `configs/pretrain.toml` (every position predicts its next item, batch "
             f"{d['recipe']['pretrain']['batch_size']}, d {d['recipe']['model']['d']}) on each domain alone, "
             f"{d['threads']} threads: the in-batch item loss against every target's key, an (M, M) matrix for M "
             "targets with the same item's other rows masked (the code before), and against the batch's distinct "
             "items, each once with its log count (`seqrec.nn.contrastive.info_nce_items`), the same loss at "
             f"(M, U) cost. Set-up: {d['setup']}. Loss and gradient difference: the largest between the two on "
             "the same batches, weights and random draws (the gradient's relative to its largest entry). Script: "
             f"`benchmarks/pretrain_loss.py`; file: `results/pretrain_loss.json`; command: `{d['command']}`.")
    rows = [[r["domain"], num(r[after]["targets_per_batch"]), num(r[after]["distinct_items_per_batch"]),
             num(r[before]["step_ms"]), num(r[after]["step_ms"]), num(r["speed_up"], 2, " ×"),
             num(r[before]["peak_rss_mb"]), num(r[after]["peak_rss_mb"]), f"{r['max_loss_difference']:.1e}",
             f"{r['max_gradient_difference']:.1e}"]
            for r in d["rows"]]
    return ["## Pre-training: the in-batch loss over the batch's distinct items", "", intro, "",
            *table(["domain", "targets / batch (M)", "distinct items / batch (U)", "step ms, every target",
                    "step ms, distinct items", "speed-up", "peak RSS MB, every target", "peak RSS MB, distinct items",
                    "loss difference", "gradient difference"], rows)]
