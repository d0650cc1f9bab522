"""Run a RecBole 1.2.1 sequential model on ml-100k and write its numbers to a JSON file.

The reference baseline that seqrec's own SASRec is compared against. Run it with
the interpreter of `benchmarks/.venv-recbole` (made by `setup_recbole.sh`):

    benchmarks/.venv-recbole/bin/python benchmarks/recbole_run.py --out runs/recbole-sasrec.json

Protocol (RecBole's own defaults for ml-100k, made explicit): leave-one-out per user in
time order (`LS: valid_and_test`, `order: TO`), full ranking over all items without
removing seen items, Recall/NDCG/MRR @10 and @50, early stopping on valid NDCG@10, the
test split read once with the best-validation checkpoint. No user/item/rating filter.

RecBole predates numpy 2 aliases removal and torch's `weights_only=True` default; both
are patched at run time here, before recbole is imported, never in site-packages.
The JSON is rewritten after every epoch, so a run that is cut short still leaves its
curve behind.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "ml-100k" / "recbole"
DATASET = "ml-100k"
# RecBole forces data_path to its bundled copy when the dataset is called "ml-100k",
# so the copy is staged under another token and ml-100k.yaml is loaded explicitly.
TOKEN = "ml100k"
PINS = {  # the same bytes as recbole/dataset_example/ml-100k in the 1.2.1 wheel
    "ml-100k.inter": "4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff",
    "ml-100k.item": "51d7cdf777ce5c0f5b32c1d947a4a81fe07d75e78abbe761e0cd4d0756064532",
}
VALID_KEY = "ndcg@10"

log = logging.getLogger("recbole_run")


def patch_for_modern_stack() -> None:
    """Restore what RecBole 1.2.1 expects from numpy < 1.24 and torch < 2.6."""
    for name, alias in {"float": float, "int": int, "bool": bool, "object": object,
                        "str": str, "complex": complex, "long": np.int64}.items():
        if name not in np.__dict__:
            setattr(np, name, alias)
    original_load = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("weights_only", False)  # RecBole pickles its config into checkpoints
        return original_load(*args, **kwargs)

    torch.load = load  # type: ignore[assignment]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="result JSON")
    p.add_argument("--model", default="SASRec")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA,
                   help="folder with ml-100k.inter (RecBole atomic files)")
    p.add_argument("--split-out", type=Path, default=None,
                   help="optional CSV: RecBole's valid/test target per user (raw ids)")
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--inner-size", type=int, default=256)
    p.add_argument("--hidden-dropout-prob", type=float, default=0.2)
    p.add_argument("--attn-dropout-prob", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--train-batch-size", type=int, default=256)
    p.add_argument("--eval-batch-size", type=int, default=4096)
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--stopping-step", type=int, default=10)
    p.add_argument("--seed", type=int, default=2020)
    p.add_argument("--max-len", type=int, default=50, help="MAX_ITEM_LIST_LENGTH")
    p.add_argument("--loss-type", default="CE", choices=["CE", "BPR"])
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--show-progress", action="store_true")
    p.add_argument("--model-set", action="append", default=[], metavar="KEY=JSON",
                   help="a model-specific RecBole key, e.g. dropout_prob=0.2 or ft_ratio=0.1 (value read as JSON)")
    return p.parse_args(argv)


def model_settings(pairs: list[str]) -> dict[str, Any]:
    """KEY=JSON pairs as a dict; the values go through json.loads, never eval."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--model-set {pair!r}: expected KEY=VALUE")
        out[key] = json.loads(value)
    return out


def hyperparameters(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "n_layers": args.n_layers, "n_heads": args.n_heads, "hidden_size": args.hidden_size,
        "inner_size": args.inner_size, "hidden_dropout_prob": args.hidden_dropout_prob,
        "attn_dropout_prob": args.attn_dropout_prob, "learning_rate": args.lr,
        "train_batch_size": args.train_batch_size, "eval_batch_size": args.eval_batch_size,
        "epochs": args.epochs, "stopping_step": args.stopping_step, "seed": args.seed,
        "MAX_ITEM_LIST_LENGTH": args.max_len, "loss_type": args.loss_type,
    } | model_settings(args.model_set)


def recbole_config(args: argparse.Namespace, data_path: Path, checkpoint_dir: Path
                   ) -> dict[str, Any]:
    cfg = hyperparameters(args)
    cfg.update({
        "data_path": str(data_path),
        "checkpoint_dir": str(checkpoint_dir),
        # RecBole picks cuda whenever gpu_id is non-empty and a GPU is visible.
        "use_gpu": args.device == "cuda", "gpu_id": "0" if args.device == "cuda" else "",
        "reproducibility": True, "state": "INFO",
        "show_progress": args.show_progress, "save_dataset": False, "save_dataloaders": False,
        "eval_step": 1, "learner": "adam", "weight_decay": 0.0,
        "train_neg_sample_args": None if args.loss_type == "CE" else {"distribution": "uniform",
                                                                      "sample_num": 1},
        "eval_args": {"split": {"LS": "valid_and_test"}, "order": "TO", "group_by": "user",
                      "mode": "full"},
        "metrics": ["Recall", "NDCG", "MRR"], "topk": [10, 50],
        "valid_metric": "NDCG@10", "valid_metric_bigger": True,
        # No filtering: every user, item and rating is kept (these are also ml-100k.yaml's).
        "load_col": {"inter": ["user_id", "item_id", "rating", "timestamp"]},
        "rm_dup_inter": None, "val_interval": None, "threshold": None,
        "filter_inter_by_user_or_item": False,
        "user_inter_num_interval": "[0,inf)", "item_inter_num_interval": "[0,inf)",
    })
    return cfg


