"""The training config shared by every Trainer-based family (BERT, GPT, ELMo).

One flat dataclass, saved as ``train_config.json`` beside the model's ``config.json``.  Families
shift its defaults with their ``TRAIN_DEFAULTS`` dict; users with ``--set key=value``.
"""

from __future__ import annotations

import dataclasses
import math
import re

from ..devices import PRECISIONS, check_device
from ..errors import ConfigError
from ..utils import SEED_MAX

SCHEDULES = ("linear", "cosine", "constant")

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)")
_UNIT_SECONDS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str | float | int) -> float:
    """Parse a time budget such as ``"90s"``, ``"15m"``, ``"1h"``, ``"1h30m"`` or ``"90"`` into seconds.

    Args:
        text: the duration; a bare number means seconds.
    Returns:
        The duration in seconds (> 0).
    Raises:
        ConfigError: when the text is not a positive duration.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        s = str(text).strip().lower().replace(" ", "")
        pos, seconds = 0, 0.0
        while pos < len(s):
            m = _DURATION_PART.match(s, pos)
            if not m:
                break
            seconds += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
            pos = m.end()
        if not s or pos != len(s):
            raise ConfigError(f"bad duration {text!r}; write it like 90s, 15m, 1h or 1h30m")
    if not seconds > 0:
        raise ConfigError(f"the time budget must be positive, got {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """``5400.0`` -> ``"1h30m"``; ``42.5`` -> ``"42.5s"`` (for messages)."""
    if seconds < 60:
        return f"{seconds:g}s"
    h, rem = divmod(int(round(seconds)), 3600)
    m, s = divmod(rem, 60)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v)


@dataclasses.dataclass
class TrainConfig:
    """How to train (the same fields for every family).

    Attributes:
        max_steps: optimizer steps to run (the step budget), counted over the whole run incl. resumes.
        max_time: wall-clock budget in seconds for this invocation (``None`` = none); when it runs out
            the trainer stops after the current step, saves a checkpoint and says so.  The CLI takes
            ``--max-time 90s|15m|1h``.
        batch_size: rows per micro-batch *per process*; the global batch is
            ``batch_size * grad_accum * world_size``.
        grad_accum: micro-batches accumulated per optimizer step (each loss is divided by it).
        lr: peak learning rate.
        min_lr_ratio: the schedule decays to ``lr * min_lr_ratio``.
        warmup_steps: linear warm-up length; step ``s < warmup_steps`` uses ``lr * (s + 1) / warmup_steps``.
        decay_steps: step at which the decay reaches ``min_lr`` (default ``max_steps``).  Set it when a
            run may later be extended with ``--resume`` and a larger ``max_steps``, so that the
            schedule does not depend on where the first run stopped.
        schedule: ``linear``, ``cosine`` or ``constant`` after the warm-up.
        weight_decay: AdamW decoupled weight decay for matrices (Linear, Embedding, conv weights); biases,
            norm weights and other 1-D parameters get none.
        beta1, beta2, eps: AdamW's.
        grad_clip: clip the global gradient norm to this (0 = no clipping).
        precision: ``auto`` (bf16 where the device computes it natively, else fp32), ``fp32``, ``bf16`` or
            ``fp16`` (CUDA only, with a gradient scaler): the autocast of forward and loss; weights and
            optimizer stay fp32 (see :mod:`lmforge.train.precision`).  A run saves the resolved choice.
        eval_every: evaluate on the validation split every N steps (0 = only at the end).
        eval_batches: validation batches per evaluation, each the size of a global training batch (the same
            rows every time, whatever the split over processes and micro-batches).
        log_every: append a train event to ``metrics.jsonl`` every N steps.
        save_every: write a checkpoint every N steps (0 = only at the end).
        seed: seeds the data order (every row's RNG), dropout and the model's initialisation.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N`` (the CLI's ``--device``).
        log: ``jsonl`` (metrics.jsonl and the PNG) or ``tensorboard`` (also TensorBoard event files beside them).
        compile: run the training forward through ``torch.compile`` (the CLI's ``--compile``; off by default:
            on a CPU its start-up costs more than short runs gain, see docs/training.md).
    """

    max_steps: int = 1000
    max_time: float | None = None
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    decay_steps: int | None = None
    schedule: str = "cosine"
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0
    precision: str = "auto"
    eval_every: int = 200
    eval_batches: int = 20
    log_every: int = 10
    save_every: int = 200
    seed: int = 0
    device: str = "auto"
    log: str = "jsonl"
    compile: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_time, str):
            self.max_time = parse_duration(self.max_time)

        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ConfigError(f"TrainConfig: {what}")

        need(self.max_steps >= 1, f"max_steps must be >= 1, got {self.max_steps}")
        need(self.max_time is None or self.max_time > 0, f"max_time must be positive, got {self.max_time}")
        need(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        need(self.grad_accum >= 1, f"grad_accum must be >= 1, got {self.grad_accum}")
        for name in ("lr", "min_lr_ratio", "weight_decay", "beta1", "beta2", "eps", "grad_clip"):
            need(math.isfinite(getattr(self, name)), f"{name} must be a finite number, got {getattr(self, name)}")
        need(self.lr > 0, f"lr must be > 0, got {self.lr}")
        need(0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        need(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        need(self.decay_steps is None or self.decay_steps >= 1, f"decay_steps must be >= 1, got {self.decay_steps}")
        need(self.schedule in SCHEDULES, f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        need(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        need(0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0, "beta1 and beta2 must be in [0, 1)")
        need(self.eps > 0, f"eps must be > 0, got {self.eps}")
        need(self.grad_clip >= 0, f"grad_clip must be >= 0 (0 = off), got {self.grad_clip}")
        need(self.eval_every >= 0, f"eval_every must be >= 0 (0 = only at the end), got {self.eval_every}")
        need(self.eval_batches >= 1, f"eval_batches must be >= 1, got {self.eval_batches}")
        need(self.log_every >= 1, f"log_every must be >= 1, got {self.log_every}")
        need(self.save_every >= 0, f"save_every must be >= 0 (0 = only at the end), got {self.save_every}")
        need(0 <= self.seed <= SEED_MAX, f"seed must be a whole number from 0 to {SEED_MAX}, got {self.seed}")
        need(self.precision in PRECISIONS, f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        try:
            check_device(self.device)
        except ConfigError as e:
            need(False, str(e))
        need(self.log in ("jsonl", "tensorboard"), f"log must be jsonl or tensorboard, got {self.log!r}")

    @property
    def horizon(self) -> int:
        """The step at which the learning rate reaches its minimum."""
        return self.decay_steps if self.decay_steps is not None else self.max_steps
