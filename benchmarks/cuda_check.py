"""seqrec on CUDA: the checks that need a GPU, with their timings, in one run.

Nothing in seqrec depends on a GPU; this script is what a session with one runs to show that the
CUDA paths give the CPU's answers and how fast they are:

- peak:     fp32 and bf16 matrix-product TFLOP/s measured in this run (the reference for fractions)
- ranking:  blocked full ranking on the GPU against the CPU path (exact ranks, planted ties,
            output bias, history offsets, filtered history) and 100k users x 100k items at D = 64
- train:    `seqrec train` with the ml-100k SASRec recipe on CUDA, fp32 and bf16, and SASRec d = 256
            throughput; test metrics beside the CPU row of zoo.json
- ddp:      the same recipe under torchrun with NCCL (as many processes as GPUs)
- serve:    a CUDA-loaded run against the same run on the CPU (top-k), sessions with the KV cache
            against re-encoding, the HTTP app's /recommend, and single-request latency
- unisrec:  the Scientific UniSRec recipe trained on CUDA (when that dataset is prepared)
- profile:  one training step of the ml-100k recipe under the torch profiler (syncs, top operators)

    SEQREC_HOME=benchmarks/work python benchmarks/cuda_check.py [--only ranking,train] [--out FILE]
    python benchmarks/cuda_check.py --tiny --device cpu    # the same code on small sizes, any machine
    python benchmarks/cuda_check.py --merge A.json B.json  # sections run in separate calls, one file
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from common import RESULTS, ROOT, machine, train_run, write_result

SECTIONS = ("peak", "ranking", "train", "ddp", "serve", "unisrec", "profile")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Median seconds of `fn` after one warm-up."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak(device: torch.device, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        out[f"{name}_tflops"] = 2 * n**3 / timed(functools.partial(torch.matmul, a, b), device, 5) / 1e12
    out["tf32_allowed"] = bool(torch.backends.cuda.matmul.allow_tf32)
    return out


def planted(users: int, items: int, d: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random states and items with exact ties: every 7th user's target has copies elsewhere in the
    catalogue, an output bias, and histories with score offsets (some at the target)."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(items + 1, d, generator=g)
    bias = torch.randn(items + 1, generator=g) * 0.1
    h = torch.randn(users, d, generator=g)
    target = torch.randint(1, items + 1, (users,), generator=g)
    for u in range(0, users, 7):
        copies = torch.randint(1, items + 1, (3,), generator=g)
        emb[copies], bias[copies] = emb[target[u]].clone(), bias[target[u]].clone()
    history = torch.randint(0, items + 1, (users, 20), generator=g)
    history[::5, -1] = target[::5]
    offsets = torch.randn(users, 20, generator=g) * (history != 0)
    return {"h": h, "target": target, "emb": emb, "bias": bias, "history": history, "offsets": offsets}


def boundary_margin(p: dict[str, torch.Tensor], u: int, bias: bool) -> float:
    """For a user ranked differently on two devices: how far (in units of the tie tolerance) the
    competitor nearest the tie boundary lies from it, in float64. Well under 1e-2 means a competitor
    sits within float error of the boundary, where any two summation orders may disagree by one rank
    (history offsets are left out: they move at most 20 of the user's items)."""
    from seqrec.eval.ranking import tie_tolerance

    h, emb, t = p["h"][u].double(), p["emb"].double(), int(p["target"][u])
    scores = emb @ h + (p["bias"].double() if bias else 0)
    magnitude = (h.abs() * emb[t].abs()).sum() + (p["bias"][t].abs().double() if bias else 0)
    tol = tie_tolerance(magnitude.float().reshape(1), h.numel()).double()[0]
    others = torch.cat([scores[1:t], scores[t + 1:]])
    return float((others - (scores[t] - tol)).abs().min() / tol)


def ranking(device: torch.device, tiny: bool, fp32_tflops: float) -> dict[str, Any]:
    from seqrec.eval.ranking import RankRequest, rank_targets, stream_ranks, user_chunk_size

    p = planted(600 if tiny else 4000, 900 if tiny else 20_000, 64)
    on = {k: v.to(device) for k, v in p.items()}
    cases = {"plain": {}, "bias": {"bias": True}, "offsets": {"bias": True, "offsets": True},
             "filter_seen": {"bias": True, "filter": True}}
    equal = {}
    for name, case in cases.items():
        def run(t: dict[str, torch.Tensor], case: dict[str, bool] = case) -> torch.Tensor:
            return rank_targets(t["h"], t["target"], t["emb"], t["bias"] if case.get("bias") else None,
                                history=t["history"] if case.get("offsets") or case.get("filter") else None,
                                filter_seen=bool(case.get("filter")),
                                offsets=t["offsets"] if case.get("offsets") else None).cpu()
        cpu, dev = run(p), run(on)
        differ = torch.nonzero(cpu != dev).flatten().tolist()
        equal[name] = {"users": len(cpu), "mismatches": len(differ),
                       "max_abs_rank_difference": int((cpu - dev).abs().max()),
                       "boundary_margins": [boundary_margin(p, u, bool(case.get("bias"))) for u in differ]}
    users, items, d = (2000, 2000, 64) if tiny else (100_000, 100_000, 64)
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(items + 1, d, generator=g).to(device)
    h_all = torch.randn(users, d, generator=g).to(device)
    target = torch.randint(1, items + 1, (users,), generator=g).to(device)
    chunk = users if device.type == "cuda" else user_chunk_size(items)

    def full() -> Any:
        return stream_ranks((RankRequest(h_all[i:i + chunk], target[i:i + chunk]) for i in range(0, users, chunk)),
                            emb)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = timed(full, device, 3)
    tflops = 2 * users * (items + 1) * d / seconds / 1e12
    out = {"equal_to_cpu": equal, "users": users, "items": items, "d": d, "seconds_median": seconds,
           "tflops": tflops, "fraction_of_fp32_peak": tflops / fp32_tflops}
    if device.type == "cuda":
        out["peak_gpu_memory_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def train(out: Path, device: str, tiny: bool) -> dict[str, Any]:
    budget = ["--set", "train.epochs=2"] if tiny else []
    base = [f"train.device={device}", *budget[1::2]]
    res = {"fp32": train_run(out, "sasrec-fp32", "ml-100k", "configs/ml-100k-sasrec.toml", base),
           "bf16": train_run(out, "sasrec-bf16", "ml-100k", "configs/ml-100k-sasrec.toml", [*base, "train.bf16=true"])}
    # positions counted from the start: the layout whose sessions keep a KV cache (`serve` uses this run)
    wide = [*base, "model.d=256", "model.d_ff=1024", "model.positions_from=start", "train.epochs=3",
            "train.patience=100"]
    res["d256"] = train_run(out, "sasrec-d256", "ml-100k", "configs/ml-100k-sasrec.toml", wide)
    return res


def ddp(out: Path, device: str, tiny: bool) -> dict[str, Any]:
    n = max(torch.cuda.device_count(), 1) if device == "cuda" else 2
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
    sets = [f"train.device={device}", *(["train.epochs=2"] if tiny else [])]
    res = train_run(out, f"sasrec-ddp{n}", "ml-100k", "configs/ml-100k-sasrec.toml", sets, launcher)
    res["processes"] = n
    res["backend"] = "nccl" if device == "cuda" else "gloo"
    return res


def serve(runs: Path, device: str) -> dict[str, Any]:
    import numpy as np
    from fastapi.testclient import TestClient

    from seqrec.data.dataset import PreparedDataset
    from seqrec.serve.app import create_app
    from seqrec.serve.recommender import Recommender
    from seqrec.serve.sessions import Sessions

    run, kv_run = runs / "sasrec-fp32", runs / "sasrec-d256"
    for name, sets in (("sasrec-fp32", []), ("sasrec-d256", ["model.positions_from=start"])):
        if not (runs / name / "results.json").is_file():  # `train` not run first: a short run will do
            train_run(runs, name, "ml-100k", "configs/ml-100k-sasrec.toml",
                      [f"train.device={device}", "train.epochs=5", *sets])
    gpu, cpu = Recommender.from_run(run, device=device), Recommender.from_run(run, device="cpu")
    data = PreparedDataset.load(_dataset_dir("ml-100k"))
    raw = gpu.catalogue.raw_ids
    seqs = [data.items[data.offsets[u]:data.offsets[u + 1]].tolist()
            for u in range(0, data.n_users, max(data.n_users // 200, 1))]
    histories = [[raw[i - 1] for i in s[-60:]] for s in seqs if len(s) > 1]
    same_items = same_scores = 0
    worst = 0.0
    for hist in histories:
        a, b = gpu.recommend(hist, k=10), cpu.recommend(hist, k=10)
        same_items += [r.item for r in a] == [r.item for r in b]
        diff = max(abs(x.score - y.score) for x, y in zip(a, b, strict=True))
        worst, same_scores = max(worst, diff), same_scores + (diff < 1e-4)
    kv = Recommender.from_run(kv_run, device=device)  # positions from the start: sessions keep a KV cache
    sessions, kv_worst, cached = Sessions(kv), 0.0, 0
    for n, hist in enumerate(histories[:20]):
        for j, item in enumerate(hist):
            view = sessions.add_event(f"s{n}", item, k=10)
            cached += view.cached
            ref = kv.recommend(hist[: j + 1], k=10)
            if [r.item for r in view.recommendations] != [r.item for r in ref]:
                kv_worst = max(kv_worst, float("inf"))
            kv_worst = max(kv_worst, max(abs(x.score - y.score)
                                         for x, y in zip(view.recommendations, ref, strict=True)))
    client = TestClient(create_app(gpu))
    app_equal = 0
    for hist in histories[:50]:
        body = client.post("/recommend", json={"history": hist, "k": 10}).json()
        app_equal += [r["item"] for r in body["items"]] == [r.item for r in gpu.recommend(hist, k=10)]
    lat = []
    for hist in histories[:100]:
        t0 = time.perf_counter()
        gpu.recommend(hist, k=10)
        lat.append(time.perf_counter() - t0)
    return {"histories": len(histories), "topk_items_equal_to_cpu": same_items, "scores_within_1e-4": same_scores,
            "max_score_difference": worst, "session_histories": min(20, len(histories)),
            "session_events_cached": cached, "session_vs_recommend_max_score_difference": kv_worst,
            "app_recommend_equal": app_equal, "app_checked": min(50, len(histories)),
            "recommend_latency_ms_p50": float(np.percentile(lat, 50) * 1e3),
            "recommend_latency_ms_p99": float(np.percentile(lat, 99) * 1e3)}


def _dataset_dir(name: str) -> Path:
    """Where the `seqrec train` runs of this script find `name`: $SEQREC_HOME's prepared datasets."""
    from seqrec.data.fetch import seqrec_home

    return seqrec_home() / "prepared" / name


def step_profile(device: str, tiny: bool) -> dict[str, Any]:
    """Where a training step of the ml-100k SASRec recipe spends its time: 40 steps under the torch
    profiler after 10 of warm-up; the host-device synchronisations a step makes and the top operators."""
    from torch.profiler import ProfilerActivity, profile

    from seqrec.config import load_toml, resolve
    from seqrec.data.batching import Batch
    from seqrec.data.dataset import PreparedDataset
    from seqrec.train.loop import setup, train_epoch

    cfg = resolve(load_toml(ROOT / "configs" / "ml-100k-sasrec.toml"), [f"train.device={device}",
                                                                         "train.progress=false"])
    data = PreparedDataset.load(_dataset_dir("ml-100k"))
    dev = torch.device(device)
    model, opt, batches, step = setup(cfg, data, dev)

    class Head:  # the first n batches of an epoch
        def __init__(self, n: int) -> None:
            self.n, self.n_targets = n, 0

        def __len__(self) -> int:
            return self.n

        def __iter__(self) -> Iterator[Batch]:
            return itertools.islice(iter(batches), self.n)

    n = 5 if tiny else 40
    train_epoch(model, Head(10), opt, cfg, dev, 1, step)
    sync(dev)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        train_epoch(model, Head(n), opt, cfg, dev, 1, step)
        sync(dev)
    per_step = (time.perf_counter() - t0) / n
    events = prof.key_averages()
    syncs = {e.key: e.count for e in events if "Synchronize" in e.key or e.key in ("aten::item", "aten::nonzero",
                                                                              "aten::_local_scalar_dense")}
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    device_ms = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e3 / n
    return {"steps": n, "ms_per_step": per_step * 1e3, "device_busy_ms_per_step": device_ms,
            "syncs_per_step": {k: v / n for k, v in syncs.items()},
            "top_self_cpu": [{"op": e.key, "ms_per_step": e.self_cpu_time_total / 1e3 / n,
                              "calls_per_step": e.count / n} for e in top]}


def unisrec(out: Path, device: str, tiny: bool) -> dict[str, Any]:
    if not (_dataset_dir("amazon-scientific-unisrec") / "text_cache").is_dir():
        return {"skipped": "amazon-scientific-unisrec is not prepared with its text cache"}
    sets = [f"train.device={device}", *(["train.epochs=2"] if tiny else [])]
    res = train_run(out, "unisrec-scientific", "amazon-scientific-unisrec",
                    "benchmarks/configs/unisrec-amazon-scientific-unisrec.toml", sets)
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--only", default=",".join(SECTIONS), help="comma-separated: " + ",".join(SECTIONS))
    p.add_argument("--tiny", action="store_true", help="small sizes and 2 epochs (a check of the script)")
    p.add_argument("--out", type=Path, help="result file (default benchmarks/results/cuda_check.json)")
    p.add_argument("--runs", type=Path, help="where the runs go (default a folder beside the result)")
    p.add_argument("--merge", type=Path, nargs="+", help="join result files of separate runs (later sections win)")
    args = p.parse_args()
    if args.merge:
        merged: dict[str, Any] = {"commands": []}
        for f in args.merge:
            part = json.loads(f.read_text())
            merged["commands"].append(part.pop("command"))
            merged.update(part)
        write_result(args.out or RESULTS / "cuda_check.json", merged)
        return
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this script checks seqrec on a GPU (--device cpu --tiny checks the script)")
    only = args.only.split(",")
    out = args.out or RESULTS / ("cuda_check_tiny.json" if args.tiny else "cuda_check.json")
    runs = args.runs or out.parent / "cuda_runs"
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                              "machine": machine(), "command": " ".join(sys.argv)}
    fp32 = peak(device, 512 if args.tiny else 8192)
    if "peak" in only:
        result["peak"] = fp32
    steps: dict[str, Callable[[], Any]] = {
        "ranking": lambda: ranking(device, args.tiny, fp32["fp32_tflops"]),
        "train": lambda: train(runs, args.device, args.tiny),
        "ddp": lambda: ddp(runs, args.device, args.tiny),
        "serve": lambda: serve(runs, args.device),
        "unisrec": lambda: unisrec(runs, args.device, args.tiny),
        "profile": lambda: step_profile(args.device, args.tiny),
    }
    for name, step in steps.items():
        if name not in only:
            continue
        t0 = time.perf_counter()
        try:
            result[name] = step()
        except Exception as exc:  # one broken section is reported, the others still run
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
        result[name]["section_seconds"] = time.perf_counter() - t0
        print(name, json.dumps(result[name])[:600], flush=True)
        write_result(out, result)
    print(f"-> {out}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
