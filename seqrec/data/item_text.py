"""One text per item from its fields, without importing the text encoder (torch).

    text_i = template.format(**fields of item i)     when a template is given
    text_i = the item's `text` field                  when the table has one (a source's full item string,
                                                      or what `data prepare --text-template` built)
    text_i = its title, categories, brand and description joined by ". "     otherwise

Missing fields format as "" and the separators and empty brackets they leave behind are removed (only the
template's own text is touched: a field's value is kept as it is, but for a separator's full stop or comma
that would double the one the value ends with); an item whose text comes out empty has none (None), and the
missing-text policy (`fill_missing`: text_missing auto, error, id or mean) decides what stands in for it.
"""

from __future__ import annotations

import hashlib
import logging
import re
import string
from collections.abc import Sequence
from typing import Literal

import numpy as np
import polars as pl

from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)

TEXT_FIELDS = ("title", "categories", "brand", "description")
# text_missing = "auto": the mean text vector for items without text up to this share of the catalogue;
# more is an error unless vectors were built with an explicit policy (`seqrec text encode --missing`)
AUTO_MISSING_SHARE = 0.01
MissingText = Literal["auto", "error", "id", "mean"]  # what items without text get (the module docstring)


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


FALLBACK = ("`seqrec text encode DATASET --missing id | mean` builds vectors with a stand-in that every later command "
            "on the dataset takes (evaluate, recommend, serve, training); a model being trained can also choose "
            "one: --set model.text_missing=id | mean for `seqrec train`, `pretrain` or `finetune`")
GIVE_TEXT = "give them text (item-table rows, or a template over fields they have) or choose a fallback: "


def fill_missing(texts: list[str | None], raw_ids: list[str], policy: MissingText
                  ) -> tuple[list[str], np.ndarray, MissingText]:
    """Texts with a stand-in where an item has none, which items had none, and the policy that applies
    ("auto" decided: "mean" for a few; for more it stays "auto", which the caller resolves or refuses)."""
    missing = np.array([t is None for t in texts], dtype=bool)
    n, shown = _without_text(missing, raw_ids)
    if n and policy == "auto" and n / max(1, len(texts)) <= AUTO_MISSING_SHARE:
        log.warning("%d item(s) have no text (e.g. %s): they get the mean text vector (text_missing='auto'; "
                    "'error' refuses, 'id' uses the text 'item <id>')", n, shown)
        policy = "mean"
    if n and policy == "error":
        raise SeqrecError(f"{n} item(s) have no text (e.g. {shown}); " + GIVE_TEXT + FALLBACK)
    if policy in ("id", "mean") and n / max(1, len(texts)) > AUTO_MISSING_SHARE:  # chosen, here or in the cache
        log.warning("%s: they get %s, which says nothing about them; a text model learns little about these items",
                    share_without_text(missing, raw_ids),
                    "the text 'item <id>'" if policy == "id" else "the mean text vector")
    filled = [t if t is not None else f"item {raw_ids[i]}" for i, t in enumerate(texts)]
    return filled, missing, policy


def _without_text(missing: np.ndarray, raw_ids: list[str]) -> tuple[int, str]:
    """How many items have no text, and the first few of their ids (for messages)."""
    return int(missing.sum()), ", ".join(raw_ids[i] for i in np.flatnonzero(missing)[:5])


def share_without_text(missing: np.ndarray, raw_ids: list[str]) -> str:
    """"n of N items (x%) have no text (e.g. ids)", for messages."""
    n, shown = _without_text(missing, raw_ids)
    return f"{n} of {len(missing)} items ({n / max(1, len(missing)):.1%}) have no text (e.g. {shown})"


def too_many_missing(missing: np.ndarray, raw_ids: list[str]) -> SeqrecError:
    return SeqrecError(f"{share_without_text(missing, raw_ids)}, more than the {AUTO_MISSING_SHARE:.0%} that "
                       "text_missing='auto' stands in for; " + GIVE_TEXT + FALLBACK)
