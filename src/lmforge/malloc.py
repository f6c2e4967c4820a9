"""glibc's malloc told to keep the memory a process frees, for the next allocations of the same sizes.

With its defaults glibc serves a block above its mmap threshold (at most 32 MiB) from a fresh mapping,
which it unmaps when the block is freed, and it returns the top of its heap to the kernel once more than
the trim threshold lies free there.  A training step or a forward pass allocates tensors of the same sizes
every time (a 16 x 128 batch's scores over an 8,192-piece vocabulary are 64 MiB), so each call then takes
a page fault on every 4 KiB page of them, and the kernel zero-fills each page before torch writes it.

:func:`keep_freed_memory` raises both thresholds, so that freed blocks stay in the process and are reused.
The ``lmforge`` command calls it before any work; the library leaves the process's allocator alone, and a
program that imports lmforge can call it itself.  The cost: the process keeps the memory of its largest
moment (a training run's step, an encoding batch) until it exits.  ``bench/bench_bert.py --malloc`` and
``bench/bench_gpt.py --malloc`` measure both settings.
"""

from __future__ import annotations

import ctypes
import os
import sys

from .errors import ConfigError

ENV = "LMFORGE_MALLOC"  # "keep" (the default): keep freed memory; "system": leave glibc's defaults
MMAP_THRESHOLD = 1 << 30  # blocks up to 1 GiB come from the heap, whose freed memory is reused
TRIM_THRESHOLD = 1 << 30  # up to 1 GiB free at the top of the heap stays with the process
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def environment_choice() -> str | None:
    """Why the environment already decides the allocator's behaviour, or ``None`` when it does not.

    Raises:
        ConfigError: ``LMFORGE_MALLOC`` is set to something other than ``keep`` or ``system``.
    """
    setting = os.environ.get(ENV, "keep").strip().lower()
    if setting not in ("keep", "system"):
        raise ConfigError(f"{ENV}={os.environ[ENV]!r}: use keep (the default: freed memory is reused) or system "
                          "(glibc's defaults)")
    if setting == "system":
        return f"glibc's defaults ({ENV}=system)"
    preload = os.environ.get("LD_PRELOAD", "")
    for name in _OTHER_ALLOCATORS:
        if name in preload:
            return f"{name} (LD_PRELOAD)"
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "") or any(
        k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    ):
        return "glibc, as the environment tunes it"
    return None


def keep_freed_memory() -> str:
    """Raise glibc's mmap and trim thresholds for this process unless the environment chose otherwise.

    Returns:
        what the allocator does now, in words (for logs and bench records).
    """
    chosen = environment_choice()
    if chosen is not None:
        return chosen
    if not sys.platform.startswith("linux"):
        return "the system's allocator"
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "the system's allocator (no glibc)"
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # a glibc that caps the mmap threshold at its default maximum (32 MiB on 64-bit) still gets that much
    mmap = next((size for size in (MMAP_THRESHOLD, 32 << 20) if mallopt(_M_MMAP_THRESHOLD, size) == 1), None)
    if mmap is None or mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return "glibc's defaults (mallopt refused the thresholds)"
    return f"glibc, keeping freed memory (mmap threshold {mmap >> 20} MiB, trim threshold {TRIM_THRESHOLD >> 20} MiB)"
