"""One trainer for every family: config, schedule, checkpoints, DDP, the pretraining driver.

``Trainer(model, sampler, TrainConfig(...), out_dir).train()`` trains anything whose forward returns
a ``ModelOutput`` with a loss; ``lmforge.train.pretrain.pretrain`` is the ``lmforge pretrain FAMILY`` driver.
"""

from __future__ import annotations

from .config import TrainConfig, format_duration, parse_duration
from .schedule import LRSchedule, make_scheduler
from .trainer import Trainer, TrainResult

__all__ = [
    "TrainConfig",
    "Trainer",
    "TrainResult",
    "LRSchedule",
    "make_scheduler",
    "parse_duration",
    "format_duration",
]