def stage_data(src: Path, dest_root: Path) -> dict[str, str]:
    """Copy the atomic files to dest_root/TOKEN/, verify the pinned ones, return sha256s."""
    dest = dest_root / TOKEN
    dest.mkdir(parents=True)
    digests: dict[str, str] = {}
    for ext in ("inter", "item", "user"):
        name = f"{DATASET}.{ext}"
        if not (src / name).is_file():
            if name in PINS:
                raise SystemExit(f"{src / name} not found")
            continue
        shutil.copyfile(src / name, dest / f"{TOKEN}.{ext}")
        digests[name] = hashlib.sha256((src / name).read_bytes()).hexdigest()
    for name, pin in PINS.items():
        if digests[name] != pin:
            raise SystemExit(f"{src / name}: sha256 {digests[name]} != pinned {pin}")
    return digests


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def as_floats(result: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in (result or {}).items()}


class Recorder:
    """Wraps a RecBole trainer's epoch methods to time them; writes the JSON as it goes."""

    def __init__(self, trainer: Any, record: dict[str, Any], out: Path) -> None:
        self.record, self.out = record, out
        self.t0 = time.perf_counter()
        self.epoch = -1
        self.train_s = 0.0
        train_epoch, valid_epoch = trainer._train_epoch, trainer._valid_epoch

        def timed_train(train_data: Any, epoch_idx: int, *a: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            loss = train_epoch(train_data, epoch_idx, *a, **kw)
            self.epoch, self.train_s = epoch_idx, time.perf_counter() - start
            self.loss = float(sum(loss)) if isinstance(loss, tuple) else float(loss)
            return loss

        def timed_valid(valid_data: Any, *a: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            score, result = valid_epoch(valid_data, *a, **kw)
            now = time.perf_counter()
            self.record["epochs"].append({
                "epoch": self.epoch, "train_loss": self.loss, "train_s": round(self.train_s, 3),
                "valid_s": round(now - start, 3), "elapsed_s": round(now - self.t0, 3),
                f"valid_{VALID_KEY}": float(score), "valid": as_floats(result),
                "peak_rss_mib": round(peak_rss_mib(), 1),
            })
            self.flush()
            return score, result

        trainer._train_epoch, trainer._valid_epoch = timed_train, timed_valid

    def flush(self) -> None:
        tmp = self.out.with_suffix(self.out.suffix + ".tmp")
        tmp.write_text(json.dumps(self.record, indent=1) + "\n")
        os.replace(tmp, self.out)


def split_report(dataset: Any, valid_data: Any, test_data: Any, train_data: Any,
                 inter_path: Path) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """What RecBole ended up with, and how its targets compare to an exact time sort."""
    import pandas as pd  # RecBole's own dependency

    uid, iid = dataset.uid_field, dataset.iid_field

    def targets(data: Any) -> dict[str, str]:
        feat = data._dataset.inter_feat
        users = dataset.id2token(uid, feat[uid].numpy())
        items = dataset.id2token(iid, feat[iid].numpy())
        return dict(zip(users.tolist(), items.tolist(), strict=True))

    valid, test = targets(valid_data), targets(test_data)
    raw = pd.read_csv(inter_path, sep="\t", dtype=str)
    raw.columns = [c.split(":")[0] for c in raw.columns]
    raw["ts"] = raw["timestamp"].astype(float)
    raw["row"] = np.arange(len(raw))
    exact = raw.sort_values(["user_id", "ts", "row"], kind="stable").groupby("user_id")["item_id"]
    exact_test, exact_valid = exact.nth(-1), exact.nth(-2)
    exact_test_map = dict(zip(raw.loc[exact_test.index, "user_id"], exact_test, strict=True))
    exact_valid_map = dict(zip(raw.loc[exact_valid.index, "user_id"], exact_valid, strict=True))
    same_ts = raw.duplicated(["user_id", "ts"], keep=False)
    report = {
        "users": int(dataset.user_num - 1), "items": int(dataset.item_num - 1),
        "interactions": len(raw),
        "train_samples": len(train_data._dataset), "valid_samples": len(valid),
        "test_samples": len(test),
        "interactions_sharing_user_and_timestamp": int(same_ts.sum()),
        "test_target_differs_from_exact_time_then_file_order": sum(
            test[u] != exact_test_map[u] for u in test),
        "valid_target_differs_from_exact_time_then_file_order": sum(
            valid[u] != exact_valid_map[u] for u in valid),
    }
    rows = [(u, valid.get(u, ""), test[u]) for u in sorted(test, key=int)]
    return report, rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    patch_for_modern_stack()
    torch.set_num_threads(args.threads)
    import recbole
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.utils import get_model, get_trainer, init_logger, init_seed

    t_start = time.perf_counter()
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    split_out = args.split_out.resolve() if args.split_out else None
    data_dir = args.data_dir.resolve()
    dataset_yaml = Path(recbole.__file__).parent / "properties" / "dataset" / f"{DATASET}.yaml"
    cwd = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="recbole-run-") as work_name:
        work = Path(work_name)
        os.chdir(work)  # RecBole writes log/, log_tensorboard/ and saved/ into the cwd
        try:
            digests = stage_data(data_dir, work / "data")
            config = Config(model=args.model, dataset=TOKEN, config_file_list=[str(dataset_yaml)],
                            config_dict=recbole_config(args, work / "data", work / "saved"))
            init_seed(config["seed"], config["reproducibility"])
            init_logger(config)
            torch.set_num_threads(args.threads)  # init_seed may reset it
            dataset = create_dataset(config)
            train_data, valid_data, test_data = data_preparation(config, dataset)
            t_data = time.perf_counter()
            rss_after_data = peak_rss_mib()
            init_seed(config["seed"] + config["local_rank"], config["reproducibility"])
            model = get_model(config["model"])(config, train_data._dataset).to(config["device"])
            trainer = get_trainer(config["MODEL_TYPE"], config["model"])(config, model)
            split, rows = split_report(dataset, valid_data, test_data, train_data,
                                       work / "data" / TOKEN / f"{TOKEN}.inter")
            record: dict[str, Any] = {
                "tool": "recbole", "recbole_version": recbole.__version__,
                "torch_version": torch.__version__, "numpy_version": np.__version__,
                "python": platform.python_version(), "threads": torch.get_num_threads(),
                "device": str(config["device"]),
                "model": args.model, "hyperparameters": hyperparameters(args),
                "dataset": {"name": DATASET, "source": str(data_dir), "sha256": digests, **split},
                "protocol": protocol(config),
                "parameters": sum(p.numel() for p in model.parameters()),
                "epochs": [], "status": "training",
            }
            recorder = Recorder(trainer, record, out)
            recorder.flush()
            best_valid, best_result = trainer.fit(train_data, valid_data, saved=True,
                                                  show_progress=config["show_progress"])
            t_fit = time.perf_counter()
            test_result = trainer.evaluate(test_data, load_best_model=True,
                                           show_progress=config["show_progress"])
            t_end = time.perf_counter()
        finally:
            os.chdir(cwd)
    epochs = record["epochs"]
    # RecBole's early stopping saves on `>=`, so the checkpoint is the last epoch at the best score.
    best_epoch = max(e["epoch"] for e in epochs if e[f"valid_{VALID_KEY}"] == best_valid)
    record.update({
        "status": "done",
        "epochs_run": len(epochs),
        "stopped_early": len(epochs) < args.epochs,
        "best_epoch": best_epoch,
        f"best_valid_{VALID_KEY}": float(best_valid),
        "best_valid": as_floats(best_result),
        "best_epoch_elapsed_s": next(e["elapsed_s"] for e in epochs if e["epoch"] == best_epoch),
        "test": as_floats(test_result),
        "time_s": {
            "data": round(t_data - t_start, 3), "fit": round(t_fit - recorder.t0, 3),
            "test": round(t_end - t_fit, 3), "total": round(t_end - t_start, 3),
            "mean_train_epoch": round(float(np.mean([e["train_s"] for e in epochs])), 3),
            "mean_valid": round(float(np.mean([e["valid_s"] for e in epochs])), 3),
        },
        "memory": {"peak_rss_mib": round(peak_rss_mib(), 1),
                   "peak_rss_mib_after_data": round(rss_after_data, 1)},
    })
    recorder.flush()
    if split_out:
        split_out.parent.mkdir(parents=True, exist_ok=True)
        split_out.write_text("user_id,valid_item,test_item\n"
                             + "".join(f"{u},{v},{t}\n" for u, v, t in rows))
    log.info("best epoch %d valid %s %.4f; test %s; wrote %s", best_epoch, VALID_KEY,
             best_valid, as_floats(test_result), out)
    return 0


def protocol(config: Any) -> dict[str, Any]:
    keys = ("eval_args", "metrics", "topk", "valid_metric", "MAX_ITEM_LIST_LENGTH", "loss_type",
            "train_neg_sample_args", "normalize_all", "rm_dup_inter", "val_interval", "threshold",
            "user_inter_num_interval", "item_inter_num_interval", "load_col", "hidden_act",
            "layer_norm_eps", "initializer_range", "learner", "weight_decay", "clip_grad_norm",
            "repeatable", "eval_step", "shuffle")
    return {k: config[k] for k in keys} | {
        "seen_items_filtered": False,  # sequential full-sort passes history_index=None
        "training_samples": "every prefix of each training sequence (last MAX_ITEM_LIST_LENGTH "
                            "items) predicts its next item; loss on the last position only",
        "rank_ties": "torch.topk order (ties are not counted against the target)",
    }


if __name__ == "__main__":
    sys.exit(main())
