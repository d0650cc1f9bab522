"""`seqrec carry-log FILE --to RUN`: a catalogue log (`seqrec.serve.catalogue_log`) carried over to the
catalogue of another run, such as one trained again on newer data, so that a deploy keeps what the live
catalogue was given since: in the log's place while services keep it, or into a new file.

The new file is a new log of RUN's catalogue (its catalogue line names RUN's items and the file it carries:
`"carried": {"from": [device, inode, bytes], "run": ..., "version": ...}`) holding the old log's changes that
still mean something there, each item as the old catalogue had it last:
- items the old log added by text that RUN does not know: added with their last text (and its vector);
- items RUN knows whose last change in the old log removed them: removed;
- texts the old log gave items RUN knows are not carried (RUN was trained with its own texts for them), nor
  removals of items RUN does not know; both are counted.

The copy is made under the old file's exclusive lock, so no change is made to it meanwhile. A process that
keeps the old file finds it replaced by one that is not a compaction of it: it refuses catalogue changes
from then on (503) and serves what it has until it is replaced; the workers of `seqrec serve --workers N`
replaced on SIGHUP, loading the new run, replay the new file."""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from seqrec.errors import SeqrecError
from seqrec.serve.catalogue_compact import compacted, folded_log, replace_file
from seqrec.serve.catalogue_file import catalogue_fingerprint, line_bytes


def carry(path: Path | str, raw_ids: Sequence[str], run: str, version: str | None, no_text: str | None,
          out: Path | str | None = None) -> dict[str, int]:
    """Write the log `path` over to the catalogue whose items are `raw_ids` (run `run`, checkpoint `version`),
    in `path`'s place or into `out`. `no_text`: why that run cannot take items by text (an ID-only model), if
    it cannot: a log that added items is then refused. -> counts: `items` added and `removed` in the new
    file, `texts_known` (texts of items the run knows) and `removed_unknown` (removals of items it does not)
    not carried, `already` 1 when the log is already the run's (left as it is)."""
    path = Path(path).resolve()
    target = path if out is None else Path(out).resolve()
    if out is not None and target.exists():
        raise SeqrecError(f"{target} exists: carry the log into a new file (or leave out --out to replace {path})")
    fingerprint = catalogue_fingerprint(raw_ids)
    with folded_log(path, "carry") as (fd, data, head, texts, removed, _):
        if head is None:
            raise SeqrecError(f"{path}: no catalogue line at its start (an empty log, or one written before "
                              "logs named their catalogue): there is nothing to carry")
        known = set(raw_ids)
        counts = {"items": 0, "removed": 0, "texts_known": 0, "removed_unknown": 0, "already": 0}
        if head["fingerprint"] == fingerprint:
            counts["already"] = 1
            return counts
        add = {raw: texts[raw] for raw in texts if raw not in known and not removed[raw]}
        gone = {raw: True for raw, is_removed in removed.items() if is_removed and raw in known}
        counts.update(items=len(add), removed=len(gone), texts_known=sum(raw in known for raw in texts),
                      removed_unknown=sum(is_removed and raw not in known for raw, is_removed in removed.items()))
        if add and no_text:
            raise SeqrecError(f"{path} added {len(add):,} item(s) by text that {run} does not know, and it "
                              f"cannot take items by text ({no_text}): they cannot be carried")
        old = os.fstat(fd)
        whole = data[: data.rfind(b"\n") + 1]  # a cut-short last line was never a change
        new_head = {"op": "catalogue", "items": len(raw_ids), "fingerprint": fingerprint,
                    "log": secrets.token_hex(8),
                    "carried": {"from": [old.st_dev, old.st_ino, len(whole)], "run": run, "version": version}}
        replace_file(target, line_bytes(new_head) + compacted(add, gone), old)
    return counts

