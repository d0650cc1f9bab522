"""Readers: every supported input format -> `RawDataset` (see `seqrec.data.types`).

One function per format; each returns interactions in the source's own order
(the chronological order that `prepare` uses to break timestamp ties), with
user / item as Utf8 raw ids and `timestamp` as Float64 (null when the source has
order only). User mistakes (a missing file, a malformed line, a wrong column
name) raise `SeqrecError` with a one-line message naming the file and line.

    read_movielens(folder)                 raw GroupLens ml-100k (u.data, u.item, u.genre)
    read_recbole(dir_or_prefix, name)      RecBole atomic <name>.inter (+ .item)
    read_recbole_sequential(dir, name)     RecBole sequential benchmark <name>.valid/.test.inter (+ .item)
    read_unisrec(dir_or_prefix, name)      UniSRec .train/.valid/.test.inter -> sequences + split
    read_s3rec(txt_path)                   S3-Rec / P5 `user item item ...` lines
    read_lcrec(inter_json, item_json, item2id, user2id)   LC-Rec / LETTER JSON
    read_table(path, user_col, item_col, time_col, ...)   CSV / TSV / Parquet / JSON lines
    read_diginetica(path)                  DIGINETICA item-view CSV (sessions as users)
    read_yelp_items, read_p5_pseudo_text, read_item_json  item-text tables (polars frames)

Item table columns by source: MovieLens raw -> title, year, categories; RecBole
-> title, categories, year, other fields; UniSRec -> text (UniSRec's full item
string, verbatim); LC-Rec -> title, description, brand, categories; Yelp ->
title (business name), categories; Beauty / Sports -> asin, title (generated
pseudo-text, not a real title).
"""

from seqrec.data.readers_movielens import read_movielens
from seqrec.data.readers_recbole import read_recbole, read_recbole_sequential
from seqrec.data.readers_seq import (
    read_item_json,
    read_lcrec,
    read_p5_pseudo_text,
    read_s3rec,
    read_yelp_items,
)
from seqrec.data.readers_table import read_diginetica, read_table
from seqrec.data.readers_unisrec import read_unisrec

__all__ = [
    "read_diginetica",
    "read_item_json",
    "read_lcrec",
    "read_movielens",
    "read_p5_pseudo_text",
    "read_recbole",
    "read_recbole_sequential",
    "read_s3rec",
    "read_table",
    "read_unisrec",
    "read_yelp_items",
]
