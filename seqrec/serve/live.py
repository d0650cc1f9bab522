"""What changes a `Recommender`'s live catalogue: items added or given a new text by their text alone
(text models), items removed, and the catalogue log that keeps those changes across restarts
(`seqrec.serve.catalogue_log`). `Recommender` inherits it; it reads the recommender's model,
catalogue and ONNX engine."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from seqrec.errors import SeqrecError
from seqrec.models.base import SequentialModel
from seqrec.serve.catalogue import Catalogue
from seqrec.serve.catalogue_log import CatalogueLog
from seqrec.serve.onnx_engine import OnnxEncoder


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

    def add_items(self, texts: Mapping[str, str]) -> tuple[list[str], list[str]]:
        """Add items (raw id -> text) or replace the text of known ones, from text alone; they are
        recommendable (and usable in histories) as soon as this returns. Needs a text model.
        Returns (added, replaced): the raw ids that were new and those whose text was replaced, as
        decided under the catalogue's lock (so two concurrent calls never both add one id)."""
        if not self.takes_text:
            raise SeqrecError(f"{self.model.name} has no item text: new items need a text model (unisrec)")
        if self._no_new_text:
            raise SeqrecError(self._no_new_text)
        if not texts:
            raise SeqrecError("no items given")
        from seqrec.data.text import encode_texts

        options = self.model.config.text_options()  # type: ignore[union-attr,operator]
        text_vectors = encode_texts(list(texts.values()), options, encoder=self.text_encoder())
        device = self.catalogue.vectors.device
        cat, model = self.catalogue, self.model
        with cat.lock, torch.no_grad(), self._change({"op": "items", "items": dict(texts)}):
            known = [i for i, raw in enumerate(texts) if raw in cat.index]
            new = [i for i, raw in enumerate(texts) if raw not in cat.index]
            raws, values = list(texts), list(texts.values())
            if known:
                ids = torch.tensor([cat.index[raws[i]] for i in known], device=device)
                model.set_item_text(ids, text_vectors[known].to(device))  # type: ignore[operator]
                cat.replace(ids.tolist(), [values[i] for i in known], self._item_side(ids))
            if new:
                first = int(model.n_items) + 1  # type: ignore[arg-type]
                try:
                    ids = torch.tensor(list(model.add_items(text_vectors[new].to(device))),  # type: ignore[operator]
                                       device=device)
                    cat.append([raws[i] for i in new], [values[i] for i in new], self._item_side(ids), None)
                except BaseException:  # the model's items match the catalogue's again
                    model.drop_items_from(first)  # type: ignore[operator]
                    raise
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

            self._text_encoder = load_text_encoder(self.model.config.text_options())  # type: ignore[union-attr,operator]
        return self._text_encoder

    def remove_items(self, raws: Sequence[str]) -> None:
        """Stop recommending these items (they stay known, so histories may still hold them)."""
        with self.catalogue.lock:
            ids = self.catalogue.lookup(raws)  # every id known, or nothing removed
            with self._change({"op": "remove", "ids": list(raws)}):
                self.catalogue.remove(ids)

    def close_log(self) -> None:
        """Stop keeping catalogue changes (`keep_log`) and let the file go."""
        journal, self._log = self._log, None
        if journal is not None:
            journal.close()

    def _change(self, record: dict[str, Any]) -> contextlib.AbstractContextManager[None]:
        """(Under the catalogue's lock.) Around making a change: its line in the catalogue log, if one is kept."""
        return contextlib.nullcontext() if self._log is None else self._log.change(record)

    def keep_log(self, path: Path | str, write: bool = True) -> tuple[int, int]:
        """Replay the catalogue changes kept in `path` (items added by text, texts replaced, items removed;
        `seqrec.serve.catalogue_log`), then, with `write`, append every change made from now on, so that
        a restarted service comes back with them. Returns (changes replayed, cut-short lines dropped)."""
        self.close_log()
        journal = CatalogueLog(path)
        counts = journal.replay(self, write)
        self._log = journal if write else None
        return counts
