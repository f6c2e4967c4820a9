"""The names ``--device`` and ``--precision`` accept, checked without importing torch.

The command line parses these for every training command, and ``lmforge COMMAND --help`` should not wait
for torch to load; :mod:`lmforge.train.precision` resolves the names to a device and an arithmetic,
held by one :class:`Compute` per command.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from .errors import ConfigError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def check_device(name: str) -> str:
    """``name`` if it is ``auto``, ``cpu``, ``cuda`` or ``cuda:N``; else a one-line ConfigError."""
    if name in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", str(name)):
        return name
    raise ConfigError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}")


def check_precision(name: str) -> str:
    """``name`` if it is one of :data:`PRECISIONS`; else a one-line ConfigError."""
    if name in PRECISIONS:
        return name
    raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {name!r}")


@dataclasses.dataclass(frozen=True)
class Compute:
    """Where a command computes and in which arithmetic, resolved once per command and handed to every part.

    :func:`lmforge.train.precision.resolve_compute` makes it from ``--device`` and ``--precision``; where ``auto``
    depends on the model (a CPU with native bf16), it stays ``pending`` until the model exists, and
    :func:`lmforge.train.precision.settle` finishes it there.  The parts read it; none resolves the names again.

    Attributes:
        device: the ``torch.device``.
        requested: ``--precision`` as given (``auto``, ``fp32``, ``bf16``, ``fp16``).
        precision: the concrete ``fp32``, ``bf16`` or ``fp16`` (``auto`` while ``pending``).
        reason: why ``auto`` chose it (empty when the precision was asked for).
        speedup: fp32's step time over bf16's where ``auto`` measured both, else ``None``.
        pending: ``auto`` that the model decides, not yet settled.
    """

    device: Any
    requested: str
    precision: str
    reason: str = ""
    speedup: float | None = None
    pending: bool = False

    @property
    def autocast_dtype(self) -> str | None:
        """The torch dtype name the forward pass runs in under autocast (``None``: no autocast, fp32)."""
        return {"bf16": "bfloat16", "fp16": "float16"}.get(self.precision)

    @property
    def uses_grad_scaler(self) -> bool:
        """Whether training needs a gradient scaler (fp16 on CUDA: small gradients underflow without one)."""
        return self.precision == "fp16" and getattr(self.device, "type", "") == "cuda"
