"""The PNGs of a run: its learning curve, and a tuning study's trials against time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def learning_curve(history: list[dict[str, Any]], metric: str, dest: Path) -> None:
    trained = [r for r in history if "loss" in r]  # a fine-tuning's epoch 0 has a validation, no loss
    fig, ax1 = plt.subplots(figsize=(7, 4))
    ax1.plot([r["epoch"] for r in trained], [r["loss"] for r in trained], color="tab:blue", label="train loss")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("train loss", color="tab:blue")
    ax2 = ax1.twinx()
    evals = [r for r in history if "valid" in r]
    ax2.plot([r["epoch"] for r in evals], [r["valid"][metric] for r in evals], color="tab:red",
             marker="o", markersize=3, label=f"valid {metric}")
    ax2.set_ylabel(f"valid {metric}", color="tab:red")
    fig.tight_layout()
    fig.savefig(dest, dpi=100)
    plt.close(fig)


def study_curve(rows: list[dict[str, Any]], path: Path) -> None:
    """`seqrec tune`'s PNG: each trial's validation NDCG@10 (complete, pruned: its last report, failed) at the
    minute it ended, and the best so far."""
    timed = [r for r in rows if r["started"] is not None and r["seconds"] is not None]
    if not timed:
        return
    t0 = min(r["started"] for r in timed)
    fig, ax = plt.subplots(figsize=(7, 4))
    for state, marker in (("complete", "o"), ("pruned", "x"), ("fail", "s")):
        pts = [r for r in timed if r["state"] == state]
        y = [r["valid_ndcg@10"] if r["valid_ndcg@10"] is not None else (r["last_reported"] or [0, 0])[1]
             for r in pts]
        ax.scatter([(r["started"] + r["seconds"] - t0) / 60 for r in pts], y, marker=marker, label=state)
    done = sorted((r["started"] + r["seconds"] - t0, r["valid_ndcg@10"]) for r in timed if r["state"] == "complete")
    best, xs, ys = float("-inf"), [], []
    for x, y in done:
        best = max(best, y)
        xs.append(x / 60)
        ys.append(best)
    ax.step(xs, ys, where="post", color="k", alpha=0.5, label="best so far")
    ax.set_xlabel("minutes into the study")
    ax.set_ylabel("validation NDCG@10")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
