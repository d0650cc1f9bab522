"""What a pre-trained UniSRec carries to a new domain: validation NDCG@10 on the target, no training.

For each pre-training run, the target's validation users are ranked by
    zero-shot                          every pre-trained weight, the target's item text
    zero-shot, seen items filtered     the same, items already in the history never recommended
    zero-shot, re-centred              the same, each adaptor expert's bias moved by (target mean text
                                       vector - pre-training mean text vector); not for a run that
                                       centres each catalogue itself (model.text_centre)
    pre-trained adaptor, fresh Transformer
    fresh adaptor, pre-trained Transformer
and once by a fresh, untrained UniSRec (seeded): its adaptor and near-identity Transformer pass the
last items' text through, so it ranks items by text similarity to the history, a baseline that
needs no data at all.

    python benchmarks/transfer_probe.py --target amazon-scientific-unisrec --pretrained RUN [RUN ...]

Writes results/transfer_probe_<target>.json, keeping the entries of runs not probed this time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, prepared, write_result

from seqrec.data.dataset import PreparedDataset
from seqrec.data.text import text_embeddings
from seqrec.eval.evaluate import evaluate
from seqrec.models.unisrec import UniSRec
from seqrec.train.transfer import finetune_model, zero_shot_config


def probe(pre: Path, data: PreparedDataset) -> dict[str, Any]:
    cfg = zero_shot_config(pre)
    L = cfg.data.max_len

    def ndcg(model: UniSRec, filter_seen: bool = False) -> float:
        options = dataclasses.replace(cfg.eval, filter_seen=filter_seen)
        return float(evaluate(model.eval(), data, "valid", L, options, torch.device("cpu"))["ndcg@10"])

    def fresh() -> UniSRec:
        torch.manual_seed(0)
        return UniSRec.from_dataset(cfg.model, data, L)

    out: dict[str, Any] = {}
    results = json.loads((pre / "results.json").read_text())
    model = finetune_model(pre, data, cfg.model, L)
    out["zero-shot"] = ndcg(model)
    out["zero-shot, seen items filtered"] = ndcg(model, filter_seen=True)
    pre_config = json.loads((pre / "config.json").read_text())
    domains, pre_model = pre_config["pretrain"]["datasets"], pre_config["model"]
    if not cfg.model.text_centre:
        options = cfg.model.text_options()
        source_mean = torch.cat([text_embeddings(PreparedDataset.load(Path(d)), options).emb[1:]
                                 for d in domains]).mean(0)
        target_mean = text_embeddings(data, options).emb[1:].mean(0)
        shifted = finetune_model(pre, data, cfg.model, L)
        with torch.no_grad():
            for expert in shifted.adaptor.experts:  # type: ignore[union-attr]
                expert.bias += target_mean - source_mean
        out["zero-shot, re-centred"] = ndcg(shifted)
    trained = model.state_dict()
    for name, keep in (("pre-trained adaptor, fresh Transformer", lambda k: k.startswith("adaptor.")),
                       ("fresh adaptor, pre-trained Transformer", lambda k: not k.startswith("adaptor."))):
        mixed = fresh()
        state = mixed.state_dict()
        state.update({k: v for k, v in trained.items() if keep(k) and k in state})
        mixed.load_state_dict(state)
        out[name] = ndcg(mixed)
    return {"domains": [Path(d).name for d in domains], "text_centre": cfg.model.text_centre,
            "history_bias": cfg.model.history_bias is True, "whitening_init": bool(pre_model.get("whitening_init")),
            "d": pre_model.get("d"), "valid_ndcg@10": out,
            "pretrain_seconds": results["train_seconds"], "pretrain_steps": results["steps"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="amazon-scientific-unisrec")
    p.add_argument("--pretrained", nargs="+", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    data = prepared(args.target)
    cfg = zero_shot_config(Path(args.pretrained[0]))
    torch.manual_seed(0)
    untrained = UniSRec.from_dataset(cfg.model, data, cfg.data.max_len).eval()
    baseline = float(evaluate(untrained, data, "valid", cfg.data.max_len, cfg.eval, torch.device("cpu"))["ndcg@10"])
    out = RESULTS / f"transfer_probe_{args.target}.json"
    runs = json.loads(out.read_text())["runs"] if out.is_file() else {}
    for r in args.pretrained:
        runs[Path(r).name] = {**probe(Path(r), data), "machine": machine(),
                              "command": "python benchmarks/transfer_probe.py " + " ".join(sys.argv[1:])}
    result = {"target": args.target, "untrained_valid_ndcg@10": baseline, "runs": runs}
    write_result(out, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
