"""Reader for the raw GroupLens MovieLens 100K files (`u.data`, `u.item`, `u.genre`).

    u.data   TAB: user item rating timestamp (unix seconds)
    u.item   '|', latin-1: id|title (year)|release date|video date|IMDb URL|19 genre flags
    u.genre  'name|index' per line (the genre order of the flags)

Interactions keep `rating` (Float64) as an extra column. Item table columns:
item, title ("Toy Story": as written less a closing "(YYYY)", which is the year field, as in
RecBole's ml-100k.item, so that both sources of ml-100k give one item table), year (Utf8, from the
title's "(YYYY)", else the release date's year; null when neither has one) and categories (genre
names joined by ", ", null when no flag is set).
"""

from __future__ import annotations

import logging
from pathlib import Path

import polars as pl

from seqrec.data.readers_io import (
    check_ints,
    check_time_range,
    line_error,
    make_dataset,
    read_lines,
    split_fields,
    to_float,
)
from seqrec.data.types import RawDataset
from seqrec.errors import SeqrecError

log = logging.getLogger(__name__)

GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
    "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
    "Romance", "Sci-Fi", "Thriller", "War", "Western",
)  # fmt: skip
_ITEM_FIELDS = ["item", "title", "release_date", "video_date", "url"]


def _genres(folder: Path) -> list[str]:
    path = folder / "u.genre"
    if not path.is_file():
        return list(GENRES)
    fields = split_fields(read_lines(path, "latin-1"), path, "|", ["name", "index"])
    check_ints(fields, "index", path, "genre index")
    fields = fields.with_columns(pl.col("index").cast(pl.Int64)).sort("index")
    if fields["index"].to_list() != list(range(fields.height)):
        raise SeqrecError(f"{path}: genre indices must be 0..{fields.height - 1}")
    return fields["name"].to_list()


def _read_ratings(path: Path) -> pl.DataFrame:
    fields = split_fields(read_lines(path), path, "\t", ["user", "item", "rating", "timestamp"])
    fields = fields.with_columns(pl.col("user", "item").str.strip_chars())
    for col in ("user", "item"):
        check_ints(fields, col, path, f"{col} id")
    frame = fields.select(
        "user", "item", to_float(fields, "timestamp", path), to_float(fields, "rating", path)
    )
    check_time_range(frame["timestamp"], path, "timestamp")
    return frame


def _read_movies(path: Path, genres: list[str]) -> pl.DataFrame:
    flags = [f"_g{i}" for i in range(len(genres))]
    fields = split_fields(read_lines(path, "latin-1"), path, "|", [*_ITEM_FIELDS, *flags])
    bad = fields.filter(~pl.all_horizontal(pl.col(flags).str.strip_chars().is_in(["0", "1"])))
    if bad.height:
        raise line_error(path, bad["lineno"][0], "genre flags must be 0 or 1")
    title = pl.col("title").str.strip_chars()
    year = pl.coalesce(
        title.str.extract(r".*\((\d{4})\)", 1),
        pl.col("release_date").str.extract(r"(\d{4})\s*$", 1),
    )
    names = [
        pl.when(pl.col(f).str.strip_chars() == "1").then(pl.lit(g))
        for f, g in zip(flags, genres, strict=True)
    ]
    categories = pl.concat_list(names).list.drop_nulls().list.join(", ")
    bare = title.str.replace(r"\s*\(\d{4}\)$", "")  # "Toy Story (1995)" -> "Toy Story"
    return fields.select(
        pl.col("item").str.strip_chars(),
        pl.when(bare != "").then(bare).when(title != "").then(title).alias("title"),
        year.alias("year"),
        pl.when(categories != "").then(categories).alias("categories"),
    )


def read_movielens(folder: Path, name: str = "ml-100k") -> RawDataset:
    """Raw GroupLens ml-100k folder: `u.data` (+ `u.item`, `u.genre` when present)."""
    folder = Path(folder)
    data_path = folder / "u.data"
    if not data_path.is_file():
        raise SeqrecError(f"{data_path}: MovieLens ratings file not found")
    frame = _read_ratings(data_path)
    item_path = folder / "u.item"
    items = _read_movies(item_path, _genres(folder)) if item_path.is_file() else None
    log.debug("read %s: %d interactions", data_path, frame.height)
    return make_dataset(frame, items, name, data_path)
