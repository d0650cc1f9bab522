"""One text per item from its fields, without importing the text encoder (torch).

    text_i = template.format(**fields of item i)     when a template is given
    text_i = the item's `text` field                  when the table has one (a source's full item string,
                                                      or what `data prepare --text-template` built)
    text_i = its title, categories, brand and description joined by ". "     otherwise

Missing fields format as "" and the separators and empty brackets they leave behind are removed; an item whose
text comes out empty has none (None), and the caller's missing-text policy decides.
"""

from __future__ import annotations

import re
import string

import polars as pl

from seqrec.errors import SeqrecError

TEXT_FIELDS = ("title", "categories", "brand", "description")


def template_fields(template: str) -> list[str]:
    """The item fields a template names; a one-line error when it is not a plain `{field}` template."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise SeqrecError(f"text template {template!r} is not a template of item fields ({exc})") from None
    names = [name for _, name, _, _ in parsed if name is not None]
    bad = [n for n in names if not re.fullmatch(r"\w+", n)]
    if bad:
        raise SeqrecError(f"text template {template!r}: {{{bad[0]}}} is not a field name; write {{field}}")
    return list(dict.fromkeys(names))


def check_template(template: str, columns: list[str], where: str) -> list[str]:
    """The template's fields, all present in `columns`; else an error naming the missing ones."""
    names = template_fields(template)
    unknown = [n for n in names if n not in columns]
    if unknown:
        shown = ", ".join(c for c in columns if c != "idx")
        raise SeqrecError(f"{where}: text template names unknown item field(s) {unknown}; fields are {shown}")
    if not names:
        raise SeqrecError(f"text template {template!r} names no item field; write e.g. '{{title}}. {{brand}}'")
    return names


def item_texts(items: pl.DataFrame, template: str = "", where: str = "item table") -> list[str | None]:
    """One text per item (rows in `idx` order when there is an `idx`); None where it has no text."""
    items = items.sort("idx") if "idx" in items.columns else items
    if template:
        fields = check_template(template, items.columns, where)
    elif "text" in items.columns:
        fields = ["text"]
    else:
        fields = [f for f in TEXT_FIELDS if f in items.columns]
    rows = items.select([pl.col(f).cast(pl.Utf8) for f in fields]).to_dicts() if fields else [{}] * items.height
    out: list[str | None] = []
    for row in rows:
        if template:
            text = template.format(**{k: (v or "").strip() for k, v in row.items()})
            text = re.sub(r"\s*(\(\s*\)|\[\s*\])", "", text)  # brackets around an empty field
            text = re.sub(r"(\s*[.,;:]\s*)+(?=[.,;:]|$)", "", text).strip(" .,;:")
        else:
            text = ". ".join(v.strip() for v in row.values() if v and v.strip())
        out.append(text if text.strip() else None)
    return out
