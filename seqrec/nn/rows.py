"""Tables that grow by appending rows while readers hold views of them (a live catalogue's items).

A table is the first n rows of a larger store. Appending writes the new rows after the first n, in
place while the store has room, else into a store twice as long: n single-row appends copy O(n) rows
in all, not O(n^2) as `torch.cat` per append does (on a 100,000-item catalogue of 384-d text
vectors, a copy per added item costs more than encoding the item's text). A reader holding the view
of the first n rows never sees the rows written after them, so a table can grow under readers.
"""

from __future__ import annotations

import torch


def append_rows(table: torch.Tensor, rows: torch.Tensor, store: torch.Tensor | None = None) -> torch.Tensor:
    """The store that holds `table` (n, ...) followed by `rows` (m, ...); the grown table is its first
    n + m rows. `store` is reused, the rows written in place, when `table` is its first n rows (not
    since replaced, moved or cloned) and it has room; else a new store twice as long (or just long
    enough) gets a copy of `table`."""
    n, m = len(table), len(rows)
    if store is None or not _first_rows_of(table, store) or n + m > len(store):
        store = table.new_zeros((max(n + m, 2 * n), *table.shape[1:]))
        store[:n] = table
    store[n : n + m] = rows.to(store)
    return store


def _first_rows_of(table: torch.Tensor, store: torch.Tensor) -> bool:
    return (table.device == store.device and table.dtype == store.dtype and table.data_ptr() == store.data_ptr()
            and table.shape[1:] == store.shape[1:] and table.is_contiguous())
