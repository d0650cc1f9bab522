"""The generated logs behind the scale benchmarks have the shape they claim (seqrec.data.synthetic)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from seqrec.data.prepare import PrepareOptions, prepare
from seqrec.data.synthetic import LogShape, generate_log, generated_dataset
from seqrec.errors import SeqrecError


def test_shape_statistics() -> None:
    shape = LogShape(n_interactions=200_000, n_users=20_000, n_items=5_000, zipf_s=1.0, length_sigma=1.0, seed=3)
    log = generate_log(shape)
    assert log.height == 200_000 and log["user"].n_unique() == 20_000
    lengths = log.group_by("user").len()["len"].to_numpy()
    assert lengths.min() >= shape.min_len and lengths.max() <= shape.max_len
    assert np.percentile(lengths, 99) > 4 * np.median(lengths)  # a long tail
    counts = np.sort(log.group_by("item").len()["len"].to_numpy())[::-1]
    assert counts[0] / counts[1] == pytest.approx(2.0, rel=0.1)  # Zipf s=1: rank 1 twice rank 2
    assert counts[0] / counts[9] == pytest.approx(10.0, rel=0.2)
    gaps = log.group_by("user", maintain_order=True).agg(pl.col("timestamp").diff().drop_nulls().min())
    assert (gaps["timestamp"].drop_nulls() > 0).all()  # each user's events in time order
    assert generate_log(shape).equals(log) and not generate_log(LogShape(200_000, 20_000, 5_000, seed=4)).equals(log)


def test_repeats_and_prepare(tmp_path: Path) -> None:
    def rate(repeat_p: float) -> float:
        data = prepare(generated_dataset(LogShape(50_000, 5_000, 2_000, repeat_p=repeat_p, seed=1)),
                       PrepareOptions(), tmp_path / f"gen{repeat_p}")
        assert len(data.items) == 50_000 and data.n_users == 5_000
        return data.repeat_rates()["repeat_rate"]

    base = rate(0.0)  # popular items drawn twice by one user
    assert base < 0.25
    assert 0.3 <= rate(0.3) <= 0.3 + base  # every copied event repeats; the others only by chance


def test_impossible_shapes_are_refused() -> None:
    with pytest.raises(SeqrecError, match="cannot give"):
        LogShape(n_interactions=10, n_users=10, n_items=5)
    with pytest.raises(SeqrecError, match="do not fit"):
        generate_log(LogShape(n_interactions=1000, n_users=10, n_items=5, max_len=20))
