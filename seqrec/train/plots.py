"""The learning-curve PNG of a run."""

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
