"""One text per item from its fields, without importing the text encoder (torch).

    text_i = template.format(**fields of item i)     when a template is given
    text_i = the item's `text` field                  when the table has one (a source's full item string,
                                                      or what `data prepare --text-template` built)
    text_i = its title, categories, brand and description joined by ". "     otherwise

Missing fields format as "" and the separators and empty brackets they leave behind are removed (only the
template's own text is touched: a field's value is kept as it is, but for a separator's full stop or comma
that would double the one the value ends with); an item whose text comes out empty has none (None), and the
caller's missing-text policy decides.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Sequence

import numpy as np
import polars as pl

from seqrec.errors import SeqrecError

TEXT_FIELDS = ("title", "categories", "brand", "description")
# text_missing = "auto": the mean text vector for items without text up to this share of the catalogue;
# more is an error unless vectors were built with an explicit policy (`seqrec text encode --missing`)
AUTO_MISSING_SHARE = 0.01


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
    spec = next((f"{{{name}{'!' + conv if conv else ''}{':' + fmt if fmt else ''}}}"
                 for _, name, fmt, conv in parsed if name is not None and (fmt or conv)), None)
    if spec:
        raise SeqrecError(f"text template {template!r}: {spec} formats its field; write it as a plain {{field}}")
    return list(dict.fromkeys(names))


def check_template(template: str, columns: list[str], where: str) -> list[str]:
    """The template's fields, all present in `columns`; else an error naming the missing ones."""
    names = template_fields(template)
    unknown = [n for n in names if n not in columns]
    if unknown:
        shown = ", ".join("item (the item id)" if c == "item" else c for c in columns if c != "idx")
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
    parts = [(literal, name) for literal, name, _, _ in string.Formatter().parse(template)] if template else []
    for row in rows:
        if template:
            text = render(parts, {k: (v or "").strip() for k, v in row.items()})
        else:
            text = ". ".join(v.strip() for v in row.values() if v and v.strip())
        out.append(text if text.strip() else None)
    return out


EMPTY, VALUE = "\x00", "\x01"  # stand-ins for a field while the template's own text is cleaned


def render(parts: list[tuple[str, str | None]], row: dict[str, str]) -> str:
    """A parsed template (literal text, field name or None) filled from `row`: the template's text around an
    empty field cleaned up (empty brackets, doubled or dangling separators), the values kept whole."""
    shape = "".join(literal.replace(EMPTY, "").replace(VALUE, "") + ("" if name is None else VALUE if row[name]
                                                                      else EMPTY) for literal, name in parts)
    shape = re.sub(rf"\s*(\(\s*{EMPTY}\s*\)|\[\s*{EMPTY}\s*\])", "", shape)  # brackets around an empty field
    shape = shape.replace(EMPTY, "")
    shape = re.sub(r"(\s*[.,;:]\s*)+(?=[.,;:]|$)", "", shape)  # separators doubled, or left at the end
    shape = re.sub(r"^[\s.,;:]+|[\s.,;:]+$", "", shape)  # ... or at the start
    values = iter(row[name] for _, name in parts if name is not None and row[name])
    pieces = shape.split(VALUE)
    out = pieces[0]
    for piece in pieces[1:]:
        value = next(values)
        if value[-1] in ".,;:!?" and piece[:1] in (".", ","):  # "tool." + ". Bolt": one full stop
            piece = piece[1:]
        out += value + piece
    return out


def word_drop(texts: Sequence[str], p: float, seed: int) -> list[str]:
    """Each word dropped with probability p (at least one word kept), deterministically from `seed`."""
    rng = np.random.default_rng(seed)
    out = []
    for text in texts:
        words = text.split()
        keep = rng.random(len(words)) >= p
        if words and not keep.any():
            keep[rng.integers(len(words))] = True
        out.append(" ".join(w for w, k in zip(words, keep, strict=True) if k))
    return out


def texts_hash(texts: Sequence[str | None]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(b"\x00" if t is None else t.encode() + b"\x01")
    return h.hexdigest()[:16]
