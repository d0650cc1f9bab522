"""`seqrec tune`: a validation-only search over a model's settings with Optuna, then one final run.

    RUN/study.db       the Optuna study (SQLite): `seqrec tune` again with the same --out goes on with it
                       (refused unless the model, the dataset and the base config are the study's own)
    RUN/trials/N/      trial N's run folder (trained with refit off and never tested)
    RUN/trials.json    every trial: its settings, validation NDCG@10, state (complete / pruned / failed, with
                       its error), seconds; RUN/tune.png plots validation NDCG@10 against the study's time
    RUN/best/          the best trial's settings trained again as an ordinary run (the refit of the base
                       config, or of the model's training defaults, applies) and tested once: the only
                       time the test split is read

Trials are pruned by Optuna's median rule on validation NDCG@10 after `warmup` evaluations; the
study stops at `budget_s` seconds (a trial still running then stops at its next epoch's end, and
keeps its best epoch so far) or `trials` trials. No trial trains longer than its share of the
budget (`min_trials`): on a large dataset one trial of a patient recipe would otherwise take it
all. The first trial of a study is the base config itself (a shipped recipe or the model's defaults;
its "auto" settings decided from the data), so the best trial is never below the base on validation
under the same cap; each later trial is a TPE sample from the model's space (`SPACES`) on top of it.
The base trial runs alone before trials run `jobs` at a time. A trial that raises is recorded as
failed (its error in the report) and the study goes on.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seqrec.config import resolve, saved_config
from seqrec.data.dataset import PreparedDataset
from seqrec.data.io import write_json_atomic
from seqrec.errors import SeqrecError
from seqrec.train.tune_space import SPACES, Space, auto_jobs, base_point, fits, get_setting

__all__ = ["MIN_TRIALS", "base_config", "tune"]

log = logging.getLogger(__name__)

MIN_TRIALS = 6  # the budget is shared so that at least this many trials run (each capped at its share)


# "auto" settings decided from the machine as well as the data (seqrec.train.auto): a trial's are kept
LOSS_COMPANIONS = ("model.negatives", "model.logq", "model.n_negatives")
MACHINE_DECIDED = ("model.loss", *LOSS_COMPANIONS, "train.batch_size", "train.sparse_items")


def _with(cfg: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    for dotted, value in values.items():
        section, key = dotted.split(".")
        out.setdefault(section, {})[key] = value
    return out


def tune(base: dict[str, Any], data: PreparedDataset, run_dir: Path, budget_s: float, trials: int | None,
         warmup: int = 3, jobs: int | None = 1, seed: int = 0, final: bool = True, min_trials: int = MIN_TRIALS
         ) -> dict[str, Any]:
    """Search on validation, then train the best settings once and test them. Returns the report.

    No trial trains for more than `budget_s * jobs / min_trials` seconds, so that the budget holds at
    least `min_trials` trials (a trial at its cap keeps its best epoch so far). `jobs` None: `auto_jobs`."""
    if min_trials < 1:
        raise SeqrecError(f"--min-trials must be >= 1, got {min_trials}")
    try:
        import optuna  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the environment
        raise SeqrecError("seqrec tune needs Optuna: pip install 'seqrec[tune]'") from None
    from seqrec.train.loop import fit

    base_cfg = resolve(base)  # the base must be valid before any trial runs
    # the optimiser the base resolves to (its model's training defaults included): a searched weight
    # decay must not turn SASRec's AdamW into Adam with L2 (seqrec.config.with_model_train_defaults)
    base = _with(base, {"train.optimizer": base_cfg.train.optimizer})
    name = base_cfg.model.name
    if name not in SPACES:
        raise SeqrecError(f"seqrec tune has no search space for model {name!r}; one of {', '.join(SPACES)}")
    space = SPACES[name]()
    run_dir.mkdir(parents=True, exist_ok=True)
    study = _open_study(run_dir, base, name, data, warmup, seed)
    n_before = len(study.trials)  # before the base is queued: it runs in this call
    if not _base_ran(study):  # the first trial is the base itself: the search never ends below it on validation
        point = base_point(space, base_cfg, data)  # (again where an interrupted call left it failed or unrun)
        study.set_user_attr("base_point", point)
        study.enqueue_trial(point, user_attrs={"base": True, "base_keys": sorted(point)})
    if jobs is None:  # said once the study is open: every refusal comes before it
        jobs, why = auto_jobs(base_cfg.train.threads)
        log.info("auto: --jobs %d (%s)", jobs, why)
    started = time.time()
    objective = _objective(base, data, space, run_dir, started + budget_s, budget_s * jobs / min_trials, fit)
    _optimize(study, objective, budget_s, trials, jobs)
    n_new = len(study.trials) - n_before
    log.info("tune: %d trials this call (%d in the study), %.0f s", n_new, len(study.trials),
             time.time() - started)
    report = {**_report(study, run_dir), "n_trials_this_call": n_new}
    write_json_atomic(run_dir / "trials.json", report)  # also where no trial completed: the errors are there
    _check_failures(study.trials[n_before:], study.trials, run_dir)
    if final:
        report["best_run"] = _final_run(study, base, data, run_dir, fit)
        write_json_atomic(run_dir / "trials.json", report)
    return report


class _NoInterruptTraceback(logging.Filter):
    """Optuna logs a trial stopped by Ctrl-C as failed, with a KeyboardInterrupt traceback; the command says
    "interrupted" itself, and the study's next call runs a cut-short base trial again."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.exc_info[0] is KeyboardInterrupt)


