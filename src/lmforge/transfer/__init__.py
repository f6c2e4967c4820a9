"""Transfer learning: carry a pretrained body (any family) over to a labelled task.

Three modes (``frozen``, ``features``, ``finetune``), five tasks (``classify``, ``pair``,
``tokens``, ``qa``, ``choice``), their metrics, and learning curves.  See ``docs/transfer.md``.

Python API::

    from lmforge.transfer import run_transfer, load_run, learning_curve
    metrics = run_transfer("runs/bert", "classify", "train.jsonl", "test.jsonl", mode="features", out_dir="out")
    run = load_run("out"); run.predict(TaskData(...))
"""

from __future__ import annotations

from ..data.tasks import TASKS, TaskData, load_task
from .batching import RowStore
from .config import MODES, SUPPORTED, TransferConfig, check_supported
from .curve import learning_curve
from .run import TransferRun, load_body, load_run, run_transfer
from .specs import SPECS, TaskSpec

__all__ = [
    "MODES",
    "RowStore",
    "SPECS",
    "TaskSpec",
    "check_supported",
    "load_body",
    "SUPPORTED",
    "TASKS",
    "TaskData",
    "TransferConfig",
    "TransferRun",
    "learning_curve",
    "load_run",
    "load_task",
    "run_transfer",
]
