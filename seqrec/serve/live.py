"""What changes a `Recommender`'s live catalogue: items added or given a new text by their text alone
(text models), items removed, and the catalogue log that keeps those changes across restarts
(`seqrec.serve.catalogue_log`). `Recommender` inherits it; it reads the recommender's model,
catalogue and ONNX engine."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel
from seqrec.serve.catalogue import Catalogue
from seqrec.serve.catalogue_file import pack_vectors
from seqrec.serve.catalogue_log import CatalogueLog
from seqrec.serve.onnx_engine import OnnxEncoder

_ENCODING = threading.Lock()


class LiveCatalogue:
    """Changes to the catalogue of a served model (see `Recommender`)."""

    model: SequentialModel
    catalogue: Catalogue
    _onnx: OnnxEncoder | None
    _text_encoder: Any
    _no_new_text: str | None
    _log: CatalogueLog | None

    @property
    def takes_text(self) -> bool:
        """Whether new items can be added by text (a text model such as UniSRec)."""
        return hasattr(self.model, "add_items")

    def add_items(self, texts: Mapping[str, str], titles: Mapping[str, str] | None = None
                  ) -> tuple[list[str], list[str]]:
        """Add items (raw id -> text) or replace the text of known ones, from text alone; they are
        recommendable (and usable in histories) as soon as this returns. Needs a text model. `titles`
        (raw id -> title) gives some of them a title to show other than their text (an item's text is
        its title otherwise, a replaced one's too).
        Returns (added, replaced): the raw ids that were new and those whose text was replaced, as
        decided under the catalogue's lock (so two concurrent calls never both add one id)."""
        self._check_takes_text()
        if not isinstance(texts, Mapping) or not texts:
            raise SeqrecError("the items are given as a non-empty mapping of item id -> text, e.g. "
                              "{'NEW1': 'Blue cordless drill'}")
        pairs = [*texts.items(), *(titles or {}).items()]
        odd = next(((raw, text) for raw, text in pairs if not (isinstance(raw, str) and isinstance(text, str))), None)
        if odd is not None:
            raise SeqrecError(f"item {odd[0]!r} -> {odd[1]!r}: item ids, texts and titles are strings")
        blank_ids = [raw for raw in texts if not raw.strip()]
        if blank_ids:
            raise SeqrecError(f"item id {blank_ids[0]!r}: an item id must not be blank")
        titles = dict(titles or {})
        stray = [raw for raw in titles if raw not in texts]
        if stray:
            raise SeqrecError(f"a title for {stray[0]!r}, which is not among the items given")
        blank = [raw for raw, title in titles.items() if not title.strip()]
        if blank:
            raise SeqrecError(f"item {blank[0]!r}: a title, when given, must not be blank")
        text_vectors = self._encode(list(texts.values()))
        record = None
        if self._log is not None:
            record = {"op": "items", "items": dict(texts), "encoder": self.encoder_key(),
                      "vectors": pack_vectors(text_vectors)}
            if titles:
                record["titles"] = titles
        return self._add_encoded(texts, titles, text_vectors, record)

    def apply_items(self, items: Mapping[str, tuple[str, str | None, np.ndarray | None]]) -> None:
        """Add or replace items (raw id -> (text, its title or None, its frozen-encoder vector or None)) as a
        catalogue log records them, without logging them again; texts without a vector are encoded."""
        self._check_takes_text()
        texts = {raw: text for raw, (text, _, _) in items.items()}
        titles = {raw: title for raw, (_, title, _) in items.items() if title is not None}
        missing = [raw for raw, (_, _, vector) in items.items() if vector is None]
        encoded = dict(zip(missing, self._encode([texts[raw] for raw in missing]), strict=True)) if missing else {}
        rows = [encoded[raw] if vector is None else torch.from_numpy(vector) for raw, (_, _, vector) in items.items()]
        if len({row.shape for row in rows}) > 1 or rows[0].shape[0] != self.text_encoder().dim:
            raise SeqrecError(f"item text vectors of width {rows[0].shape[0]} do not fit the run's text "
                              f"encoder ({self.text_encoder().dim})")
        self._add_encoded(texts, titles, torch.stack(rows), None)

    @property
    def no_new_text(self) -> str | None:
        """Why items cannot be added by text here, or None when they can."""
        if not self.takes_text:
            return f"{self.model.name} has no item text: new items need a text model (unisrec)"
        return self._no_new_text

    def _check_takes_text(self) -> None:
        if self.no_new_text:
            raise SeqrecError(self.no_new_text)

    def _encode(self, texts: list[str]) -> torch.Tensor:
        from seqrec.data.text import encode_texts

        options = self.model.config.text_options()  # type: ignore[union-attr,operator]
        with _ENCODING:  # a request and the log's follower may both encode; the tokenizer is not thread-safe
            return encode_texts(texts, options, encoder=self.text_encoder())

    def _add_encoded(self, texts: Mapping[str, str], titles: Mapping[str, str], text_vectors: torch.Tensor,
                     record: dict[str, Any] | None) -> tuple[list[str], list[str]]:
        device = self.catalogue.vectors.device
        cat, model = self.catalogue, self.model
        with cat.lock, torch.no_grad(), self._change(record):
            known = [i for i, raw in enumerate(texts) if raw in cat.index]
            new = [i for i, raw in enumerate(texts) if raw not in cat.index]
            raws, values = list(texts), list(texts.values())
            shown = [titles.get(raw, text) for raw, text in texts.items()]
            if new:  # first: a failed addition is undone whole
                first = int(model.n_items) + 1  # type: ignore[arg-type]
                try:
                    ids = torch.tensor(list(model.add_items(text_vectors[new].to(device))),  # type: ignore[operator]
                                       device=device)
                    cat.append([raws[i] for i in new], [shown[i] for i in new], self._item_side(ids), None,
                               [values[i] for i in new])
                except BaseException:  # the model's items match the catalogue's again
                    model.drop_items_from(first)  # type: ignore[operator]
                    raise
            if known:
                ids = torch.tensor([cat.index[raws[i]] for i in known], device=device)
                model.set_item_text(ids, text_vectors[known].to(device))  # type: ignore[operator]
                cat.replace(ids.tolist(), [shown[i] for i in known], self._item_side(ids), [values[i] for i in known])
        return [raws[i] for i in new], [raws[i] for i in known]

    def _item_side(self, ids: torch.Tensor) -> torch.Tensor:
        """The vectors of items whose text changed or that were added: their input vectors go to the ONNX
        engine's table (when it serves), their output vectors (returned) to the catalogue."""
        inputs = self.model.input_table(ids)  # type: ignore[operator]
        if self._onnx is not None:
            self._onnx.set_rows(ids.tolist(), inputs)
        return self.model.scored(inputs)  # type: ignore[operator]

    def text_encoder(self) -> Any:
        """The run's frozen text encoder, loaded once (a service loads it at start, not on the first item)."""
        if self._text_encoder is None and self.takes_text:
            from seqrec.data.text import load_text_encoder

            options = self.model.config.text_options()  # type: ignore[union-attr,operator]
            self._text_encoder = load_text_encoder(replace(options, device=str(self.catalogue.vectors.device)))
        return self._text_encoder

    def encoder_key(self, legacy: bool = False) -> str | None:
        """What a text's frozen-encoder vector depends on (the encoder's files and their bytes, its pooling
        and length), as a catalogue log's lines name it; None for a model without item text. `legacy`: the
        key lines written before the bytes counted carry (names and sizes only, `encoder_files`), whose
        vectors are still taken as they were."""
        encoder = self.text_encoder()
        if encoder is None:
            return None
        local = encoder.revision.startswith("local-")  # a fingerprint of the files, wherever they are
        what = [encoder.revision if local else [encoder.source, encoder.revision], encoder.pooling,
                encoder.max_length] + ([] if legacy or encoder.weights is None else [encoder.weights])
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]

    def remove_items(self, raws: Sequence[str]) -> None:
        """Stop recommending these items (they stay known, so histories may still hold them). Every id
        must be known, or nothing is removed."""
        def check() -> None:
            if all(i in self.catalogue.removed for i in self.catalogue.lookup(raws, follow=False)):
                raise _Unchanged()  # removed already: no line for a change that changes nothing

        with contextlib.suppress(_Unchanged), self.catalogue.lock, self._change({"op": "remove", "ids": list(raws)},
                                                                                check=check):
            self.catalogue.remove(self.catalogue.lookup(raws, follow=False))

    def apply_removal(self, raws: Sequence[str]) -> None:
        """Remove items as a catalogue log records it, without logging it again."""
        with self.catalogue.lock:
            self.catalogue.remove(self.catalogue.lookup(raws, follow=False))

    def close_log(self) -> None:
        """Stop keeping catalogue changes (`keep_log`) and let the file go."""
        journal = self._log
        if journal is not None:
            journal.close()  # a change made meanwhile is refused, not made without its line
        self._log = self.catalogue.on_unknown = None

    def _change(self, record: dict[str, Any] | None,
                check: Callable[[], object] | None = None) -> contextlib.AbstractContextManager[None]:
        """(Under the catalogue's lock.) Around making a change: its line in the catalogue log, if one is kept
        and the change is this process's own (`record`); `check` runs after the log's other changes."""
        if self._log is None or record is None:
            return contextlib.nullcontext()
        return self._log.change(self, record, check)

    def keep_log(self, path: Path | str, write: bool = True, follow: bool = False) -> tuple[int, int]:
        """Replay the catalogue changes kept in `path` (items added by text, texts replaced, items removed;
        `seqrec.serve.catalogue_log`); with `write`, append every change made from now on, so that a
        restarted service comes back with them; with `follow`, apply in the background the changes other
        processes append to it (the worker processes of one service, or services started apart on one
        file). Returns (changes replayed, cut-short lines dropped)."""
        self.close_log()
        journal = CatalogueLog(path)
        counts = journal.replay(self, write)
        if follow:
            journal.follow(self)
            # an id unknown here may be another worker's new item, in the file but not yet followed
            self.catalogue.on_unknown = lambda: journal.catch_up(self)
        if write or follow:
            self._log = journal
        else:
            journal.close()  # replayed, and kept no further
        return counts

    @property
    def catalogue_log(self) -> CatalogueLog | None:
        """The catalogue log kept (`keep_log`), if any."""
        return self._log


class _Unchanged(Exception):
    """A change found to change nothing once the other processes' changes are in: it is not logged."""
