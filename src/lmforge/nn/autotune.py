"""Per-machine choices made by measurement: a short timing of the candidates, kept in a cache file.

Which kernel or precision is fastest depends on the machine: oneDNN's fp32 GEMM beats MKL's on some
CPUs (an AMD EPYC) and loses to it on others (an Intel Xeon with AMX); bf16 autocast speeds up a wide
BERT's training on a CPU with AMX and slows down a narrow one (the speed sections of docs/bert.md and
docs/gpt.md).  Where lmforge has two ways to
compute the same thing, it times both for a few alternating repetitions the first time it needs the
answer on a machine (the best repetition of each: on a shared machine, the one nobody preempted), and
keeps the answer in a JSON file::

    $LMFORGE_CACHE/choices.json       (default: $XDG_CACHE_HOME/lmforge, else ~/.cache/lmforge)

under a key naming the CPU model, the torch version, the thread count and any cap on the instruction
sets (``ONEDNN_MAX_CPU_ISA`` and the like, where set): what the answers depend on.  Then one entry per
question (``linear:train:256x1024``, ``precision:bert:...``).  Later runs on the same machine read the
answer instead of measuring, so a machine keeps computing the same way.  Delete
the file to measure again; ``LMFORGE_CACHE=off`` measures in every process and writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..provenance import cpu_info
from ..storage.files import atomic_write_text
from .cpu_features import FEATURES_ENV

logger = logging.getLogger(__name__)

CACHE_ENV = "LMFORGE_CACHE"
CACHE_FILE = "choices.json"
_LOCK = threading.Lock()
_MEMORY: dict[str, dict[str, dict]] = {}  # machine key -> question -> entry, this process's view


def cache_path() -> Path | None:
    """The cache file, or ``None`` when ``LMFORGE_CACHE=off``."""
    where = os.environ.get(CACHE_ENV)
    if where is not None and where.strip().lower() in ("off", "0", "none", ""):
        return None
    if where:
        return Path(where).expanduser() / CACHE_FILE
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lmforge" / CACHE_FILE


# environment variables that change which kernels run (and how fast) on the same CPU: set, they join the key
ISA_ENVS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", FEATURES_ENV)


def machine_key() -> str:
    """What the answers depend on: the CPU model, torch's version, its intra-op thread count, and any cap on
    the instruction sets its kernels use (:data:`ISA_ENVS`, where set)."""
    caps = "".join(f" | {k}={v}" for k in ISA_ENVS if (v := os.environ.get(k, "").strip()))
    return f"{cpu_info()['model']} | torch {torch.__version__} | {torch.get_num_threads()} threads{caps}"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # missing or unreadable: measure again (a cache never stops a run)
    return data if isinstance(data, dict) else {}


def lookup(question: str) -> dict | None:
    """The cached entry for ``question`` on this machine, or ``None``."""
    key = machine_key()
    with _LOCK:
        mine = _MEMORY.setdefault(key, {})
        if question not in mine:  # read the file again: another process may have answered since
            path = cache_path()
            stored = _read(path).get(key) if path is not None else None
            if isinstance(stored, dict):
                mine.update({q: e for q, e in stored.items() if q not in mine})
        entry = mine.get(question)
    return entry if _answered(entry) else None


def _answered(entry: object) -> bool:
    """Whether a cached entry holds a measured answer (a dict with its ``choice``)."""
    return isinstance(entry, dict) and "choice" in entry


def lookup_prefix(prefix: str) -> dict[str, dict]:
    """Every cached entry on this machine whose question starts with ``prefix`` (question -> entry)."""
    lookup(prefix)  # reads the file into this process's view
    with _LOCK:
        mine = _MEMORY.get(machine_key(), {})
        return {q: e for q, e in mine.items() if q.startswith(prefix) and _answered(e)}


def remember(question: str, entry: dict) -> None:
    """Store ``entry`` (with its ``choice``) for ``question`` on this machine: in memory and in the file."""
    key = machine_key()
    with _LOCK:
        _MEMORY.setdefault(key, {})[question] = entry
        path = cache_path()
        if path is None:
            return
        data = _read(path)  # merge: other processes may have written other answers meanwhile
        data.setdefault(key, {})
        if not isinstance(data[key], dict):
            data[key] = {}
        data[key][question] = entry
        try:
            atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
        except OSError as e:  # a read-only home: keep the answer for this process only
            logger.debug("could not write %s: %s", path, e)


def forget() -> None:
    """Drop this process's view of the cache (the file is read again on the next lookup)."""
    with _LOCK:
        _MEMORY.clear()


def best_times(candidates: dict[str, Callable[[], object]], reps: int = 5, warmup: int = 1) -> dict[str, float]:
    """The best wall time in seconds of each candidate over ``reps`` calls, the calls alternating.

    The order of the candidates flips every round, so drift in the machine's speed hits all alike.
    """
    names = list(candidates)
    best = {k: float("inf") for k in names}
    for i in range(warmup + reps):
        for name in names if i % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            candidates[name]()
            dt = time.perf_counter() - t
            if i >= warmup:
                best[name] = min(best[name], dt)
    return best


def choose(
    question: str,
    candidates: dict[str, Callable[[], object]],
    default: str,
    margin: float = 1.05,
    reps: int = 5,
    warmup: int = 1,
) -> str:
    """The fastest candidate for ``question`` on this machine: from the cache, else measured and cached.

    ``default`` (the plain PyTorch route) is kept unless another candidate is faster by more than
    ``margin`` (so timing noise does not flip a near tie).  Under ``torch.compile`` tracing nothing is
    measured: the cached answer or ``default``.
    """
    if _compiling():
        return default
    entry = lookup(question)
    if entry is not None and entry["choice"] in candidates:
        return entry["choice"]
    times = best_times(candidates, reps=reps, warmup=warmup)
    choice = min(times, key=times.get)
    if choice != default and times[default] <= times[choice] * margin:
        choice = default
    remember(question, {"choice": choice, "seconds": {k: round(v, 6) for k, v in times.items()},
                        "date": time.strftime("%Y-%m-%d")})
    logger.debug("%s: %s (%s)", question, choice, ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in times.items()))
    return choice


def _compiling() -> bool:
    with contextlib.suppress(AttributeError):
        return bool(torch.compiler.is_compiling())
    return False


__all__ = ["CACHE_ENV", "cache_path", "machine_key", "lookup", "lookup_prefix", "remember", "forget", "best_times",
           "choose"]
