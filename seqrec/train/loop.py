"""The one training loop: every model trains, validates and is checkpointed here.

Early stopping watches validation NDCG@10; the best checkpoint is the one that
is tested, once, at the end. A run folder holds:
    config.json      the resolved config
    metrics.jsonl    one line per epoch (loss, throughput, validation metrics); fine-tuning starts with
                     epoch 0, the given model validated before any training
    checkpoint/      best weights (safetensors + JSON); with train.refit, the refitted model
    checkpoint-selected/  with train.refit only: the validation-chosen model
    state/           while training: what `--resume` needs to go on exactly (seqrec.train.state)
    results.json     validation and test metrics of the best epoch, the protocol, what ended training
    curve.png        the learning curve
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from seqrec import __version__
from seqrec.config import RunConfig, saved_config
from seqrec.data.batching import TrainBatches
from seqrec.data.dataset import PreparedDataset
from seqrec.data.features import dataset_event_values
from seqrec.data.io import check_new_run_dir, write_json_atomic
from seqrec.errors import SeqrecError
from seqrec.eval.evaluate import evaluate, protocol
from seqrec.models.base import EpochBatches, SequentialModel
from seqrec.registry import build_model_for
from seqrec.train.auto import apply_decisions, log_decisions, resolve_auto, resolve_auto_data, resolve_auto_train
from seqrec.train.checkpoint import load_checkpoint, save_checkpoint
from seqrec.train.device import peak_rss_mb, pick_device, seed_everything
from seqrec.train.distributed import SINGLE, ShardedBatches, World, init_world, loss_module
from seqrec.train.ema import WeightAverage
from seqrec.train.epoch import train_epoch
from seqrec.train.init_items import init_item_embeddings
from seqrec.train.plots import learning_curve
from seqrec.train.sparse import SparseRowsAdam, SparseRowsAdamW, use_sparse_rows
from seqrec.train.state import LoopState, load_state, save_state, saved_origin
from seqrec.train.transfer import Origin, interpolate_best, mix

log = logging.getLogger(__name__)


def make_optimizer(model: torch.nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    if cfg.train.sparse_items is True:  # sparse item-table gradients (seqrec.train.sparse)
        kind: type[torch.optim.Adam] = SparseRowsAdamW if cfg.train.optimizer == "adamw" else SparseRowsAdam
    else:
        kind = torch.optim.AdamW if cfg.train.optimizer == "adamw" else torch.optim.Adam
    params = [p for p in model.parameters() if p.requires_grad]
    # The fused kernel is several times faster than the per-tensor loop, on CPU as on CUDA.
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return kind(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, fused=fused)


def selection_metric(ks: list[int]) -> str:
    return f"ndcg@{10 if 10 in ks else ks[0]}"


def fit(cfg: RunConfig, data: PreparedDataset | str | Path, run_dir: str | Path,
        model: SequentialModel | None = None, init_items_from: Path | None = None,
        resume: bool = False, on_epoch: Callable[[int, float, float], None] | None = None,
        test: bool = True, origin: Origin | None = None) -> dict[str, Any]:
    """Train with early stopping on validation, test the best checkpoint once. A given `model` (one to
    fine-tune) is evaluated before training too: validation may choose it as it came (epoch 0).

    `cfg` is left as given (the run's config.json holds the values its `auto` settings took), so one config
    serves several runs; `data` is a prepared dataset or its folder; `run_dir` must not hold a run unless it
    is resumed (remove it first to train it again), and a resumed run goes on with its config.json. The
    process's torch thread count (`train.threads`) is put back on return; the global random generators are
    seeded by `train.seed`.

    `on_epoch(epoch, validation metric, elapsed seconds)` is called after each validation (a tuner
    prunes by raising from it); `test=False` never evaluates on the test split (a tuner's trials).

    `init_items_from`: a run whose item vectors (e.g. item2vec's) initialise the item table.
    `origin`: the pre-trained run `model` was built from (fine-tuning): a refit and the weight interpolation
    (`train.interpolate`) start from it; a resumed run builds its model from it again.
    `resume`: go on from the state the run folder's last finished epoch left (`seqrec.train.state`);
    the result is the one an uninterrupted run gives."""
    threads = torch.get_num_threads()
    data = data if isinstance(data, PreparedDataset) else PreparedDataset.load(Path(data))
    run_dir = Path(run_dir)
    if not resume:
        check_new_run_dir(run_dir)
    elif (run_dir / "config.json").is_file():  # as it was decided: "auto" is not decided again (machine, load)
        cfg = saved_config(run_dir / "config.json")
    try:
        return _fit(copy.deepcopy(cfg), data, run_dir, model, init_items_from, resume, on_epoch, test, origin)
    finally:
        if threading.current_thread() is threading.main_thread():  # (a tuner's trials run in threads)
            torch.set_num_threads(threads)


def _fit(cfg: RunConfig, data: PreparedDataset, run_dir: Path, model: SequentialModel | None,
         init_items_from: Path | None, resume: bool, on_epoch: Callable[[int, float, float], None] | None,
         test: bool, origin: Origin | None) -> dict[str, Any]:
    pick_device(cfg.train.device)  # a device that is not there is an error, under torchrun too
    world, rank_device = init_world(cfg.train.device)
    if not cfg.data.dataset:  # given as a dataset object (Python): the run records where it lies
        cfg.data.dataset = str(Path(data.path).resolve())
    if 10 not in cfg.eval.ks and world.main:
        log.warning("eval.ks has no 10: the model is chosen on validation %s (results.json says so too)",
                    selection_metric(cfg.eval.ks))
    data = data.with_training_users(cfg.data.train_fraction, cfg.data.train_fraction_seed)
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    device = rank_device or pick_device(cfg.train.device)
    # before the model is built (a given model decided already); the loss and batch size depend on the
    # machine too: under torchrun every rank takes rank 0's
    # rank 0 decides (on copies) and every rank applies the same decisions, so all build the same model
    decided = resolve_auto_train(copy.deepcopy(cfg.model), copy.deepcopy(cfg.train), cfg.data.max_len, data, device,
                                 model) if world.main else None
    decisions = world.broadcast(decided)
    apply_decisions(cfg, decisions)
    decisions += resolve_auto(cfg.model, data, model) + resolve_auto_data(cfg.data, data)
    L = cfg.data.max_len
    # a resumed fine-tuning run starts from the pre-trained weights again (its state names them)
    origin = origin or (Origin(**saved) if resume and (saved := saved_origin(run_dir / "state")) else None)
    model = origin.model(data, cfg.model, cfg.data.max_len, cfg.train.seed) if origin and model is None else model
    # a given model (e.g. a pre-trained one to fine-tune) is also where a refit starts again
    given = model is not None
    start_model = copy.deepcopy(model) if model is not None and cfg.train.refit else None
    start_weights = origin.weights(model) if model is not None and origin is not None and cfg.train.interpolate else {}
    model, opt, batches, step = setup(cfg, data, device, model, init_items_from, world)
    if world.main:  # only once the inputs have proved usable: a refused run leaves no folder behind
        log_decisions(decisions)  # and prints nothing before its error
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / "config.json", cfg.to_dict())
    ema = weight_average(model, cfg)
    scored = model if ema is None else ema.model  # what validation, the checkpoint and the test see
    metric = selection_metric(cfg.eval.ks)
    state_dir, ckpt = run_dir / "state", run_dir / "checkpoint"
    if resume:  # every rank loads the same state
        loop = load_state(state_dir, model, opt, batches, ema)
        if loop.dataset_fingerprint not in (None, data.fingerprint):
            raise SeqrecError(f"{run_dir}: trained on dataset fingerprint {loop.dataset_fingerprint}, but "
                              f"{data.path} has {data.fingerprint} now (prepared again since): it cannot go on "
                              "on other data; train a new run")
        init_items_from = Path(loop.init_items_from) if loop.init_items_from else None
        decisions = decisions or loop.auto  # config.json holds the decided values, not the decisions
        if loop.processes and world.size not in loop.processes and world.main:
            log.warning("resuming a run trained by %s process(es) with %d: the result is not the one an "
                        "uninterrupted run gives (start it as it was started, under torchrun)",
                        "/".join(map(str, sorted(set(loop.processes)))), world.size)
        loop.processes.append(world.size)
        log.info("resuming after epoch %d (best %s %.4f @ %d)", loop.epoch, metric, loop.best, loop.best_epoch)
    else:
        loop = LoopState(init_items_from=None if init_items_from is None else str(init_items_from),
                         dataset_fingerprint=data.fingerprint, auto=decisions, processes=[world.size],
                         origin=None if origin is None else dataclasses.asdict(origin))
    if not world.main:
        return follow(cfg, data, device, model, opt, batches, step, world, loop, start_model)
    # epochs after the saved state (an interrupted one) are dropped from the log
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in loop.history))
    start = time.perf_counter() - loop.elapsed_s
    if given and not resume:  # fine-tuning: the starting point is a candidate too, as epoch 0
        valid = evaluate(scored, data, "valid", L, cfg.eval, device)
        loop.best, loop.best_epoch = valid[metric], 0
        save_checkpoint(scored, ckpt, max_len=L, item_table=data.item_table,
                        extra={"epoch": 0, "dataset_fingerprint": data.fingerprint})
        log.info("epoch 0 (the given model, untrained here) %s %.4f", metric, valid[metric])
        loop.history.append({"epoch": 0, "valid": valid, "elapsed_s": time.perf_counter() - start})
        with (run_dir / "metrics.jsonl").open("a") as fh:  # the starting point's row: no training, no loss
            fh.write(json.dumps(loop.history[-1]) + "\n")
    for epoch in range(loop.epoch + 1, cfg.train.epochs + 1):
        if loop.stopped:
            break
        # one process ends an epoch at the budget (processes under torchrun step together: at its end)
        deadline = start + cfg.train.time_budget_s if cfg.train.time_budget_s and world.size == 1 else None
        stats = train_epoch(model, batches, opt, cfg, device, epoch, step, ema, deadline)
        row: dict[str, Any] = {"epoch": epoch, "loss": stats.loss, "train_s": stats.seconds,
                               "targets_per_s": stats.targets_per_s, **({"cut_at_budget": True} if stats.cut else {})}
        if epoch % cfg.train.eval_every == 0 or epoch == cfg.train.epochs:
            valid = evaluate(scored, data, "valid", L, cfg.eval, device)
            row["valid"] = valid
            if valid[metric] > loop.best:
                loop.best, loop.best_epoch, loop.bad = valid[metric], epoch, 0
                save_checkpoint(scored, ckpt, max_len=L, item_table=data.item_table,
                                extra={"epoch": epoch, "dataset_fingerprint": data.fingerprint})
            else:
                loop.bad += 1
        row["elapsed_s"] = time.perf_counter() - start
        if on_epoch is not None and "valid" in row:
            on_epoch(epoch, row["valid"][metric], row["elapsed_s"])
        loop.history.append(row)
        with (run_dir / "metrics.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        if "valid" in row:
            log.info("epoch %d loss %.4f %s %.4f (best %.4f @ %d) %.0f targets/s", epoch, stats.loss,
                     metric, row["valid"][metric], loop.best, loop.best_epoch, stats.targets_per_s)
        else:  # train.eval_every > 1: no validation this epoch
            log.info("epoch %d loss %.4f (not validated) %.0f targets/s", epoch, stats.loss, stats.targets_per_s)
        if loop.bad >= cfg.train.patience:
            log.info("early stop: no better %s for %d evaluations", metric, loop.bad)
            loop.stopped, loop.stopped_by = True, f"early stop: no better validation for {loop.bad} evaluations"
        elif cfg.train.time_budget_s and (stats.cut or row["elapsed_s"] > cfg.train.time_budget_s):
            log.info("time budget of %.0f s reached%s", cfg.train.time_budget_s,
                     " inside the epoch: it ended there" if stats.cut else "")
            loop.stopped, loop.stopped_by = True, f"the time budget (train.time_budget_s = {cfg.train.time_budget_s:g})"
        loop.epoch, loop.elapsed_s = epoch, row["elapsed_s"]
        save_state(state_dir, loop, model, opt, batches, ema)
        world.broadcast(loop.stopped)  # the other ranks stop with rank 0
    if start_weights and loop.interpolation is None:
        loop.interpolation = interpolate_best(cfg, data, device, ckpt, start_weights, loop, metric)
        save_state(state_dir, loop, model, opt, batches, ema)  # a resume does not mix the mixed model again
    alpha = loop.interpolation["alpha"] if loop.interpolation else 1.0
    if cfg.train.refit and any(r.get("cut_at_budget") and r["epoch"] == loop.best_epoch for r in loop.history):
        cfg.train.refit = False  # a refit would train the chosen epoch whole: more than was validated, past the budget
        loop.stopped_by = f"{loop.stopped_by}, inside the chosen epoch: tested as chosen, without the refit"
        log.info("no refit: the chosen epoch was cut short by the time budget; the chosen model is tested")
    if cfg.train.refit:
        selected = run_dir / "checkpoint-selected"
        if resume and selected.is_dir():  # stopped after the rename: a checkpoint/ there is a refit's
            shutil.rmtree(ckpt, ignore_errors=True)
        else:
            shutil.rmtree(selected, ignore_errors=True)
            ckpt.rename(selected)
        best_model, _ = load_checkpoint(selected, device)
        world.broadcast(loop.best_epoch)  # the other ranks refit alongside
        test_model = refit(cfg, data, device, loop.best_epoch, init_items_from, start_model, world)
        if alpha < 1:  # the refitted weights mixed as the chosen ones were
            mix(test_model, start_weights, alpha)
        save_checkpoint(test_model, ckpt, max_len=L, item_table=data.item_table,
                        extra={"epoch": loop.best_epoch, "refit": True, "dataset_fingerprint": data.fingerprint,
                               **({"interpolated": alpha} if alpha < 1 else {})})
    else:
        best_model, _ = load_checkpoint(ckpt, device)
        test_model = best_model
    train_seconds = time.perf_counter() - start
    results = final_results(best_model, test_model, data, cfg, device, loop.best_epoch, loop.history,
                            train_seconds, test=test)
    # where its weights came from: items initialised from a run; (fine-tuned) the pre-trained run (transfer.Origin)
    results.update({k: v for k, v in (("init_items_from", loop.init_items_from), ("origin", loop.origin)) if v})
    if loop.interpolation is not None:
        results["interpolation"] = loop.interpolation
        if alpha < 1:
            results["protocol"]["model_selection"] += (
                f"; its weights mixed with the pre-trained ones, {alpha:g} x fine-tuned + {1 - alpha:g} x "
                "pre-trained, the mix chosen on validation" + (" and applied to the refit" if cfg.train.refit else ""))
    if decisions:
        results["auto"] = decisions
    results["processes"] = sorted(set(loop.processes))  # data-parallel: how many trained it (each resume adds its)
    results["stopped_by"] = loop.stopped_by or f"the epoch limit (train.epochs = {cfg.train.epochs})"
    write_json_atomic(run_dir / "results.json", results)
    learning_curve(loop.history, metric, run_dir / "curve.png")
    shutil.rmtree(state_dir, ignore_errors=True)  # the run is complete: nothing left to resume
    return results


def follow(cfg: RunConfig, data: PreparedDataset, device: torch.device, model: SequentialModel,
           opt: torch.optim.Optimizer, batches: EpochBatches, step: torch.nn.Module, world: World,
           loop: LoopState, start_model: SequentialModel | None) -> dict[str, Any]:
    """A rank other than 0: train its share of each epoch until rank 0 says stop (and refit with it)."""
    for epoch in range(loop.epoch + 1, cfg.train.epochs + 1):
        if loop.stopped:
            break
        train_epoch(model, batches, opt, cfg, device, epoch, step)
        loop.stopped = world.broadcast(None)
    if cfg.train.refit:
        refit(cfg, data, device, world.broadcast(None), Path(loop.init_items_from) if loop.init_items_from else None,
              start_model, world)
    return {"rank": world.rank}


def setup(cfg: RunConfig, data: PreparedDataset, device: torch.device, model: SequentialModel | None = None,
          init_items_from: Path | None = None, world: World = SINGLE
          ) -> tuple[SequentialModel, torch.optim.Optimizer, EpochBatches, torch.nn.Module]:
    """A seeded model (or the one given), its optimizer, its epoch feeder (this rank's share of it)
    and the module whose forward is a training step's loss, for training on `data`."""
    seed_everything(cfg.train.seed)
    L = cfg.data.max_len
    if "auto" in (cfg.train.batch_size, cfg.train.sparse_items, getattr(cfg.model, "loss", None)):  # outside `fit`
        log_decisions(resolve_auto_train(cfg.model, cfg.train, L, data, device, model))
    model = (model or build_model_for(cfg.model, data, L, cfg.features)).to(device)
    if cfg.train.sparse_items is True:
        if world.distributed:
            raise SeqrecError("train.sparse_items=true is not supported under torchrun (ranks exchange dense "
                              "gradients); set it to false")
        use_sparse_rows(model)
    model.fit_data(data)  # training-split statistics (item counts, ...) before the first step
    if init_items_from is not None:
        init_item_embeddings(model, init_items_from, data)
    step = loss_module(model, world, device)  # under torchrun: DDP, which starts every rank from rank 0's weights
    if world.distributed:
        torch.manual_seed(cfg.train.seed + world.rank)  # each rank its own dropout masks and negatives
    opt = make_optimizer(model, cfg)
    batch_size = cfg.train.batch_size
    assert batch_size != "auto"
    batches = model.train_batches(data, L, batch_size, cfg.train.seed)  # a model's own feeder, or
    if batches is None:  # every target, with the event features the model takes
        events = dataset_event_values(data, model.event_feature_names())
        if cfg.data.stride == "auto" or cfg.data.jitter == "auto":  # set up outside `fit`: decide here
            log_decisions(resolve_auto_data(cfg.data, data))
        assert cfg.data.stride != "auto" and cfg.data.jitter != "auto"
        batches = TrainBatches(data, L, batch_size, cfg.train.seed, cfg.data.stride, events,
                               jitter=cfg.data.jitter)
    if world.distributed:
        batches = ShardedBatches(batches, world)
        if len(batches) == 0:  # every rank would step nothing: the untrained model would be saved and tested
            raise SeqrecError(f"{len(batches.batches)} training batch(es) an epoch for {world.size} processes: each "
                              f"process needs at least one; lower train.batch_size (now {batch_size}) or run fewer")
    return model, opt, batches, step


def weight_average(model: SequentialModel, cfg: RunConfig) -> WeightAverage | None:
    """The running average of `model`'s weights that `train.ema` asks for (`seqrec.train.ema`), or None."""
    return WeightAverage(model, cfg.train.ema) if cfg.train.ema > 0 else None


def refit(cfg: RunConfig, data: PreparedDataset, device: torch.device, epochs: int,
          init_items_from: Path | None = None, start: SequentialModel | None = None,
          world: World = SINGLE) -> SequentialModel:
    """A fresh model, same seed and config, trained for the validation-chosen number of epochs on
    training + validation events (each user's validation item becomes a training target). No
    evaluation happens during the refit; the test split is still read once, afterwards.
    `start`: the untrained model that `fit` was given (a pre-trained one, when fine-tuning) to start from."""
    full = data.with_valid_as_training()
    model, opt, batches, step = setup(cfg, full, device, start, init_items_from, world)
    ema = weight_average(model, cfg)
    for epoch in range(1, epochs + 1):
        stats = train_epoch(model, batches, opt, cfg, device, epoch, step, ema)
        log.info("refit epoch %d/%d loss %.4f %.0f targets/s", epoch, epochs, stats.loss, stats.targets_per_s)
    return model if ema is None else ema.model


def final_results(model: SequentialModel, test_model: SequentialModel, data: PreparedDataset, cfg: RunConfig,
                  device: torch.device, best_epoch: int, history: list[dict[str, Any]],
                  train_seconds: float, test: bool = True) -> dict[str, Any]:
    """Validation metrics of the chosen checkpoint and test metrics of `test_model` (the same model, or
    its refit on training + validation events); the test split is read here only, and not at all
    with `test=False`."""
    L = cfg.data.max_len
    valid = evaluate(model, data, "valid", L, cfg.eval, device)
    tested = evaluate(test_model, data, "test", L, cfg.eval, device) if test else None
    selection = f"best validation {selection_metric(cfg.eval.ks)}"
    if cfg.train.refit:
        selection += (f"; the tested model was then trained again from its starting point (the seed's initial "
                      f"weights, or the pre-trained model) for {best_epoch} epochs on training + validation events")
    return {
        "seqrec_version": __version__,
        "model": cfg.model.name,
        "dataset": data.meta["name"],
        "protocol": {**protocol(data, cfg.eval, "test" if test else "valid", L, model), "model_selection": selection,
                     "refit": cfg.train.refit},
        "checkpoint": {"epoch": best_epoch, "path": "checkpoint"},
        "valid": valid,
        **({"test": tested} if tested is not None else {}),
        "epochs_run": sum(1 for r in history if r["epoch"] > 0),  # a fine-tuning's epoch 0 trained nothing
        "train_seconds": train_seconds,
        "peak_rss_mb": peak_rss_mb(),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "device": str(device),
    }
