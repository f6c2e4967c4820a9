"""Learning-rate schedule: linear warm-up, then linear or cosine decay to ``min_lr`` (or constant).

The factor is a pure function of the optimizer step, so a resumed run recomputes exactly the
learning rate the uninterrupted run would have used.  It is wrapped in ``torch``'s own
``LambdaLR`` so the usual scheduler API (``step``, ``get_last_lr``, ``state_dict``) applies.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .config import TrainConfig


@dataclasses.dataclass
class LRSchedule:
    """Multiplier of the peak learning rate at optimizer step ``s`` (0-based).

    * warm-up, ``s < warmup_steps``: ``(s + 1) / warmup_steps`` (the first step already learns;
      the peak is reached at step ``warmup_steps - 1``);
    * then, with ``p = (s - warmup_steps) / (decay_steps - warmup_steps)`` clamped to [0, 1]:
      ``linear``: ``min + (1 - min) * (1 - p)``; ``cosine``: ``min + (1 - min) * (1 + cos(pi p)) / 2``;
      ``constant``: 1.  So the factor is ``min_lr_ratio`` from ``decay_steps`` on.
    """

    warmup_steps: int
    decay_steps: int
    kind: str = "cosine"
    min_lr_ratio: float = 0.1

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        span = max(1, self.decay_steps - self.warmup_steps)
        p = min(1.0, max(0.0, (step - self.warmup_steps) / span))
        if self.kind == "linear":
            decay = 1.0 - p
        elif self.kind == "cosine":
            decay = 0.5 * (1.0 + math.cos(math.pi * p))
        else:  # pragma: no cover - TrainConfig checks the name
            raise ValueError(f"unknown schedule {self.kind!r}")
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * decay

    @classmethod
    def from_config(cls, config: TrainConfig) -> LRSchedule:
        return cls(config.warmup_steps, config.horizon, config.schedule, config.min_lr_ratio)


def make_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` over :class:`LRSchedule`; call ``.step()`` once after every optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, LRSchedule.from_config(config))


def scheduler_state(scheduler: torch.optim.lr_scheduler.LambdaLR) -> dict:
    """The JSON-ready part of a scheduler's state (the schedule itself comes from the config)."""
    return {
        "last_epoch": int(scheduler.last_epoch),
        "step_count": int(getattr(scheduler, "_step_count", 0)),
        "base_lrs": [float(x) for x in scheduler.base_lrs],
    }


def restore_scheduler(scheduler: torch.optim.lr_scheduler.LambdaLR, state: dict) -> None:
    """Undo :func:`scheduler_state`: the scheduler and the optimizer's ``lr`` continue at ``last_epoch``.

    The learning rate is recomputed from the *current* config's schedule, the same expression
    ``LambdaLR`` uses, so it is bit-identical to the uninterrupted run's when the config is unchanged.
    """
    scheduler.last_epoch = int(state["last_epoch"])
    scheduler._step_count = int(state.get("step_count", scheduler.last_epoch + 1))
    scheduler.base_lrs = [float(x) for x in state["base_lrs"]]
    lrs = [base * lmbda(scheduler.last_epoch) for lmbda, base in zip(scheduler.lr_lambdas, scheduler.base_lrs)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs
