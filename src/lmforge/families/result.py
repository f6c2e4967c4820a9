"""What a pretraining run returns, whichever way the family is trained."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass
class PretrainResult:
    """What :func:`lmforge.train.pretrain.pretrain` returns.

    Attributes:
        family: e.g. ``"gpt"``.
        out_dir: the model folder written.
        val: final validation metrics (``loss``, ``ppl``, family metrics such as ``mlm_acc``).
        step: optimizer steps done in total (``None`` for families trained without the Trainer).
        stop_reason: ``"max_steps"``, ``"max_time"`` or ``"done"`` (word2vec).
        train_loss: mean training loss of the last logging interval, if known.
        tokens_seen: training tokens consumed, if known.
        elapsed: training seconds, if known.
    """

    family: str
    out_dir: Path
    val: dict[str, float]
    step: int | None = None
    stop_reason: str = "done"
    train_loss: float | None = None
    tokens_seen: int | None = None
    elapsed: float | None = None
