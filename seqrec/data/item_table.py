"""Your own catalogue: an item table (CSV / TSV / Parquet / JSON lines) joined to any log on the item id.

    seqrec data prepare shop --format csv --path events.csv --items items.parquet \
        --item-key sku --text-template "{title}. {brand}. {categories}"

The table's key column becomes `item` (ids compared as strings as written, less surrounding spaces);
every other column is kept as an item field (lists joined with ", "). With a text template, each
item's text is built from the fields and stored as the `text` field, which `seqrec text encode` and
the text models read. The table is the catalogue: its items with no interaction are kept (recommendable by text
models; `seqrec data stats` counts them), and log items absent from it are counted and have no
fields (their text follows the model's `text_missing` policy).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import polars as pl

from seqrec.data.item_text import AUTO_MISSING_SHARE, TEXT_FIELDS, check_template, item_texts
from seqrec.data.readers_table import TableFile, separator_hint
from seqrec.data.readers_values import empty_ids, id_strings
from seqrec.data.types import ItemTable, RawDataset
from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)

RESERVED_FIELDS = ("item", "idx")  # the item id and its index in the prepared data


def read_item_table(path: Path | str | pl.DataFrame, item_key: str, sep: str | None = None) -> ItemTable:
    """The table at `path` (or a polars / pandas DataFrame), keyed by its column `item_key` (renamed `item`);
    other columns as text."""
    table = TableFile.of(path, sep, "item table")
    columns = table.columns()
    if item_key not in columns:
        listed = ", ".join(map(repr, columns))
        raise SeqrecError(f"{table.path}: no item key column {item_key!r}; columns are {listed} "
                          f"(choose one with --item-key){separator_hint(table, columns, '--items-sep')}")
    frame = table.load(columns, text_cols=columns)
    keys = frame[item_key]
    empty = empty_ids(keys)
    if empty.len():
        raise SeqrecError(f"{table.row_label(int(empty[0]))}: empty item id in key column {item_key!r}")
    keys = id_strings(keys, table)
    duplicated = keys.is_duplicated().arg_true()
    if duplicated.len():
        first = int(duplicated[0])
        again = next(int(i) for i in duplicated if keys[int(i)] == keys[first] and int(i) != first)
        raise SeqrecError(f"{table.row_label(again)}: item id {keys[first]!r} in column {item_key!r} "
                          f"repeats {table.row_label(first).rsplit(', ', 1)[1]}; an item table needs one row per item")
    fields = [_as_text(frame[c]) for c in columns if c != item_key]
    names = free_field_names([f.name for f in fields], str(table.path))
    out = pl.DataFrame([keys.rename("item"), *(f.rename(names.get(f.name, f.name)) for f in fields)])
    log.debug("read item table %s: %d items, fields %s", table.path, out.height, ", ".join(out.columns[1:]))
    return ItemTable(out, str(table.path))


def free_field_names(fields: list[str], where: str) -> dict[str, str]:
    """New names for the item fields named like the columns prepare makes itself (`item`, `idx`): the name
    with `_field` appended, as often as it takes to be free; each rename logged."""
    taken = {*fields, *RESERVED_FIELDS}
    out = {}
    for name in fields:
        if name in RESERVED_FIELDS:
            new = f"{name}_field"
            while new in taken:
                new += "_field"
            taken.add(new)
            out[name] = new
            log.warning("%s: column %r is kept as item field %r (%r is seqrec's own)", where, name, new, name)
    return out


def _as_text(values: pl.Series) -> pl.Series:
    """One item field as stripped text (null when empty); lists joined with ", "."""
    if isinstance(values.dtype, pl.List | pl.Array):
        values = values.cast(pl.List(pl.Utf8)).list.join(", ")
    elif isinstance(values.dtype, pl.Struct):
        values = values.struct.json_encode()
    text = pl.DataFrame({"v": values.cast(pl.Utf8).str.strip_chars()})
    return text.select(pl.when(pl.col("v") != "").then(pl.col("v"))).to_series().rename(values.name)


def join_item_table(raw: RawDataset, table: ItemTable, template: str = "") -> RawDataset:
    """`raw` with `table` as its catalogue (replacing any item fields the reader found)."""
    frame = table.frame
    if template:
        check_template(template, frame.columns, table.source)
    if frame.height == 0:
        raise SeqrecError(f"{table.source}: the item table has no rows")
    texts = item_texts(frame, template, table.source)  # as the text models read them
    if template:
        if all(t is None for t in texts):
            raise SeqrecError(f"{table.source}: the text template {template!r} gives empty text for every item")
        if "text" in frame.columns:
            log.warning("%s: the text template's output replaces the table's column 'text'", table.source)
        frame = frame.with_columns(pl.Series("text", texts, dtype=pl.Utf8))
    textless = frame.filter(pl.Series([t is None for t in texts]))["item"]
    if textless.len():
        shown = ", ".join(repr(v) for v in textless.head(3).to_list())
        log.warning("%s: %d of the table's %d items have empty text (e.g. %s)%s; their text follows the model's "
                    "text_missing policy", table.source, textless.len(), frame.height, shown,
                    "" if template else f" in the default text fields ({', '.join(TEXT_FIELDS)}; a "
                    "--text-template names others)")
    logged = raw.interactions.frame["item"].unique()
    known = frame["item"].is_in(logged.implode())
    unmatched = logged.filter(~logged.is_in(frame["item"].implode()))
    if unmatched.len() == logged.len():
        shown = ", ".join(repr(v) for v in logged.sort().head(3).to_list())
        raise SeqrecError(f"{table.source}: none of the log's {logged.len()} item ids (e.g. {shown}) is in the "
                          "item table; check --item-key and the id format")
    if unmatched.len():
        shown = ", ".join(repr(v) for v in unmatched.sort().head(3).to_list())
        catalogue, without_text = frame.height + unmatched.len(), unmatched.len() + textless.len()
        share = without_text / catalogue  # the share `seqrec text encode` and the text models hold to the rule
        consequence = ("the default text_missing='auto' gives them the mean text vector" if share <= AUTO_MISSING_SHARE
                       else f"more than the {AUTO_MISSING_SHARE:.0%} that the default text_missing='auto' stands in "
                       "for, so a text model refuses them until you choose model.text_missing = 'id' or 'mean' "
                       "(or build the vectors with `seqrec text encode --missing id`)")
        log.warning("%s: %d of the log's %d items have no row in the item table (e.g. %s), so no fields and no text; "
                    "%d of the catalogue's %d items (%.1f%%) have no text: %s", table.source, unmatched.len(),
                    logged.len(), shown, without_text, catalogue, 100 * share, consequence)
    report = {"item_table": table.source, "table_items": frame.height,
              "table_items_without_interactions": int((~known).sum()),
              "log_items_without_row": int(unmatched.len()), "table_items_without_text": int(textless.len()),
              "text_template": template}
    log.info("item table joined: %s", report)
    return dataclasses.replace(raw, items=ItemTable(frame, table.source), catalogue=report)

