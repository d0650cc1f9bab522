"""Markdown tables, number formats and labels shared by the benchmark reports.

`report.py` renders every results file with these; a benchmark script that prints its own table
(`retrieval.py`, `positions.py`) can use them too, so that its stdout and the report agree.

    table(["run", "N@10"], [["a", f4(0.05)]])     -> header, separator and one line per row
    section("Title", "What it measures.", cols)   -> "## Title", the text, a table header
    metric_cells(test)                            -> R@10, N@10, R@50, N@50 cells ("–" where absent)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

DASH = "–"  # an absent value
METRICS = ("recall@10", "ndcg@10", "recall@50", "ndcg@50")
METRIC_LABELS = {"recall@10": "R@10", "ndcg@10": "N@10", "recall@50": "R@50", "ndcg@50": "N@50"}


# ---- numbers -------------------------------------------------------------------------------------

def f4(x: float | None) -> str:
    """A metric value: four decimals, or a dash when there is none."""
    return DASH if x is None else f"{x:.4f}"


def num(x: float | None, digits: int = 0, unit: str = "") -> str:
    """A quantity with `digits` decimals (and a unit), or a dash."""
    return DASH if x is None else f"{x:.{digits}f}{unit}"


def seconds_or(x: float | None, absent: str = "not reached", digits: int = 0) -> str:
    """A time in seconds ("12 s"), or `absent` when the event never happened."""
    return absent if x is None else f"{x:.{digits}f} s"


def mean_std(cell: dict[str, Any], metric: str) -> str:
    """`mean ± std` of a summary cell's metric."""
    return f"{cell[metric]['mean']:.4f} ± {cell[metric]['std']:.4f}"


def value_range(median: float, low: float, high: float) -> str:
    """A median with its range over seeds: `0.0512 (0.0490–0.0530)`."""
    return f"{median:.4f} ({low:.4f}–{high:.4f})"


def yes(flag: Any, no: str = "") -> str:
    return "yes" if flag else no


def recorded(flag: bool | None) -> str:
    """A yes/no cell for a setting a record may predate: – when it was not recorded."""
    return DASH if flag is None else yes(flag, "no")


# ---- tables --------------------------------------------------------------------------------------

def row(cells: Iterable[Any]) -> str:
    """One Markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def header(columns: Sequence[str]) -> list[str]:
    """A Markdown table's header and separator."""
    return [row(columns), "|" + "---|" * len(columns)]


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A whole Markdown table."""
    return [*header(columns), *(row(r) for r in rows)]


def section(title: str, intro: str, columns: Sequence[str]) -> list[str]:
    """A section's heading, introduction and table header."""
    return [f"## {title}", "", intro, "", *header(columns)]


def metric_cells(test: dict[str, float], metrics: Sequence[str] = METRICS) -> list[str]:
    """The test metrics of a run, in the order of `metrics`."""
    return [f4(test.get(m)) for m in metrics]


def metric_row(key: str, test: dict[str, float], extra: Sequence[str]) -> str:
    """`| key | R@10 | N@10 | R@50 | N@50 | extra... |`."""
    return row([key, *metric_cells(test), *extra])


# ---- labels --------------------------------------------------------------------------------------

def loss_name(model_cfg: dict[str, Any]) -> str:
    """A short name of a model config's loss: CE, SS k=256 uniform logQ, bce k=1, SGNS, ..."""
    loss = model_cfg.get("loss")
    if model_cfg.get("name") == "unisrec":
        return "cosine CE"
    if loss is None:
        return "SGNS"
    if loss == "sampled_softmax":
        return (f"SS k={model_cfg['n_negatives']} {model_cfg['negatives']}"
                + (" logQ" if model_cfg.get("logq") else ""))
    if loss in ("bce", "gbce"):
        return f"{loss} k={model_cfg['n_negatives']}" + (f" t={model_cfg['gbce_t']}" if loss == "gbce" else "")
    return "CE"


def history_bias(run: dict[str, Any]) -> bool:
    """Whether a run's model had the learned history bias (`model.history_bias`)."""
    return bool(run.get("config", {}).get("model", {}).get("history_bias"))


def run_cells(r: dict[str, Any]) -> list[str]:
    """Best epoch / epochs run (+ 'budget' when the time budget stopped it), train s, peak RSS MB."""
    epochs = f"{r.get('best_epoch', '')} / {r.get('epochs_run', '')}"
    epochs += " budget" if r.get("stopped_by_budget") else ""
    return [epochs, f"{r.get('train_seconds', 0):.0f}", num(r.get("peak_rss_mb"))]


# ---- copies of a page elsewhere ------------------------------------------------------------------

def demote(lines: Sequence[str], relink: str = "") -> list[str]:
    """The lines one heading level down, with links to `results/` made relative to another folder
    (`relink` is what replaces `results/`, e.g. `../benchmarks/results/` from docs/)."""
    out = []
    for line in lines:
        if line.startswith("#"):
            line = "#" + line
        elif relink:
            line = line.replace("](results/", f"]({relink}")
        out.append(line)
    return out
