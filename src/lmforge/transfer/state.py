"""What the parts of a transfer run share: :class:`RunState`, passed to each part explicitly.

:class:`~lmforge.transfer.run.TransferRun` sets it up once (body, config, mode, input format, layers) and hands it to
the network (:class:`~lmforge.transfer.building.RunNetwork`: the head joined to the body, what trains) and to the
stored vectors (:class:`~lmforge.transfer.stored.RunVectors`: body passes, the features cache, the scikit-learn
fit).  The fields a body pass or a build fills in later (``num_states``, ``extract_ids``, ``model``) live here too,
so every part reads the same value.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .config import Recipe, TransferConfig
from .encoding import InputFormat
from .model import TransferModel
from .modes import Mode
from .specs import TaskSpec


@dataclasses.dataclass
class RunState:
    """The setup of one transfer run (see the module docstring); ``TransferRun`` fills it in on construction."""

    body: nn.Module | None = None
    cfg: TransferConfig | None = None
    mode: Mode | None = None  # the object of cfg.mode (lmforge.transfer.modes)
    spec: TaskSpec | None = None
    recipe: Recipe | None = None
    labels: list[str] = dataclasses.field(default_factory=list)
    label_index: dict[str, int] = dataclasses.field(default_factory=dict)
    family: str | None = None
    model_dir: str | None = None
    device: torch.device | None = None
    fmt: InputFormat | None = None
    layer: int | str | None = None  # what the head reads: an index, "mix" or "auto"
    pooler: bool = False  # the head reads BERT's pooler
    pair_rows: bool = False  # a pair's two texts are read apart (mean read-out)
    task_token_ids: tuple[int, ...] = ()  # GPT's start / delimiter / extract ids
    num_states: int | None = None  # the body's hidden states, filled on the first body pass
    extract_ids: list[int] | None = None  # the layers a features pass stores
    model: TransferModel | None = None  # the head joined to the body, once built

    def encode(self, data) -> list:
        """The body inputs of ``data`` in order (QA: one per window; choice: one per choice); each encoding's
        ``example`` is the index of its example in ``data``."""
        out = []
        for i, ex in enumerate(data.examples):
            for e in self.spec.encode(self.fmt, ex):
                e.example = i
                out.append(e)
        return out
