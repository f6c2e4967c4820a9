"""Transfer learning: carry a pretrained body (any family) over to a labelled task.

Three modes (``frozen``, ``features``, ``finetune``), five tasks (``classify``, ``pair``,
``tokens``, ``qa``, ``choice``), their metrics, and learning curves.  See ``docs/transfer.md``.

Python API::

    from lmforge.transfer import Transfer, run_transfer, load_run, learning_curve
    clf = Transfer("models/bert", task="classify", mode="finetune").fit("train.jsonl")   # scikit-learn style
    clf.predict(["a new text"]); clf.score("test.jsonl"); clf.save("out")
    metrics = run_transfer("models/bert", "classify", "train.jsonl", "test.jsonl", mode="features", out_dir="out")
    run = load_run("out"); run.predict(TaskData(...))
"""

from __future__ import annotations

from ..data.tasks import TASKS, TaskData, load_task
from .config import TransferConfig, check_supported
from .curve import learning_curve
from .estimator import Transfer
from .folder import load_body, load_run, run_transfer
from .model import RowStore
from .modes import MODES, Features, Finetune, Frozen, Mode, mode_of
from .run import TransferRun
from .specs import SPECS, TaskSpec

__all__ = [
    "MODES",
    "Features",
    "Finetune",
    "Frozen",
    "Mode",
    "mode_of",
    "RowStore",
    "SPECS",
    "TaskSpec",
    "check_supported",
    "load_body",
    "TASKS",
    "TaskData",
    "Transfer",
    "TransferConfig",
    "TransferRun",
    "learning_curve",
    "load_run",
    "load_task",
    "run_transfer",
]
