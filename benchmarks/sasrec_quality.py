"""SASRec quality on the published builds, next to the strongest published numbers.

Leave-one-out, full ranking over all items, max length 50, model chosen on
validation NDCG@10, already-seen items not filtered. Writes
benchmarks/results/sasrec_quality.json (one entry per dataset, merged with
earlier entries) and prints a table.

    python benchmarks/sasrec_quality.py amazon-beauty-p5 amazon-sports-p5 amazon-scientific-unisrec
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from common import RESULTS, WORK, fresh_run, machine, prepared, write_result

from seqrec.config import load_toml, resolve
from seqrec.eval.evaluate import evaluate
from seqrec.train.checkpoint import load_checkpoint
from seqrec.train.loop import fit, pick_device

PUBLISHED = {  # R@10, N@10 (and R@50, N@50 where published); see ../shared/data/README.md
    "amazon-beauty-p5": {"source": "eSASRec (RecSys 2025), SASRec+SS", "recall@10": 0.0921, "ndcg@10": 0.0531},
    "amazon-sports-p5": {"source": "eSASRec (RecSys 2025): SASRec+SS R@10, eSASRec N@10",
                         "recall@10": 0.0569, "ndcg@10": 0.0323},
    "amazon-scientific-unisrec": {"source": "UniSRec (KDD 2022) Table 2, SASRec", "recall@10": 0.1080,
                                  "ndcg@10": 0.0553, "recall@50": 0.2042, "ndcg@50": 0.0760},
}
CONFIGS = Path(__file__).resolve().parent / "configs"


def run(name: str, overrides: list[str], tag: str) -> dict:
    data = prepared(name)
    raw = load_toml(CONFIGS / f"sasrec-{name}.toml")
    cfg = resolve(raw, [f'data.dataset="{data.path}"', "train.progress=false", *overrides])
    run_dir = WORK / "runs" / f"sasrec-{name}{tag}"
    results = fit(cfg, data, fresh_run(run_dir))
    # Secondary, labelled: the same checkpoint with already-seen items removed from the ranking.
    # The Amazon builds hold no repeated items, so this filter only removes wrong answers.
    device = pick_device(cfg.train.device)
    model, _ = load_checkpoint(run_dir / "checkpoint", device)
    seen_cfg = resolve(cfg.to_dict(), ["eval.filter_seen=true"])
    test_seen_filtered = evaluate(model, data, "test", cfg.data.max_len, seen_cfg.eval, device)
    published = PUBLISHED.get(name, {})
    return {
        "dataset": name,
        "config": cfg.to_dict(),
        "overrides": overrides,
        "test": results["test"],
        "valid": results["valid"],
        "test_seen_filtered": test_seen_filtered,
        "best_epoch": results["checkpoint"]["epoch"],
        "train_seconds": results["train_seconds"],
        "peak_rss_mb": results["peak_rss_mb"],
        "protocol": results["protocol"],
        "published": published,
        "meets_published": all(results["test"][k] >= v for k, v in published.items() if k != "source"),
        "machine": machine(),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("datasets", nargs="+", choices=sorted(PUBLISHED))
    p.add_argument("--set", action="append", default=[], help="config override for every run")
    p.add_argument("--tag", default="", help="suffix for the run folder and result key")
    p.add_argument("--out", default=str(RESULTS / "sasrec_quality.json"))
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    out = Path(args.out)
    table = json.loads(out.read_text()) if out.exists() else {}
    for name in args.datasets:
        table[name + args.tag] = run(name, args.set, args.tag)
        write_result(out, table)
    for key, r in table.items():
        t, pub = r["test"], r["published"]
        print(f"{key:<32} R@10 {t['recall@10']:.4f} (pub {pub.get('recall@10', float('nan')):.4f})  "
              f"N@10 {t['ndcg@10']:.4f} (pub {pub.get('ndcg@10', float('nan')):.4f})  "
              f"R@50 {t['recall@50']:.4f}  N@50 {t['ndcg@50']:.4f}  epoch {r['best_epoch']}  "
              f"{r['train_seconds']:.0f}s  meets: {r['meets_published']}")


if __name__ == "__main__":
    main()
