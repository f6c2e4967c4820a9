"""Where a run computes and in which precision: ``--device`` and ``--precision``, resolved once.

Every training command (pretrain, finetune, benchmark curve, demo) takes the same two settings:

- ``device``: ``auto`` (CUDA when torch sees a GPU, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``.
- ``precision``: ``auto``, ``fp32``, ``bf16`` or ``fp16``.  ``bf16`` and ``fp16`` run the forward pass and
  the loss under autocast; weights and optimizer state stay fp32.  ``fp16`` needs a GPU and a gradient
  scaler (:func:`grad_scaler`); on a CPU it is refused.  ``auto`` is bf16 where the device computes bf16
  natively (a CPU with the ``avx512_bf16`` or ``amx_bf16`` flag, a CUDA GPU that supports bf16) and fp32
  elsewhere: emulated bf16 on an AVX2 CPU runs far below fp32.

:func:`resolve_precision` turns ``auto`` into the concrete choice, which the run saves and reports, so a
saved config repeats the same arithmetic.
"""

from __future__ import annotations

import contextlib
import functools
import re
from pathlib import Path

import torch

from ..errors import ConfigError

DEVICES = ("auto", "cpu", "cuda", "cuda:N")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# CPU flags (Linux /proc/cpuinfo) that mean native bf16 arithmetic
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO_PATH = "/proc/cpuinfo"


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


def resolve_device(name: str) -> torch.device:
    """The torch device of a ``--device`` value (``auto``: CUDA when available, else the CPU).

    Raises:
        ConfigError: a malformed name, or a CUDA device that torch does not see.
    """
    check_device(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: torch sees no CUDA GPU here; use --device cpu (or auto)")
        index = int(name.split(":")[1]) if ":" in name else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: only {torch.cuda.device_count()} CUDA GPU(s) here (cuda:0 ...)")
        return torch.device("cuda", index)
    return torch.device(name)


@functools.lru_cache(maxsize=4)
def _cpuinfo_flags(path: str) -> frozenset[str] | None:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


def cpu_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively: the ``avx512_bf16`` or ``amx_bf16`` flag in /proc/cpuinfo
    (torch's own CPU probe where there is no /proc/cpuinfo)."""
    flags = _cpuinfo_flags(CPUINFO_PATH)
    if flags is not None:
        return any(f in flags for f in BF16_CPU_FLAGS)
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, p, lambda: False)()) for p in probes)


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 natively (see :func:`cpu_native_bf16`; CUDA: ``is_bf16_supported``)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        return cpu_native_bf16()
    return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """The concrete precision (``fp32``, ``bf16`` or ``fp16``) of ``precision`` on ``device``.

    Raises:
        ConfigError: an unknown name, or ``fp16`` on a CPU (no gradient scaler there; use bf16).
    """
    check_precision(precision)
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("--precision fp16 needs a CUDA GPU (it trains with a gradient scaler); on a CPU use "
                          "--precision bf16 or fp32")
    return precision


def describe(requested: str, resolved: str, device: torch.device) -> str:
    """One line for the start of a run, e.g. ``precision bf16 (auto: this CPU computes bf16 natively)``."""
    where = "this CPU" if device.type == "cpu" else f"{device}"
    if requested == "auto":
        why = f"{where} computes bf16 natively" if resolved == "bf16" else f"{where} has no native bf16"
        return f"precision {resolved} (auto: {why}; --precision fp32 forces fp32) on {device}"
    note = ""
    if resolved == "bf16" and not native_bf16(device):
        note = f"; {where} has no native bf16, so this runs slower than fp32"
    return f"precision {resolved} (asked for){note} on {device}"


def autocast(device: torch.device, precision: str):
    """The autocast context of a resolved ``precision`` (a no-op for fp32)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler | None:
    """A gradient scaler for fp16 on CUDA (small gradients underflow in fp16 without one); else ``None``."""
    if precision == "fp16" and device.type == "cuda":
        return torch.amp.GradScaler("cuda")
    return None


def upgrade_legacy_keys(data: dict) -> dict:
    """A saved config of lmforge 0.1 with ``bf16: true|false`` in place of ``precision`` (a copy)."""
    if "bf16" not in data:
        return data
    out = {k: v for k, v in data.items() if k != "bf16"}
    out.setdefault("precision", "bf16" if data["bf16"] in (True, "true", "True", 1) else "fp32")
    return out
