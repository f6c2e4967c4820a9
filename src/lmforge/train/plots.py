"""Training curves: ``metrics.jsonl`` -> a PNG of train/validation loss and the learning rate."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..storage.files import atomic_path

logger = logging.getLogger(__name__)


def read_events(path: str | Path) -> list[dict]:
    """The events of a ``metrics.jsonl`` file (lines that do not parse are skipped)."""
    events = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def plot_metrics(metrics_path: str | Path, png_path: str | Path, title: str | None = None) -> Path:
    """Draw train and validation loss against the step (left) and the learning rate (right).

    Args:
        metrics_path: a ``metrics.jsonl`` written by the Trainer.
        png_path: where to write the PNG (atomically).
        title: figure title (default: the model folder's name).
    Returns:
        ``png_path``.
    """
    # A bare Figure on the Agg canvas: no pyplot, so no GUI backend and no global state is touched.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure


    events = read_events(metrics_path)
    train = [e for e in events if e.get("split") == "train"]
    val = [e for e in events if e.get("split") == "val"]
    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    ax_loss, ax_lr = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 1]})
    if train:
        ax_loss.plot([e["step"] for e in train], [e["loss"] for e in train], label="train", lw=1)
    if val:
        ax_loss.plot([e["step"] for e in val], [e["loss"] for e in val], "o-", label="validation", ms=3)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.grid(alpha=0.3)
    if train or val:
        ax_loss.legend()
    if train:
        ax_lr.plot([e["step"] for e in train], [e["lr"] for e in train], color="tab:green", lw=1)
    ax_lr.set_xlabel("step")
    ax_lr.set_ylabel("learning rate")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    ax_lr.grid(alpha=0.3)
    fig.suptitle(title if title is not None else Path(metrics_path).resolve().parent.name)
    fig.tight_layout()
    png_path = Path(png_path)
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    logger.debug("wrote %s", png_path)
    return png_path
