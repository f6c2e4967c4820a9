"""What this CPU computes natively, and whether a fast route runs here at all: probed once per process.

PyTorch ships oneDNN kernels for every x86 CPU, but not every kernel runs on every CPU: on one without
native bf16 (an AMD EPYC with AVX2 only, or an Intel CPU whose oneDNN is capped by ``ONEDNN_MAX_CPU_ISA``)
oneDNN cannot create a bf16 inner product and raises ``could not create a primitive descriptor``.  So a
route of :mod:`lmforge.nn.cpu_ops` is taken only where it runs: :func:`runs` tries it once on the real
inputs and answers ``False`` on that error (the caller then takes PyTorch's own kernel), and the platform
facts the rules need (:func:`onednn_bf16`, :func:`amx`) come from torch's own probes.

The environment variable ``LMFORGE_CPU_FEATURES`` (read on every question, so a test can set it):

- ``native`` (the default): what this CPU and torch say;
- ``avx2``: act as on a CPU with AVX2 only, whatever this one has: no native bf16 (``--precision auto``
  resolves to fp32), no AMX, no oneDNN bf16 route.  PyTorch's own kernels still use what the CPU has;
  ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` caps those too.

The answers are per process and never written to the choices cache: a tiny call costs less than a file
read, and the same machine answers differently under another ``ONEDNN_MAX_CPU_ISA``.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

FEATURES_ENV = "LMFORGE_CPU_FEATURES"
FEATURE_LEVELS = ("native", "avx2")
_RUNS: dict[tuple[str, str], bool] = {}  # (level, question) -> whether the route ran, this process's answers


def level() -> str:
    """``native`` or ``avx2``: the CPU features lmforge's routes assume (``LMFORGE_CPU_FEATURES``; an unknown
    value is taken as ``native``)."""
    value = os.environ.get(FEATURES_ENV, "native").strip().lower()
    return value if value in FEATURE_LEVELS else "native"


def forced_avx2() -> bool:
    """Whether ``LMFORGE_CPU_FEATURES=avx2`` asks for the routes of a CPU with AVX2 only."""
    return level() == "avx2"


@functools.lru_cache(maxsize=1)
def _torch_onednn_bf16() -> bool:
    probe = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    if probe is None or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(probe())
    except RuntimeError:  # pragma: no cover - a build that lists the probe without its kernel
        return False


@functools.lru_cache(maxsize=1)
def _torch_amx() -> bool:
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def onednn_bf16() -> bool:
    """Whether oneDNN computes bf16 on this CPU (torch's ``_is_mkldnn_bf16_supported``: AVX-512 or better,
    within ``ONEDNN_MAX_CPU_ISA``); ``False`` under ``LMFORGE_CPU_FEATURES=avx2``."""
    return not forced_avx2() and _torch_onednn_bf16()


def amx() -> bool:
    """Whether torch's bf16 kernels use AMX here: the CPU has AMX tiles and oneDNN may use bf16 (a oneDNN
    capped below AVX-512 leaves AMX unused); ``False`` under ``LMFORGE_CPU_FEATURES=avx2``."""
    return not forced_avx2() and _torch_amx() and _torch_onednn_bf16()


def runs(question: str, call: Callable[[], object]) -> bool:
    """Whether ``call`` (a route's kernel on the caller's inputs) runs on this CPU: tried once per
    ``question`` and feature level, ``False`` where PyTorch raises (a oneDNN primitive that cannot be created
    here), the error logged at debug level."""
    key = (level(), question)
    hit = _RUNS.get(key)
    if hit is None:
        try:
            call()
            hit = True
        except RuntimeError as e:
            logger.debug("%s does not run on this CPU, PyTorch's own kernel takes it: %s", question, e)
            hit = False
        _RUNS[key] = hit
    return hit


def failed_routes() -> list[str]:
    """The questions whose fast route did not run here (this process, this feature level)."""
    lv = level()
    return sorted(q for (k, q), ok in _RUNS.items() if k == lv and not ok)


def forget() -> None:
    """Drop this process's answers of :func:`runs` (the next question tries its route again)."""
    _RUNS.clear()


def describe() -> str:
    """One line for benches and run logs: ``CPU features: avx2 (LMFORGE_CPU_FEATURES; oneDNN bf16: no, AMX: no)``."""
    yes = {True: "yes", False: "no"}
    return f"CPU features: {level()} ({FEATURES_ENV}; oneDNN bf16: {yes[onednn_bf16()]}, AMX: {yes[amx()]})"


__all__ = ["FEATURES_ENV", "FEATURE_LEVELS", "level", "forced_avx2", "onednn_bf16", "amx", "runs", "failed_routes",
           "forget", "describe"]