def _base_ran(study: Any) -> bool:
    """Whether the base trial ran to its end (completed, or pruned) or is queued already: a study's first
    call queues it, and a call after one interrupted during it queues it again."""
    import optuna

    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.WAITING)
    return any(t.state in done for t in study.trials if t.user_attrs.get("base", t.number == 0))


def _open_study(run_dir: Path, base: dict[str, Any], model: str, data: PreparedDataset, warmup: int,
                seed: int) -> Any:
    """RUN/study.db's study, new or resumed; a resumed one must have been made with the same model, data
    and base config (it would otherwise report its own best trial and train it with the new base)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials_log = logging.getLogger("optuna.study._optimize")
    if not any(isinstance(f, _NoInterruptTraceback) for f in trials_log.filters):
        trials_log.addFilter(_NoInterruptTraceback())
    study = optuna.create_study(
        study_name="seqrec-tune", storage=f"sqlite:///{(run_dir / 'study.db').resolve()}", load_if_exists=True,
        direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=warmup))
    study.sampler = optuna.samplers.TPESampler(seed=seed + len(study.trials))  # a resumed study draws anew
    made_with = {"model": model, "dataset_fingerprint": data.fingerprint, "base": base}
    if "base" in study.user_attrs:
        _check_same_study(study.user_attrs, made_with, data, run_dir)
    for key, value in made_with.items():
        study.set_user_attr(key, value)
    return study


def _check_same_study(stored: dict[str, Any], new: dict[str, Any], data: PreparedDataset, run_dir: Path) -> None:
    """Refuse to go on with a study made with another model, dataset or base config. A study written before
    the model and the fingerprint were stored is compared by its base alone (dataset path included)."""
    again = "; give a new --out, or the study's own arguments to go on with it"
    if stored.get("model", new["model"]) != new["model"]:
        raise SeqrecError(f"--out {run_dir}: its study tunes model {stored['model']!r}, not {new['model']!r}{again}")
    was = stored.get("dataset_fingerprint", data.fingerprint)
    if was != data.fingerprint:
        raise SeqrecError(f"--out {run_dir}: its study tunes another dataset (fingerprint {was}; {data.path} "
                          f"has {data.fingerprint}){again}")
    # checked above by the model's name and the data's fingerprint (the same data may be at another path)
    skip = {key for key, attr in (("model.name", "model"), ("data.dataset", "dataset_fingerprint")) if attr in stored}
    old, now = _flat(stored["base"]), _flat(json.loads(json.dumps(new["base"])))  # as the study stores it
    differ = [k for k in sorted(old.keys() | now.keys()) if k not in skip and old.get(k, _UNSET) != now.get(k, _UNSET)]
    if differ:
        shown = ", ".join(f"{k} {_show(old, k)} there, {_show(now, k)} now" for k in differ[:3])
        more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
        raise SeqrecError(f"--out {run_dir}: its study has another base config ({shown}{more}){again}")


_UNSET = object()


def _show(flat: dict[str, Any], key: str) -> str:
    return repr(flat[key]) if key in flat else "unset"


def _flat(raw: dict[str, Any]) -> dict[str, Any]:
    return {f"{section}.{key}": value for section, table in raw.items() for key, value in table.items()}


def _objective(base: dict[str, Any], data: PreparedDataset, space: Space, run_dir: Path, deadline: float,
               share_s: float, fit: Callable[..., dict[str, Any]]) -> Callable[[Any], float]:
    """One trial: the base with the trial's draws, trained on validation in RUN/trials/N, capped at
    `share_s` seconds and at the study's `deadline`."""
    import optuna

    def objective(trial: Any) -> float:
        # the base trial keeps the base's own value of a setting its range cannot hold (a weight decay of 0)
        drawn = [k for k in space if not trial.user_attrs.get("base") or k in trial.user_attrs["base_keys"]]
        values = fits({k: space[k].draw(trial, k) for k in drawn}, base)
        # a trial ends with the study's budget too (Optuna's timeout only stops new trials from starting),
        # and at its share of it
        cap = max(1.0, min(deadline - time.time(), share_s))
        own = float(base.get("train", {}).get("time_budget_s") or 0)
        raw = _with(base, {**values, "train.refit": False, "train.progress": False,
                           "train.time_budget_s": min(own, cap) if own > 0 else cap})
        trial.set_user_attr("started", time.time())

        def report(epoch: int, metric: float, elapsed: float) -> None:
            trial.report(metric, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()

        trial_dir = run_dir / "trials" / str(trial.number)
        try:
            cfg = resolve(raw)
            trial.set_user_attr("config", raw)
            results = fit(cfg, data, trial_dir, on_epoch=report, test=False)
        except optuna.TrialPruned:
            raise
        except Exception as exc:  # the study goes on (Optuna logs the traceback); the reason is kept for its report
            trial.set_user_attr("error", _one_line(exc))
            raise
        finally:  # what the machine decided for this trial (fit decides before its first epoch, into config.json)
            if (trial_dir / "config.json").is_file():
                decided = saved_config(trial_dir / "config.json")
                trial.set_user_attr("decided", {k: get_setting(decided, k) for k in MACHINE_DECIDED
                                                if get_setting(decided, k) is not None})
        return float(results["valid"]["ndcg@10"])

    return objective


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    return text if isinstance(exc, SeqrecError) else f"{type(exc).__name__}: {text}".rstrip(": ")


def _optimize(study: Any, objective: Callable[[Any], float], budget_s: float, trials: int | None,
              jobs: int) -> None:
    """Run the queued trials (the base) one at a time, then the others `jobs` at a time. Parallel workers
    can both take one queued trial from a SQLite study (optuna/optuna#4002) and train it twice in one
    folder. A trial that raises is recorded as failed and the study goes on."""
    from optuna.trial import TrialState

    started = time.time()
    queued = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    first = queued if trials is None else min(queued, trials)
    if first:
        study.optimize(objective, timeout=budget_s, n_trials=first, n_jobs=1, catch=(Exception,))
    left = None if trials is None else trials - first
    remaining = budget_s - (time.time() - started)
    if (left is None or left > 0) and remaining > 0:
        study.optimize(objective, timeout=remaining, n_trials=left, n_jobs=jobs, catch=(Exception,))


def _check_failures(new: list[Any], trials: list[Any], run_dir: Path) -> None:
    """Name the trials that failed: a warning where some trial completed, else the error (not the budget's
    fault where trials failed)."""
    from optuna.trial import TrialState

    if any(t.state == TrialState.COMPLETE for t in trials):
        failed = [t for t in new if t.state == TrialState.FAIL]
        if failed:
            log.warning("tune: %d of %d trials this call failed; the first, trial %d: %s", len(failed), len(new),
                        failed[0].number, failed[0].user_attrs.get("error", "see Optuna's warning above"))
        return
    failed = [t for t in trials if t.state == TrialState.FAIL]
    if not failed:
        raise SeqrecError(f"{run_dir}: no trial completed within the budget; give more time (--budget)")
    why = failed[0].user_attrs.get("error", "see Optuna's warning above")
    raise SeqrecError(f"{run_dir}: no trial completed: {len(failed)} of {len(trials)} failed; the first, "
                      f"trial {failed[0].number}: {why}")


def _final_run(study: Any, base: dict[str, Any], data: PreparedDataset, run_dir: Path,
               fit: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The best trial's settings trained again as an ordinary run in RUN/best, and tested."""
    best = study.best_trial
    best_raw = _with(base, {k: v for k, v in best.params.items()})
    best_raw = _with(best_raw, {"train.progress": False})
    # the best trial's machine-dependent decisions, so the final run does not make them again under other load
    base_cfg = resolve(base)
    best_raw = _with(best_raw, {k: v for k, v in best.user_attrs.get("decided", {}).items()
                                if get_setting(base_cfg, k) == "auto" or k in LOSS_COMPANIONS})
    if "model.d" in best.params:
        best_raw = _with(best_raw, fits({"model.d": best.params["model.d"]}, base))
    shutil.rmtree(run_dir / "best", ignore_errors=True)  # a resumed study trains its final run again
    results = fit(resolve(best_raw), data, run_dir / "best")
    return {"path": str(run_dir / "best"), "config": best_raw, "valid": results["valid"], "test": results["test"]}


def _report(study: Any, run_dir: Path) -> dict[str, Any]:
    rows = []
    for t in study.trials:
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete else None
        rows.append({"number": t.number, "state": t.state.name.lower(), "params": t.params,
                     "valid_ndcg@10": t.value, "last_reported": max(t.intermediate_values.items(), default=None),
                     "seconds": seconds, "started": t.datetime_start.timestamp() if t.datetime_start else None,
                     "error": t.user_attrs.get("error"), "base": bool(t.user_attrs.get("base"))})
    best = study.best_trial if any(r["state"] == "complete" for r in rows) else None
    report = {"study": str(run_dir / "study.db"), "n_trials": len(rows),
              "base_point": study.user_attrs.get("base_point"),
              "best_trial": None if best is None else {"number": best.number, "params": best.params,
                                                       "valid_ndcg@10": best.value},
              "trials": rows}
    from seqrec.train.plots import study_curve

    study_curve(rows, run_dir / "tune.png")
    return report


def base_config(config: Path | None, model: str | None, dataset: str, overrides: list[str]) -> dict[str, Any]:
    """The raw base config of a study: a TOML recipe and/or --model, with --set overrides merged in."""
    from seqrec.config import load_toml, parse_override

    raw = load_toml(config) if config else {}
    if model:
        raw.setdefault("model", {})["name"] = model
    raw.setdefault("data", {})["dataset"] = dataset
    for text in overrides:
        (section, key), value = parse_override(text)
        raw.setdefault(section, {})[key] = value
    return raw
