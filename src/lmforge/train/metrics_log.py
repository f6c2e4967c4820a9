"""What a training run writes as it goes: ``metrics.jsonl``, TensorBoard scalars beside it, the curves plot.

Every event is one JSON line ``{"step", "split", "loss", "metrics", "lr", "tokens", "elapsed"}`` (train
events add ``tokens_per_s``).  Only rank 0 writes; every rank keeps the events in :attr:`MetricsLog.history`.
On resume the events a killed run logged after its last checkpoint are dropped, as those steps are redone.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from ..storage.files import atomic_write_text
from .config import TrainConfig, format_duration
from .distributed import DistEnv, all_reduce_sum
from .plots import plot_metrics
from .tblog import close as close_tensorboard
from .tblog import log_event

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "training_curves.png"


class MetricsLog:
    """The event log of one run in ``out_dir``.

    Args:
        out_dir: the model folder.
        is_main: this process writes files (rank 0).
        tensorboard: also write each event as TensorBoard scalars (``log=tensorboard``).
    """

    def __init__(self, out_dir: Path, is_main: bool, tensorboard: bool):
        self.out_dir = out_dir
        self.is_main = is_main
        self.tensorboard = tensorboard
        self.history: list[dict[str, Any]] = []  # every event written to metrics.jsonl (rank 0)

    @property
    def path(self) -> Path:
        return self.out_dir / METRICS_FILE

    def write(self, event: dict[str, Any]) -> None:
        """Append ``event`` to the history, and (rank 0) to ``metrics.jsonl`` and TensorBoard."""
        self.history.append(event)
        if not self.is_main:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")
        if self.tensorboard:  # the same event as TensorBoard scalars, beside metrics.jsonl
            log_event(self.out_dir, event)

    def start_fresh(self) -> None:
        """A run from step 0: drop the ``metrics.jsonl`` of an earlier run in the folder."""
        if self.is_main:
            self.path.unlink(missing_ok=True)

    def truncate_after(self, step: int) -> None:
        """On resume, drop events a killed run logged after its last checkpoint (they are redone)."""
        if not self.is_main or not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by the kill
            if event.get("step", 0) <= step:
                kept.append(line)
                self.history.append(event)
        atomic_write_text(self.path, "".join(x + "\n" for x in kept))

    def finish(self, plot: bool) -> None:
        """Close the TensorBoard writer and (with ``plot``) draw ``training_curves.png`` (rank 0)."""
        if not self.is_main:
            return
        if self.tensorboard:
            close_tensorboard(self.out_dir)
        if plot:
            try:
                plot_metrics(self.path, self.out_dir / CURVES_FILE)
            except Exception as e:  # a plot must never cost a finished training run
                logger.warning("could not draw %s: %s", CURVES_FILE, e)


class Interval:
    """What the loop accumulates between two train events: the loss (a device tensor, so that a step reads
    nothing back), the steps, and this process's tokens (for ``tokens_seen`` and for tokens/s)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pending_tokens = 0  # this process's tokens not yet summed over ranks
        self.restart()

    def restart(self) -> None:
        """A new interval: no loss, no steps, the throughput clock from now."""
        self.loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self.steps = 0
        self.restart_clock()

    def restart_clock(self) -> None:
        """Count tokens/s from now (time spent evaluating or checkpointing is not training throughput)."""
        self.t, self.tps_tokens = time.monotonic(), 0

    def add_tokens(self, n: int) -> None:
        self.pending_tokens += n
        self.tps_tokens += n

    def add_step(self, loss: torch.Tensor) -> None:
        self.loss += loss.double()
        self.steps += 1

    def take_tokens(self, env: DistEnv) -> int:
        """The tokens not yet counted, summed over ranks (collective); they are counted once."""
        t = torch.tensor([float(self.pending_tokens)], dtype=torch.float64, device=self.device)
        self.pending_tokens = 0
        return int(all_reduce_sum(t, env).item())

    def close(self, env: DistEnv) -> tuple[float, int, float, float]:
        """The interval's figures (collective): ``(loss, tokens, tokens_per_s, seconds)``.

        The loss is averaged over steps and ranks; the tokens not yet counted and the tokens/s are summed
        over ranks (the tokens then count as taken).  :meth:`restart` begins the next interval.
        """
        counts = torch.tensor([self.pending_tokens, self.tps_tokens], dtype=torch.float64, device=self.device)
        stats = all_reduce_sum(torch.cat([self.loss.reshape(1), counts]), env)
        loss = float(stats[0].item()) / (self.steps * env.world_size)
        seconds = max(time.monotonic() - self.t, 1e-9)
        self.pending_tokens = 0
        return loss, int(stats[1].item()), float(stats[2].item()) / seconds, seconds


def warn_if_over_budget(config: TrainConfig, step: int, seconds_left: float, sec_per_step: float) -> None:
    """Warn when ``max_time`` ends before ``max_steps`` at this speed: the schedule would not decay."""
    fit = step + int(seconds_left / max(sec_per_step, 1e-9))
    if fit < config.max_steps:
        logger.warning(
            "at %.3g s/step the time budget of %s ends near step %d, before max_steps %d: the learning "
            "rate will not have decayed (set max_steps or decay_steps near %d to fit the schedule)",
            sec_per_step,
            format_duration(config.max_time),
            fit,
            config.max_steps,
            fit,
        )
