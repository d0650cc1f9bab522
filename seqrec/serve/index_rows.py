"""The rows of a FAISS index (`seqrec.serve.faiss_index`): the item each row was added for, each item's
current row, and the bitmap of the rows a search may return; kept up to date at each change of the
catalogue in time that grows with the change, not with the catalogue.

Rows are never taken out of a FAISS index: an item given a new vector gets a new row and its old one
dies, a removed item's row dies, a restored item's row lives again; the index is rebuilt once enough
rows are dead. The arrays are views of stores with room (`seqrec.nn.rows`): rows a change adds are
written after the rows of the views that searches hold, and the entries of existing rows and items
change only in `RowChange.apply`, which the index's owner runs under its write lock, with no search
under way. So a search never sees a change half made, and a change that fails before `apply` leaves
the rows as they were.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from seqrec.nn.rows import append_rows


@dataclass(frozen=True)
class Rows:
    """R rows for N items (ids 0..N, 0 the padding item)."""

    row_to_id: np.ndarray  # (R,) int64: the item id each row was added for
    id_to_row: np.ndarray  # (N+1,) int64: each item's current row (-1: none)
    live: np.ndarray  # (ceil(R / 8),) uint8 bitmap (little-endian bits) of the rows searches may return
    n_live: int
    _stores: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None] = (None, None, None)

    @staticmethod
    def built(ids: np.ndarray, n_ids: int, removed: np.ndarray) -> Rows:
        """Rows 0..len(ids)-1 for the items `ids`, of `n_ids` ids in all; live unless `removed`."""
        id_to_row = np.full(n_ids, -1, dtype=np.int64)
        id_to_row[ids] = np.arange(len(ids))
        return Rows(ids.astype(np.int64), id_to_row, np.zeros(0, np.uint8), 0).select(removed)

    def select(self, removed: np.ndarray) -> Rows:
        """The live rows recomputed from scratch (an item's current row, unless the item is removed): a
        pass over every row, for an index just built."""
        ids = self.row_to_id
        ok = (self.id_to_row[ids] == np.arange(len(ids))) & ~removed[ids]
        return Rows(ids, self.id_to_row, np.packbits(ok, bitorder="little"), int(ok.sum()))

    def bit(self, rows: np.ndarray) -> np.ndarray:
        """(n,) bool: whether each row is live."""
        return ((self.live[rows >> 3] >> (rows & 7).astype(np.uint8)) & 1).astype(bool)

    def change(self, removed: np.ndarray, moved: np.ndarray, rowless: np.ndarray,
               flipped: np.ndarray) -> RowChange:
        """The rows once `moved` ids get new rows (R, R+1, ... in their order) and `rowless` ids lose
        theirs (their old rows die), and the ids `flipped` (removed or restored, by `removed`, the
        catalogue's (N+1,) state after the change) keep their rows, dead or live again. Ids may be new
        (up to len(removed) - 1); the three sets are disjoint."""
        n_rows, n_ids = len(self.row_to_id), len(removed)
        st_r, st_i, st_l = self._stores
        row_to_id_t = append_rows(torch.from_numpy(self.row_to_id), torch.from_numpy(moved), st_r)
        id_to_row_t = append_rows(torch.from_numpy(self.id_to_row),
                                  torch.full((n_ids - len(self.id_to_row),), -1, dtype=torch.long), st_i)
        n_bytes = (n_rows + len(moved) + 7) // 8
        live_t = append_rows(torch.from_numpy(self.live), torch.zeros(n_bytes - len(self.live), dtype=torch.uint8),
                             st_l)
        grown = Rows(row_to_id_t[: n_rows + len(moved)].numpy(), id_to_row_t[:n_ids].numpy(),
                     live_t[:n_bytes].numpy(), self.n_live, (row_to_id_t, id_to_row_t, live_t))
        # the old rows of the moved and rowless ids die; flipped ids' current rows follow `removed`
        old = np.concatenate([self.id_to_row[moved[moved < len(self.id_to_row)]],
                              self.id_to_row[rowless[rowless < len(self.id_to_row)]]])
        old = old[old >= 0]
        old = old[self.bit(old)]
        flip_rows = self.id_to_row[flipped]
        has_row = flip_rows >= 0
        flip_rows, flip_live = flip_rows[has_row], ~removed[flipped[has_row]]
        turn = flip_live != self.bit(flip_rows)
        new_rows = np.arange(n_rows, n_rows + len(moved))
        new_live = ~removed[moved]
        rows = np.concatenate([old, flip_rows[turn], new_rows])
        values = np.concatenate([np.zeros(len(old), bool), flip_live[turn], new_live])
        n_live = self.n_live - len(old) + int(flip_live[turn].sum()) - int((~flip_live[turn]).sum()) \
            + int(new_live.sum())
        ids = np.concatenate([moved, rowless])
        id_rows = np.concatenate([new_rows, np.full(len(rowless), -1, np.int64)])
        return RowChange(grown, rows, values, ids, id_rows, n_live)


@dataclass(frozen=True)
class RowChange:
    """A change planned by `Rows.change`; `apply` makes it (under the index's write lock)."""

    rows_grown: Rows  # the arrays grown for the change; its existing entries not yet changed
    bits_at: np.ndarray  # rows whose live bit is set to `bits`
    bits: np.ndarray
    ids: np.ndarray  # items whose current row becomes `id_rows`
    id_rows: np.ndarray
    n_live: int

    def apply(self) -> Rows:
        r = self.rows_grown
        r.id_to_row[self.ids] = self.id_rows
        at, mask = self.bits_at >> 3, np.left_shift(np.uint8(1), (self.bits_at & 7).astype(np.uint8))
        np.bitwise_or.at(r.live, at[self.bits], mask[self.bits])
        np.bitwise_and.at(r.live, at[~self.bits], ~mask[~self.bits])
        return Rows(r.row_to_id, r.id_to_row, r.live, self.n_live, r._stores)
