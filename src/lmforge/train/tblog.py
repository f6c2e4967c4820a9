"""``--set log=tensorboard`` (pretrain and finetune): TensorBoard event files beside ``metrics.jsonl``, written as
training goes.

:func:`log_event` takes the events the Trainer appends to ``metrics.jsonl`` (``{"step", "split",
"loss", "metrics", "lr", "tokens_per_s", ...}``) and writes them as scalars (``train/loss``,
``val/loss``, ``val/ppl``, ``train/lr``...) with ``torch.utils.tensorboard.SummaryWriter``, one writer
per folder, flushed after each event so that ``tensorboard --logdir MODEL_DIR`` follows a running
job.  :class:`EpochLog` does the same for ``lmforge finetune``'s per-epoch progress lines.
metrics.jsonl and the PNG stay as they are: TensorBoard is an extra view.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any

from ..errors import LmforgeError

logger = logging.getLogger(__name__)

LOG_CHOICES = ("jsonl", "tensorboard")
_WRITERS: dict[str, Any] = {}


def open_writer(folder: str | Path):
    """The folder's ``SummaryWriter`` (one per folder per process), created on first use."""
    key = str(Path(folder).resolve())
    if key not in _WRITERS:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise LmforgeError(
                "TensorBoard logging needs the tensorboard package: pip install 'lmforge[tensorboard]'"
            ) from None
        Path(folder).mkdir(parents=True, exist_ok=True)
        _WRITERS[key] = SummaryWriter(log_dir=str(folder))
    return _WRITERS[key]


def log_event(folder: str | Path, event: dict[str, Any]) -> None:
    """Write one metrics.jsonl event of ``folder`` as TensorBoard scalars at its step."""
    w = open_writer(folder)
    step = int(event.get("step", 0))
    split = event.get("split", "train")
    scalars = {"loss": event.get("loss"), **(event.get("metrics") or {})}
    for k in ("lr", "tokens_per_s"):
        if k in event:
            scalars[k] = event[k]
    for k, v in scalars.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            w.add_scalar(f"{split}/{k}", float(v), step)
    w.flush()


def close(folder: str | Path) -> None:
    """Close the folder's writer (the event file is complete)."""
    w = _WRITERS.pop(str(Path(folder).resolve()), None)
    if w is not None:
        w.close()


_EPOCH_LINE = re.compile(r"(?:lr (\S+) )?epoch (\d+)/\d+: train loss ([^,\s]+)(?:, val (\S+) ([^,\s]+))?")


class EpochLog:
    """A ``progress`` callback for :func:`lmforge.transfer.run_transfer` that logs each epoch's training loss.

    ``run_transfer`` reports one line per epoch (``"lr 0.001 epoch 3/10: train loss 0.4123, val accuracy
    0.8125"``); each becomes ``train/loss lr=0.001`` (and ``val/accuracy lr=0.001``) at that epoch, one
    curve per learning rate of the grid.  :meth:`finish` adds the test metrics (``test/accuracy``...) at the
    last epoch and closes the file.
    """

    def __init__(self, folder: str | Path, echo=None):
        self.folder = Path(folder)
        self.echo = echo
        self.epoch = 0
        open_writer(self.folder)

    def __call__(self, line: str) -> None:
        if self.echo is not None:
            self.echo(line)
        m = _EPOCH_LINE.search(line)
        if not m:
            return
        lr, epoch, loss, metric, value = m.groups()
        self.epoch = int(epoch)
        suffix = f" lr={lr}" if lr else ""
        w = open_writer(self.folder)
        for tag, text in ((f"train/loss{suffix}", loss), (f"val/{metric}{suffix}", value)):
            try:
                v = float(text) if text is not None else math.nan
            except ValueError:
                continue
            if math.isfinite(v):
                w.add_scalar(tag, v, self.epoch)
        w.flush()

    def finish(self, metrics: dict[str, Any]) -> None:
        numbers = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        skip = ("n_train", "n_test", "epochs", "lr", "train_loss", "train_seconds", "freeze_layers")
        log_event(
            self.folder,
            {
                "step": self.epoch,
                "split": "test",
                "loss": None,
                "metrics": {k: v for k, v in numbers.items() if k not in skip},
            },
        )
        close(self.folder)


def read_scalars(folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the folder's event files: ``{tag: [(step, value), ...]}`` (for tests and reports)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
