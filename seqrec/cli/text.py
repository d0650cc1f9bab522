"""The text and transfer commands of `seqrec`: `text encode`, `pretrain`, `finetune`."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from seqrec.cli.common import print_metrics, resolve_dataset, run_folder
from seqrec.errors import SeqrecError


def cmd_text_encode(args: argparse.Namespace) -> int:
    from seqrec.data.dataset import PreparedDataset
    from seqrec.data.text import TextOptions, text_embeddings

    options = TextOptions(encoder=args.encoder, revision=args.revision, pooling=args.pooling,
                          max_length=args.max_length, template=args.template, missing=args.missing,
                          word_drop=args.word_drop, batch_size=args.batch_size, precision=args.precision,
                          device=args.device)
    data = PreparedDataset.load(resolve_dataset(args.dataset))
    result = text_embeddings(data, options, progress=not args.no_progress)
    meta = result.meta
    how = ("reused" if result.reused else f"encoded in {meta['seconds']:.1f}s ({meta['texts_per_s']:.0f} texts/s)"
           ) + f", {meta.get('precision', 'fp32')}"
    print(f"{data.meta['name']}: {meta['n_items']} items x {meta['dim']} ({meta['n_missing']} without text), "
          f"{how} -> {result.path}")
    return 0


def _split_overrides(items: list[str], sections: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    from seqrec.config import parse_override

    out: dict[str, dict[str, Any]] = {s: {} for s in sections}
    for text in items:
        (section, key), value = parse_override(text)
        if section not in out:
            raise SeqrecError(f"override {text!r}: section must be one of {', '.join(sections)}")
        out[section][key] = value
    return out


def cmd_pretrain(args: argparse.Namespace) -> int:
    from seqrec.config import build, load_toml
    from seqrec.models.unisrec import UniSRecConfig
    from seqrec.train.pretrain import PretrainConfig, pretrain

    recipe = load_toml(Path(args.config)) if args.config else {}
    unknown = set(recipe) - {"pretrain", "model"}
    if unknown:
        raise SeqrecError(f"{args.config}: a pre-training recipe has [pretrain] and [model] sections, not "
                          f"{', '.join(sorted(unknown))}")
    sets = _split_overrides(list(args.set or []), ("pretrain", "model"))
    sets = {k: {**recipe.get(k, {}), **v} for k, v in sets.items()}
    listed = args.datasets or ",".join(sets["pretrain"].get("datasets", []))
    names = [n for n in listed.split(",") if n]
    if not names:
        raise SeqrecError("no datasets to pre-train on: give --datasets A,B or pretrain.datasets in the recipe")
    values = {**sets["pretrain"], "datasets": [str(resolve_dataset(n)) for n in names]}
    if args.negatives:
        values["negatives"] = args.negatives
    cfg = build(PretrainConfig, values, "pretrain")
    model_cfg = build(UniSRecConfig, {"name": "unisrec", **sets["model"]}, "model")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.out) if args.out else Path("runs") / f"pretrain-{'+'.join(names)}-{cfg.negatives}-{stamp}"
    with run_folder(run_dir, args.overwrite):
        results = pretrain(cfg, model_cfg, run_dir, recipe=args.config)
    print(f"run: {run_dir}  ({results['steps']} steps, {results['train_seconds']:.0f}s, "
          f"{results['sequences_per_s']:.0f} sequences/s, peak RSS {results['peak_rss_mb']:.0f} MB, "
          f"final loss {results['final_loss']:.4f})")
    return 0


def cmd_finetune(args: argparse.Namespace) -> int:
    from seqrec.config import load_toml, resolve
    from seqrec.data.dataset import PreparedDataset
    from seqrec.train.loop import fit
    from seqrec.train.transfer import (
        Origin,
        Setting,
        check_architecture,
        finetune_config,
        pretrained_max_len,
        recipe_model_settings,
    )

    raw = load_toml(Path(args.config)) if args.config else {}
    sets = _split_overrides(list(args.set or []), ("data", "model", "train", "eval"))
    setting: Setting = "inductive" if args.setting == "zero-shot" else args.setting
    pretrained = Path(getattr(args, "from"))
    target = resolve_dataset(args.dataset)  # an unknown target refused before anything is said about the model
    check_architecture(pretrained, sets["model"])
    overrides = {**recipe_model_settings(pretrained, raw.pop("model", {})), **sets.pop("model")}
    if args.transfer == "adaptor":  # a fresh Transformer is trained, not frozen
        overrides.setdefault("freeze_encoder", False)
    model_cfg = finetune_config(pretrained, setting, overrides)
    raw["model"] = dataclasses.asdict(model_cfg)
    # the pre-trained model's history length unless the config or --set says otherwise
    raw.setdefault("data", {}).setdefault("max_len", pretrained_max_len(pretrained))
    for section, values in sets.items():
        raw[section] = {**raw.get(section, {}), **values}
    cfg = resolve(raw)
    data = PreparedDataset.load(target)
    from seqrec.train.auto import log_decisions, resolve_auto
    from seqrec.train.transfer import has_history_bias

    if args.setting == "zero-shot" and getattr(cfg.model, "history_bias", None) == "auto":
        # no target event may decide anything: the pre-trained model's own offsets, if it learnt them
        cfg.model.history_bias = has_history_bias(pretrained)
    decisions = resolve_auto(cfg.model, data.with_training_users(cfg.data.train_fraction,
                                                                 cfg.data.train_fraction_seed))
    if args.setting == "zero-shot" and args.transfer != "all":
        raise SeqrecError("zero-shot uses every pre-trained weight: drop --transfer")
    unused = sorted({f"train.{k}" for k in raw.get("train", {}) if k != "device"})
    if args.setting == "zero-shot" and unused:
        print(f"(note: zero-shot trains nothing: {', '.join(unused)} not used)")
    origin = Origin.of(pretrained, args.transfer)
    model = None if args.setting == "zero-shot" else origin.model(data, cfg.model, cfg.data.max_len, cfg.train.seed)
    log_decisions(decisions)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.out) if args.out else Path("runs") / f"{data.meta['name']}-unisrec-{args.setting}-{stamp}"
    cfg.data.dataset = str(data.path)
    if args.setting == "zero-shot":
        from seqrec.train.device import pick_device
        from seqrec.train.transfer import zero_shot

        with run_folder(run_dir, args.overwrite):
            results = zero_shot(pretrained, data, cfg, run_dir, pick_device(cfg.train.device))
        print(f"run: {run_dir}  (zero-shot: no training on {data.meta['name']})")
        print_metrics(results)
        return 0
    with run_folder(run_dir, args.overwrite):
        results = fit(cfg, data, run_dir, model=model, origin=origin)
    if "rank" in results:  # a process of torchrun other than the first: rank 0 reports
        return 0
    alpha = (results.get("interpolation") or {}).get("alpha", 1.0)
    mixed = f", kept {alpha:g} x fine-tuned + {1 - alpha:g} x pre-trained weights" if alpha < 1 else ""
    print(f"run: {run_dir}  ({args.setting}, best epoch {results['checkpoint']['epoch']}{mixed}, "
          f"{results['train_seconds']:.0f}s)")
    print_metrics(results)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register `text encode`, `pretrain` and `finetune` on the top-level subparsers."""
    text = sub.add_parser("text", help="item text -> cached frozen language-model vectors")
    tsub = text.add_subparsers(dest="text_cmd", required=True)
    enc = tsub.add_parser("encode", help="encode a prepared dataset's item text (cached beside it)")
    enc.add_argument("dataset")
    enc.add_argument("--encoder", default="default",
                     help="local folder or Hugging Face name (default: the packaged all-MiniLM-L6-v2)")
    enc.add_argument("--revision", default="", help="model revision (default: fingerprint of local files)")
    enc.add_argument("--pooling", choices=["mean", "cls"], default="mean")
    enc.add_argument("--max-length", type=int, default=128, help="tokens per text")
    enc.add_argument("--template", default="", help='e.g. "{title}. {brand}" (default: every text field)')
    enc.add_argument("--missing", choices=["auto", "error", "id", "mean"], default="auto",
                     help="items without text: error, the text 'item <id>', or the mean vector; auto = the mean "
                          "for at most 1%% of the items (with a warning), an error for more")
    enc.add_argument("--word-drop", type=float, default=0.0,
                     help="also encode pre-training's augmented view, each word dropped at this rate (0: only the "
                          "vectors models use; pre-training encodes its view itself, beside these)")
    enc.add_argument("--batch-size", type=int, default=64,
                     help="texts of 64 tokens per batch: a batch holds this x 64 padded tokens")
    enc.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                     help="encoder arithmetic: auto = bfloat16 where the hardware has it (vectors within 1e-3 "
                          "cosine of float32's, about 1e-4 measured), else float32")
    enc.add_argument("--device", default="auto", help="where the encoder runs: auto (CUDA where there is one), "
                     "cpu, cuda, cuda:1, ...")
    enc.add_argument("--no-progress", action="store_true")
    enc.set_defaults(fn=cmd_text_encode)
    pt = sub.add_parser("pretrain", help="UniSRec multi-domain pre-training")
    pt.add_argument("--datasets", help="comma-separated prepared datasets (or pretrain.datasets in --config)")
    pt.add_argument("--config", help="TOML recipe with [pretrain] and [model] (e.g. configs/pretrain.toml)")
    pt.add_argument("--negatives", choices=["in-batch", "moco"])
    pt.add_argument("--set", action="append", metavar="pretrain.KEY=V | model.KEY=V")
    pt.add_argument("--out", help="run folder (default runs/pretrain-...); one that holds a run is refused")
    pt.add_argument("--overwrite", action="store_true", help="replace the run --out holds (its folder removed "
                        "first)")
    pt.set_defaults(fn=cmd_pretrain)
    ft = sub.add_parser("finetune", help="fine-tune a pre-trained UniSRec on a dataset")
    ft.add_argument("dataset")
    ft.add_argument("--from", required=True, help="pre-training run folder (or its checkpoint)")
    ft.add_argument("--setting", choices=["inductive", "transductive", "zero-shot"], default="inductive",
                    help="zero-shot: no training; the target's item text alone (writes a run folder)")
    ft.add_argument("--transfer", choices=["all", "adaptor"], default="all",
                    help="pre-trained weights to start from: all shared ones, or the text adaptor only (a fresh "
                    "Transformer)")
    ft.add_argument("--config", help="TOML file with [data] [train] [eval] (and [model] overrides)")
    ft.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE")
    ft.add_argument("--out", help="run folder; one that holds a run is refused")
    ft.add_argument("--overwrite", action="store_true", help="replace the run --out holds (its folder removed "
                        "first)")
    ft.set_defaults(fn=cmd_finetune)
