"""Text-encoding throughput of the frozen encoder (seqrec.data.text.TextEncoder) on real item texts.

Encodes every item text of each dataset (as `seqrec text encode` builds them) with the default
encoder, mean pooling, max length 128, batch 64, once per thread count; reports texts/s and
tokens/s (median of `--repeats`). The cache is not touched. Writes
benchmarks/results/text_encoding.json.

    python benchmarks/text_encode.py amazon-scientific-unisrec yelp-p5 --threads 1 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import RESULTS, machine, prepared, write_result

from seqrec.data.text import TextEncoder, item_texts, resolve_encoder


def measure(name: str, threads: list[int], repeats: int, limit: int) -> dict[str, Any]:
    data = prepared(name)
    texts = [t for t in item_texts(data.item_table) if t][:limit]
    encoder = TextEncoder(resolve_encoder("default"))
    n_tokens = sum(len(ids) for ids in encoder.tokenizer(texts, truncation=True, max_length=128)["input_ids"])
    out: dict[str, Any] = {"dataset": name, "texts": len(texts), "tokens": n_tokens,
                           "encoder": "/".join(Path(encoder.source).parts[-2:]), "pooling": "mean",
                           "max_length": 128, "batch_size": 64, "runs": []}
    for n in threads:
        torch.set_num_threads(n)
        encoder.encode(texts[:128])  # warm-up
        seconds = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            encoder.encode(texts, batch_size=64)
            seconds.append(time.perf_counter() - t0)
        s = statistics.median(seconds)
        out["runs"].append({"threads": n, "seconds": s, "texts_per_s": len(texts) / s, "tokens_per_s": n_tokens / s})
        print(f"{name}: {n} thread(s) {len(texts) / s:.0f} texts/s, {n_tokens / s:.0f} tokens/s", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("datasets", nargs="+")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--limit", type=int, default=5000, help="at most this many texts per dataset")
    p.add_argument("--out", default=str(RESULTS / "text_encoding.json"))
    args = p.parse_args()
    out = Path(args.out)
    table = json.loads(out.read_text()) if out.exists() else {}
    for name in args.datasets:
        table[name] = {**measure(name, args.threads, args.repeats, args.limit), "machine": machine(),
                       "command": " ".join(["python", "benchmarks/text_encode.py", *sys.argv[1:]])}
    write_result(out, table)


if __name__ == "__main__":
    main()
