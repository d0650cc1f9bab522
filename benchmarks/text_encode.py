"""Text-encoding throughput of the frozen encoder (seqrec.data.text.TextEncoder) on real item texts.

Encodes every item text of each dataset (as `seqrec text encode` builds them) with the default
encoder, mean pooling, max length 128, batch size 64 (batches of 64 x 64 padded tokens, sorted by
token length, TextEncoder's path), once per thread count and precision: float32, and bfloat16 where
the CPU computes it natively (what `precision = "auto"` picks there); and, in bfloat16, the batching
it replaced (64 texts a batch, sorted by characters, padded to the batch's longest) and, where
TextEncoder runs the fused bf16 pass (seqrec.data.fused_bert), its batching through the model's own
forward instead, the fused pass on the padded tokens too (fused_bert.PACK_TOKENS off) and with the
weights as the model keeps them, reordered by oneDNN at every call (fused_bert.PREPACK_WEIGHTS off). Repeats
alternate the paths, so that the machine's noise falls on all; texts/s and tokens/s are medians.
Also: how far the bf16 vectors are from the float32 ones (cosine distance), the achieved GFLOP/s (2
x the encoder's non-embedding parameters per token, attention products added) against a square
matmul in the same precision measured in the same run. The cache is not touched.
Writes benchmarks/results/text_encoding.json.

    python benchmarks/text_encode.py amazon-scientific-unisrec yelp-p5 --threads 1 2
    python benchmarks/text_encode.py tiny --tiny --out /tmp/t.json   # seconds; what the test suite runs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import RESULTS, machine, matmul_gflops, prepared, write_result

import seqrec.data.fused_bert as fused_bert
from seqrec.data.text import TextEncoder, item_texts, native_bf16, resolve_encoder

GOAL_TEXTS_PER_S = 1000  # issue 18, on this 2-core machine
GOAL_COSINE = 1e-3


def flops_per_text(encoder: TextEncoder, lengths: list[int]) -> float:
    """Mean FLOPs of one text: 2 x the layers' parameters (no embeddings, no pooler) per token, plus the
    attention products (QK^T and AV: 4 T^2 D per layer) at the text's own length (batches are length-sorted)."""
    model = encoder.model
    outside = [m for m in (getattr(model, "embeddings", None), getattr(model, "pooler", None)) if m is not None]
    params = sum(p.numel() for p in model.parameters()) - sum(p.numel() for m in outside for p in m.parameters())
    cfg = model.config
    t = np.asarray(lengths, dtype=np.float64)
    return float(np.mean(2 * params * t + 4 * t**2 * cfg.hidden_size * cfg.num_hidden_layers))


REPLACED = "bf16, replaced batching"
UNFUSED = "bf16, the model's own forward"  # TextEncoder's batching without the fused pass (seqrec.data.fused_bert)
UNPACKED = "bf16, fused on padded tokens"  # the fused pass with its products over the padding too
UNPREPACKED = "bf16, fused, weights reordered per call"  # before the weights were kept in oneDNN's layout


@contextlib.contextmanager
def fused_switch_off(name: str) -> Iterator[None]:
    """fused_bert's switch `name` (PACK_TOKENS, PREPACK_WEIGHTS) off inside the block: the pass as it was before."""
    kept = getattr(fused_bert, name)
    setattr(fused_bert, name, False)
    try:
        yield
    finally:
        setattr(fused_bert, name, kept)


def unpacked(encoder: TextEncoder, texts: list[str]) -> np.ndarray:
    """The fused pass as it was before it packed a batch's real tokens (fused_bert.PACK_TOKENS)."""
    with fused_switch_off("PACK_TOKENS"):
        return encoder.encode(texts, batch_size=64)


def plain_weights_encoder() -> TextEncoder:
    """A bf16 TextEncoder whose fused pass keeps the weights as the model has them, which oneDNN reorders
    into its blocked layout at every call (fused_bert.PREPACK_WEIGHTS off when the pass is made)."""
    with fused_switch_off("PREPACK_WEIGHTS"):
        return TextEncoder(resolve_encoder("default"), precision="bf16")


@torch.no_grad()
def replaced_batching(encoder: TextEncoder, texts: list[str], batch_size: int = 64) -> np.ndarray:
    """The batching TextEncoder used before: batch_size texts a batch, sorted by characters, each batch padded
    to its longest text by the tokenizer."""
    order = np.argsort([-len(t) for t in texts], kind="stable")
    out = np.zeros((len(texts), encoder.dim), dtype=np.float32)
    for lo in range(0, len(texts), batch_size):
        rows = order[lo : lo + batch_size]
        tok = encoder.tokenizer([texts[i] for i in rows], padding=True, truncation=True, max_length=128,
                                return_tensors="pt")
        hidden = encoder.model(**tok).last_hidden_state.float()
        m = tok["attention_mask"].unsqueeze(-1).float()
        out[rows] = ((hidden * m).sum(1) / m.sum(1).clamp(min=1)).numpy()
    return out


