"""The names ``--device`` and ``--precision`` accept, checked without importing torch.

The command line parses these for every training command, and ``lmforge COMMAND --help`` should not wait
for torch to load; :mod:`lmforge.train.precision` resolves the names to a device and an arithmetic.
"""

from __future__ import annotations

import re

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
