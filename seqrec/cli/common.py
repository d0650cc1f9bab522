"""Helpers shared by the command modules of `seqrec`: where datasets live, how metrics print.

Every command module imports this one and no other command module, so that each can be imported alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    raise SeqrecError(f"no prepared dataset {ref!r} (looked in {path} and {named}); run `seqrec data prepare`")


def run_config(run: Path, overrides: Sequence[str] = ()) -> RunConfig:
    """The resolved config of a run folder, from its config.json (whose presence the caller checked)."""
    from seqrec.config import resolve
    from seqrec.data.io import read_json

    raw = read_json(run / "config.json")
    if not isinstance(raw, dict):
        raise SeqrecError(f"{run / 'config.json'}: not a run config (expected a JSON object)")
    if isinstance(raw.get("train"), dict):  # saved before the key existed: what that run trained with
        raw["train"].setdefault("sparse_items", False)
    return resolve(raw, overrides, model_defaults=False)


def print_metrics(results: dict[str, Any]) -> None:
    ks = results["protocol"]["ks"]
    names = ("recall", "ndcg", "mrr")
    print(f"{'split':<7}" + "".join(f"{m + '@' + str(k):>12}" for k in ks for m in names))
    for split in ("valid", "test"):
        if split in results:
            print(f"{split:<7}" + "".join(f"{results[split][f'{m}@{k}']:>12.4f}" for k in ks for m in names))
