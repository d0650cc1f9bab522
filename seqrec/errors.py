"""User-facing errors.

A `SeqrecError` is a mistake in the user's input (a missing file, a bad value).
The CLI prints its message on one line and exits non-zero, without a traceback;
anything else is a bug and keeps its traceback.
"""


class SeqrecError(Exception):
    """An error caused by the user's input; its message names the file, line or value."""


def not_a_run(path: object, missing: str) -> SeqrecError:
    """The error for a folder given as a run that is not one (`missing`: the file it lacks)."""
    from pathlib import Path

    if not Path(str(path)).exists():
        return SeqrecError(f"{path}: no such run folder")
    study = Path(str(path)) / "best"
    hint = f"; the run a `seqrec tune` study trained is {study}" if (study / "config.json").is_file() else ""
    return SeqrecError(f"{path}: not a run folder (no {missing}){hint}")