def measure(name: str, threads: list[int], repeats: int, limit: int, peak_n: int = 4096,
            texts: list[str] | None = None) -> dict[str, Any]:
    """The measurement on dataset `name`'s item texts (or on `texts`, when given)."""
    if texts is None:
        texts = [t for t in item_texts(prepared(name).item_table) if t][:limit]
    encoders = {"fp32": TextEncoder(resolve_encoder("default"), precision="fp32")}
    if native_bf16("cpu"):
        encoders["bf16"] = TextEncoder(resolve_encoder("default"), precision="bf16")
        if encoders["bf16"].fused is not None:
            encoders[UNFUSED] = TextEncoder(resolve_encoder("default"), precision="bf16")
            encoders[UNFUSED].fused = None
            plain = plain_weights_encoder()
            if plain.fused is not None:
                encoders[UNPREPACKED] = plain
    ref = encoders["fp32"]
    lengths = [len(ids) for ids in ref.tokenizer(texts, truncation=True, max_length=128)["input_ids"]]
    per_text = flops_per_text(ref, lengths)
    out: dict[str, Any] = {"dataset": name, "texts": len(texts), "tokens": sum(lengths),
                           "encoder": "/".join(Path(ref.source).parts[-2:]), "pooling": "mean",
                           "max_length": 128, "batch_size": 64, "gflop_per_text": per_text / 1e9,
                           "goal_texts_per_s": GOAL_TEXTS_PER_S, "runs": []}
    vectors = {p: enc.encode(texts, batch_size=64) for p, enc in encoders.items()}
    if "bf16" in vectors:
        a, b = vectors["fp32"], vectors["bf16"]
        dist = 1 - (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        out["bf16_cosine_distance"] = {"max": float(dist.max()), "median": float(np.median(dist)),
                                       "goal_max": GOAL_COSINE}
        out["bf16_fused"] = encoders["bf16"].fused is not None
    paths = {p: (lambda enc=enc: enc.encode(texts, batch_size=64)) for p, enc in encoders.items()}
    if "bf16" in encoders:
        paths[REPLACED] = lambda: replaced_batching(encoders["bf16"], texts)
        if encoders["bf16"].fused is not None:
            paths[UNPACKED] = lambda: unpacked(encoders["bf16"], texts)
    for n in threads:
        torch.set_num_threads(n)
        by_dtype = {d: matmul_gflops(n, n=peak_n, dtype=d) for d in {torch.float32 if p == "fp32" else torch.bfloat16
                                                           for p in paths}}
        peaks = {p: by_dtype[torch.float32 if p == "fp32" else torch.bfloat16] for p in paths}
        seconds: dict[str, list[float]] = {p: [] for p in paths}
        for run in paths.values():
            run()  # warm-up: the math library builds its kernels for each batch shape once
        for _ in range(repeats):
            for p, run in paths.items():
                t0 = time.perf_counter()
                run()
                seconds[p].append(time.perf_counter() - t0)
        for p, times in seconds.items():
            s = statistics.median(times)
            gflops = per_text * len(texts) / s / 1e9
            out["runs"].append({"threads": n, "precision": p, "seconds": s, "texts_per_s": len(texts) / s,
                                "tokens_per_s": sum(lengths) / s, "gflops": gflops, "matmul_peak_gflops": peaks[p],
                                "fraction_of_peak": gflops / peaks[p]})
            print(f"{name}: {n} thread(s) {p} {len(texts) / s:.0f} texts/s, {sum(lengths) / s:.0f} tokens/s, "
                  f"{gflops:.0f} GFLOP/s of a {peaks[p]:.0f} peak", flush=True)
    out["one_text"] = one_at_a_time(encoders, texts[:ONE_TEXT_COUNT])
    return out


ONE_TEXT_COUNT = 200  # texts encoded one at a time, as POST /items encodes a new item


def one_at_a_time(encoders: dict[str, TextEncoder], texts: list[str]) -> dict[str, Any]:
    """Each text encoded alone by each encoder in turn (1 thread, the first tenth a warm-up): per path the
    median and p99 ms of one text, what a service's POST /items waits for."""
    torch.set_num_threads(1)
    ms: dict[str, list[float]] = {p: [] for p in encoders}
    for text in texts:
        for p, enc in encoders.items():
            t0 = time.perf_counter()
            enc.encode([text])
            ms[p].append((time.perf_counter() - t0) * 1e3)
    warm = len(texts) // 10
    rows = {p: {"texts": len(v) - warm, "ms_p50": float(np.median(v[warm:])),
                "ms_p99": float(np.percentile(v[warm:], 99))} for p, v in ms.items()}
    for p, r in rows.items():
        print(f"one text at a time, 1 thread, {p}: p50 {r['ms_p50']:.2f} ms, p99 {r['ms_p99']:.2f} ms", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("datasets", nargs="+")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--limit", type=int, default=5000, help="at most this many texts per dataset")
    p.add_argument("--out", default=str(RESULTS / "text_encoding.json"))
    p.add_argument("--note", default="", help="what else the machine ran meanwhile, kept with the results")
    p.add_argument("--tiny", action="store_true", help="60 generated texts, 1 thread, 1 repeat (seconds; the "
                   "test suite runs it): the datasets given name the rows only")
    args = p.parse_args()
    out = Path(args.out)
    table = json.loads(out.read_text()) if out.exists() else {}
    for name in args.datasets:
        if args.tiny:
            texts = [f"{c} cordless drill, {n} pack. Acme tools." for c in ("red", "blue", "green") for n in range(20)]
            row = measure(name, [1], 1, len(texts), peak_n=256, texts=texts)
        else:
            row = measure(name, args.threads, args.repeats, args.limit)
        table[name] = {**row, "machine": machine(), "note": args.note,
                       "command": " ".join(["python", "benchmarks/text_encode.py", *sys.argv[1:]])}
    write_result(out, table)


if __name__ == "__main__":
    main()
