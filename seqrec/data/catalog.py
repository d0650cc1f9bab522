"""Known datasets and input formats: a name -> how to read it from a source folder.

`load_known("yelp-p5", folder)` reads one of the datasets described in
`../shared/data/README.md` from its folder (or from the parent folder holding
it); `load_format("csv", path, user_col=..., item_col=...)` dispatches on a
format name so a CLI can pass `--format` and keyword options straight through.
Each `DatasetSpec` also carries default prepare options (keys of
`seqrec.data.prepare.PrepareOptions`): the shared builds are already filtered,
so they use no k-core and no dedupe.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from seqrec.data.readers import (
    read_diginetica,
    read_lcrec,
    read_movielens,
    read_p5_pseudo_text,
    read_recbole,
    read_recbole_sequential,
    read_s3rec,
    read_table,
    read_unisrec,
    read_yelp_items,
)
from seqrec.data.readers_table import as_frame
from seqrec.data.types import ItemTable, RawDataset
from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)

Loader = Callable[[Path], RawDataset]
AS_PUBLISHED: dict[str, Any] = {"kcore": 0, "dedupe": "none"}


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """How to read one known dataset: a one-line description, a loader, prepare defaults."""

    description: str
    loader: Loader
    prepare: dict[str, Any] = dataclasses.field(default_factory=lambda: dict(AS_PUBLISHED))


def _need(folder: Path, *names: str) -> Path:
    """The first of `names` present in `folder`."""
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise SeqrecError(f"{folder}: expected {' or '.join(names)}")


def _with_items(raw: RawDataset, items: pl.DataFrame | None, source: Path) -> RawDataset:
    table = ItemTable(items, str(source)) if items is not None else None
    return dataclasses.replace(raw, items=table)


def _load_ml100k(folder: Path) -> RawDataset:
    """Raw `u.data` layout if present (folder or folder/raw), else RecBole atomic."""
    for candidate in (folder, folder / "raw"):
        if (candidate / "u.data").is_file():
            return read_movielens(candidate)
    for candidate in (folder, folder / "recbole"):
        if (candidate / "ml-100k.inter").is_file():
            return read_recbole(candidate, name="ml-100k")
    raise SeqrecError(f"{folder}: expected u.data or ml-100k.inter (here, in raw/ or in recbole/)")


def _load_p5(txt: str, text: str) -> Loader:
    """S3-Rec lines plus IDGenRec pseudo-text (in `title`) joined through P5 datamaps."""

    def load(folder: Path) -> RawDataset:
        raw = read_s3rec(_need(folder, txt))
        maps, phase0 = folder / "datamaps.json", folder / text
        if not (maps.is_file() and phase0.is_file()):
            log.warning("%s: no datamaps.json / %s; reading without item text", folder, text)
            return raw
        return _with_items(raw, read_p5_pseudo_text(maps, phase0), phase0)

    return load


def _load_yelp(folder: Path) -> RawDataset:
    raw = read_s3rec(_need(folder, "Yelp.txt"))
    item_json = folder / "Yelp.item.json"
    if not item_json.is_file():
        log.warning("%s: no Yelp.item.json; reading without item text", folder)
        return raw
    return _with_items(raw, read_yelp_items(item_json), item_json)


def _load_lcrec(stem: str) -> Loader:
    """LC-Rec JSON, with the item text and the ASIN map when they are present."""

    def load(folder: Path) -> RawDataset:
        inter = _need(folder, f"{stem}.inter.json")
        item_json, item2id = folder / f"{stem}.item.json", folder / f"{stem}.item2id"
        return read_lcrec(
            inter,
            item_json=item_json if item_json.is_file() else None,
            item2id=item2id if item2id.is_file() else None,
        )

    return load


def _load_diginetica(folder: Path) -> RawDataset:
    return read_diginetica(_need(folder, "sample_train-item-views.csv", "train-item-views.csv"))


KNOWN_DATASETS: dict[str, DatasetSpec] = {
    "ml-100k": DatasetSpec(
        "MovieLens 100K ratings with titles, years and genres (raw GroupLens or RecBole files)",
        _load_ml100k,
    ),
    "amazon-beauty-p5": DatasetSpec(
        "Amazon 2014 Beauty 5-core (S3-Rec/P5 build); title = IDGenRec pseudo-text, not titles",
        _load_p5("Beauty.txt", "Beauty_item_generative_indexing_phase_0.txt"),
    ),
    "amazon-sports-p5": DatasetSpec(
        "Amazon 2014 Sports 5-core (S3-Rec/P5 build); title = IDGenRec pseudo-text, not titles",
        _load_p5("Sports_and_Outdoors.txt", "Sports_item_generative_indexing_phase_0.txt"),
    ),
    "yelp-p5": DatasetSpec(
        "Yelp (S3-Rec/P5 build) with business names and categories (LETTER text)", _load_yelp
    ),
    "lastfm-s3rec": DatasetSpec(
        "HetRec Last.fm artist sequences (S3-Rec build), ids only",
        lambda folder: read_s3rec(_need(folder, "LastFM.txt")),
    ),
    "amazon-scientific-unisrec": DatasetSpec(
        "Amazon 2018 Scientific, UniSRec's exact downstream split, item text in `text`",
        lambda folder: read_unisrec(folder, name="Scientific"),
    ),
    "amazon-instruments-2018-idonly": DatasetSpec(
        "Amazon 2018 Instruments (UniSRec-style splits), ASIN ids, no text",
        lambda folder: read_unisrec(folder, name="Instruments"),
    ),
    "amazon-scientific-2018-lcrec": DatasetSpec(
        "Amazon 2018 Scientific, LC-Rec build with title/description/brand/categories",
        _load_lcrec("Scientific"),
    ),
    "amazon-arts-2018-idonly": DatasetSpec(
        "Amazon 2018 Arts (LC-Rec build), ASIN ids, no text", _load_lcrec("Arts")
    ),
    "amazon-games-2018": DatasetSpec(
        "Amazon 2018 Video Games (UniSRec pipeline), RecBole sequential files with titles",
        lambda folder: read_recbole_sequential(folder),
    ),
    "diginetica-sample": DatasetSpec(
        "DIGINETICA item-view sample (sessions as users), timestamps, no text",
        _load_diginetica,
        {"kcore": 0, "dedupe": "none", "min_user_len": 3},
    ),
}


def load_known(name: str, source: Path) -> RawDataset:
    """Read a known dataset from its folder, or from a parent folder that holds `name/`."""
    spec = KNOWN_DATASETS.get(name)
    if spec is None:
        raise SeqrecError(f"unknown dataset {name!r}; known: {', '.join(KNOWN_DATASETS)}")
    folder = Path(source)
    if (folder / name).is_dir():
        folder = folder / name
    if not folder.is_dir():
        raise SeqrecError(f"{folder}: dataset folder for {name!r} not found")
    raw = spec.loader(folder)
    return dataclasses.replace(raw, name=name)


FORMATS: dict[str, Callable[..., RawDataset]] = {
    "movielens": read_movielens,
    "recbole": read_recbole,
    "recbole-seq": read_recbole_sequential,
    "unisrec": read_unisrec,
    "s3rec": read_s3rec,
    "lcrec": read_lcrec,
    "csv": functools.partial(read_table, sep=",", kind="csv"),
    "tsv": functools.partial(read_table, sep="\t", kind="csv"),
    "parquet": functools.partial(read_table, kind="parquet"),
    "jsonl": functools.partial(read_table, kind="jsonl"),
    "table": read_table,
    "diginetica": read_diginetica,
}


def format_options(fmt: str) -> tuple[list[str], list[str]]:
    """The keyword options of the reader for `fmt`: (required, optional), so that a caller can name them in
    its own words (the CLI as flags) before `load_format` would refuse them."""
    reader = FORMATS.get(fmt.lower())
    if reader is None:
        raise SeqrecError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    params = list(inspect.signature(reader).parameters.values())[1:]
    required = [p.name for p in params if p.default is inspect.Parameter.empty]
    return required, [p.name for p in params if p.name not in required]


TABLE_FORMATS = ("csv", "tsv", "parquet", "jsonl", "table")  # the readers that also take a DataFrame


def load_format(fmt: str, path: Path | str | pl.DataFrame, **options: Any) -> RawDataset:
    """Read `path` with the reader for `fmt`; `options` are that reader's keyword arguments. The table
    formats also read a polars or pandas DataFrame given in place of the path (`load_format("table", frame,
    user_col=..., item_col=..., time_col=...)`)."""
    reader = FORMATS.get(fmt.lower())
    if reader is None:
        raise SeqrecError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    frame = as_frame(path)
    if frame is not None and fmt.lower() not in TABLE_FORMATS:
        raise SeqrecError(f"format {fmt!r} reads files; a DataFrame is read by a table format "
                          f"({', '.join(TABLE_FORMATS)})")
    source: Path | pl.DataFrame = frame if frame is not None else Path(path)  # type: ignore[arg-type]
    signature = inspect.signature(reader)
    try:
        signature.bind(source, **options)
    except TypeError as err:
        accepted = ", ".join(list(signature.parameters)[1:])
        raise SeqrecError(f"format {fmt!r}: {err} (options: {accepted})") from None
    return reader(source, **options)
