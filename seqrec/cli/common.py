"""Helpers shared by the command modules of `seqrec`: where datasets live, how metrics print.

Every command module imports this one and no other command module, so that each can be imported alone.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqrec.data.io import RUN_FILES
from seqrec.errors import SeqrecError

if TYPE_CHECKING:
    from seqrec.config import RunConfig


def _home() -> Path:
    from seqrec.data.fetch import seqrec_home

    return seqrec_home()


def resolve_dataset(ref: str) -> Path:
    """A prepared-dataset folder, or a name under $SEQREC_HOME/prepared."""
    path = Path(ref)
    if (path / "meta.json").is_file():
        return path
    named = _home() / "prepared" / ref
    if (named / "meta.json").is_file():
        return named
    if len(path.parts) > 1 or path.is_dir():  # a path, not a name: the names prepared are no hint
        what = "holds no meta.json (a folder `seqrec data prepare --out` writes)" if path.is_dir() else "does not exist"
        raise SeqrecError(f"no prepared dataset at {ref!r}: {what}")
    prepared = sorted(p.parent.name for p in named.parent.glob("*/meta.json"))
    close = difflib.get_close_matches(ref, prepared, n=1)
    if close:
        hint = f"did you mean {close[0]!r}?"
    elif prepared:
        more = ", ..." if len(prepared) > 12 else ""
        hint = f"prepared: {', '.join(prepared[:12])}{more}; or run `seqrec data prepare`"
    else:
        hint = "none is prepared yet: run `seqrec data prepare`"
    raise SeqrecError(f"no prepared dataset {ref!r} (looked in {path} and {named}); {hint}")


def dataset_ref(ref: str, found: Path) -> str:
    """What a run records of the dataset `ref` resolved to `found`: a name under $SEQREC_HOME/prepared as it
    is, a path made absolute (a relative one would name another folder, or none, from elsewhere)."""
    return ref if found == _home() / "prepared" / ref else str(found.resolve())


def check_out_parent(out: Path) -> None:
    """Refuse an output folder under a file before any work (it could only fail once the work is done)."""
    for parent in Path(out).absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise SeqrecError(f"--out {out}: {parent} is a file, not a folder")
            return


@contextlib.contextmanager
def run_folder(out: Path, overwrite: bool) -> Iterator[Path]:
    """Around writing a new run into `out`: it must be absent or empty, or, with `overwrite`, hold a run, which
    is moved aside meanwhile and removed when the new run is written (put back if writing it fails, so a
    failed command leaves the old run as it was). A run there is refused otherwise (the new run would mix
    its files with the old one's), as is any folder that is not a run. Checked by one process of a
    distributed run (the first rank writes the folder)."""
    aside = None
    check_out_parent(out)
    if os.environ.get("RANK", "0") == "0" and out.exists():
        if not out.is_dir():
            raise SeqrecError(f"--out {out}: a file is there, not a run folder")
        if any(out.iterdir()):
            if not any((out / name).exists() for name in RUN_FILES):
                raise SeqrecError(f"--out {out}: the folder holds other files, not a run; choose another --out")
            if not overwrite:
                raise SeqrecError(f"--out {out} holds a run ({run_progress(out)}); "
                                  "choose another --out, or add --overwrite to replace it")
            aside = out.with_name(f".{out.name}.replaced-{os.getpid()}")
            os.rename(out, aside)
    try:
        yield out
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) and os.environ.get("RANK", "0") == "0":  # what is left to go on with
            print(f"seqrec: {out}: " + ("the run it held is back as it was (--overwrite is undone)" if aside else
                                        run_progress(out, f"`seqrec train --resume {out}`")), file=sys.stderr)
        if aside is not None:
            shutil.rmtree(out, ignore_errors=True)
            os.rename(aside, out)
        raise
    if aside is not None:
        shutil.rmtree(aside)


def run_progress(run: Path, resume: str = "--resume it") -> str:
    """How far a training run folder got, in words: "finished", "not finished: ... " + `resume` (how to go on),
    or interrupted before anything could be resumed."""
    ended = (run / "results.json").is_file() or (run / "checkpoint" / "model.json").is_file()
    if ended and not (run / "state").is_dir():
        return "finished"  # its resumable state is removed when training ends (and the test may not have run)
    try:
        epoch = int(json.loads((run / "state" / "state.json").read_text())["loop"]["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return "interrupted before its first epoch ended: nothing to resume; --overwrite starts it again"
    return f"not finished: stopped after epoch {epoch}; {resume}"




def zero_shot_run(run: Path, dataset: str | None, device: str) -> Path:
    """A pre-training run served on `dataset`: its zero-shot run folder (made once, inside the pre-training
    run, keyed by the dataset's fingerprint); any other run as it is."""
    from seqrec.train.transfer import is_pretrain_run

    if not is_pretrain_run(run):
        if dataset:
            raise SeqrecError("--dataset is for a pre-training run (used zero-shot on that dataset); "
                              f"{run} is a trained run and has its own catalogue")
        return run
    if not dataset:
        raise SeqrecError(f"{run} is a pre-training run, used zero-shot on a catalogue: name it with --dataset "
                          "(the items it ranks, and any history's ids, are that catalogue's)")
    from seqrec.data.dataset import PreparedDataset
    from seqrec.train.device import pick_device
    from seqrec.train.transfer import zero_shot, zero_shot_config

    data = PreparedDataset.load(resolve_dataset(dataset))
    folder = run / "zero-shot" / f"{data.meta['name']}-{data.fingerprint}"
    if not (folder / "results.json").is_file():
        cfg = zero_shot_config(run)
        cfg.data.dataset = str(data.path)
        zero_shot(run, data, cfg, folder, pick_device(device))
    return folder


def run_config(run: Path, overrides: Sequence[str] = ()) -> RunConfig:
    """The resolved config of a run folder, from its config.json (whose presence the caller checked)."""
    from seqrec.config import saved_config

    return saved_config(run / "config.json", overrides)


def print_metrics(results: dict[str, Any]) -> None:
    """The metrics of each split evaluated (and of its cold and warm targets, when `evaluate --cold` measured
    them) with the number of users each row averages over."""
    ks = results["protocol"]["ks"]
    names = ("recall", "ndcg", "mrr")
    if results["protocol"].get("filter_seen"):  # another protocol than the default: said where it prints
        print("(already-seen items removed from the ranking: eval.filter_seen)")
    if results["protocol"].get("history_bias"):  # another model than the published ones: said where it prints
        print("(a model with the history bias: a learned score offset for items already in the user's history, "
              "model.history_bias" + ("" if results["protocol"].get("filter_seen") else
                                      "; seen items stay in the ranking") + ")")
    if results["protocol"].get("refit") and "test" in results:  # the two rows are of two models: say so
        print("(test: the model trained again on training + validation events for the chosen epochs, train.refit; "
              "valid: the validation-chosen model)")
    if any(split.endswith(" cold") for split in results):
        print("(cold: targets whose item occurs in no training event; warm: the others)")
    print(f"{'split':<11}" + "".join(f"{m + '@' + str(k):>12}" for k in ks for m in names) + f"{'users':>9}")
    for split in ("valid", "valid cold", "valid warm", "test", "test cold", "test warm"):
        row = results.get(split)
        if row is None:
            continue
        users = f"{int(row['n_users']):>9,}" if "n_users" in row else ""
        if f"recall@{ks[0]}" not in row:  # a kind of target this split has none of
            print(f"{split:<11}" + f"{'(no such targets)':>{12 * len(ks) * len(names)}}" + users)
            continue
        print(f"{split:<11}" + "".join(f"{row[f'{m}@{k}']:>12.4f}" for k in ks for m in names) + users)


def check_model_flag(raw: dict[str, Any], model: str | None, config: str | None) -> None:
    """`--model` beside a config written for another model is refused: its settings are that model's."""
    named = raw.get("model", {}).get("name") if isinstance(raw.get("model"), dict) else None
    if model and named and named != model:
        raise SeqrecError(f"--model {model} contradicts {config}, a config for {named} (its [model] and [train] "
                          f"settings are {named}'s): drop --model, or give a config for {model}")
