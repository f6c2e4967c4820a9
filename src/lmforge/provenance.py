"""Where a figure came from: the command, the code, the date and the machine.

Every run record lmforge writes (learning curves, evaluations, the demo report, the benches) carries
:func:`provenance`, so a table built from records can name, beside each figure, what produced it.
Figures differ between CPU kinds (AVX2, AVX-512, AMX) and thread counts, so the machine is part
of the result, not a footnote.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

from .cpu_quota import quota_cores

# CPU features that change which kernels and precisions are fast.
_NOTABLE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_info() -> dict:
    """``{"model": ..., "flags": [...]}`` of this machine's CPU (Linux ``/proc/cpuinfo``; else ``platform``)."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return {
        "model": model or platform.processor() or platform.machine() or "unknown CPU",
        "flags": [f for f in _NOTABLE_FLAGS if f in flags],
    }


def git_commit(start: str | Path | None = None) -> str | None:
    """The commit of the git checkout holding ``start`` (default: this package), ``+dirty`` if changed."""
    where = Path(start) if start else Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=where, capture_output=True, text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine() -> dict:
    """The CPU model and its notable flags, the thread count torch uses, the core count, the cgroup CPU quota
    where one binds (``cpu_quota``, in CPUs) and the accelerator."""
    info = cpu_info()
    out = {"cpu": info["model"], "cpu_flags": info["flags"], "cores": os.cpu_count(), "threads": None}
    quota = quota_cores()
    if quota is not None:
        out["cpu_quota"] = quota
    torch = sys.modules.get("torch")
    if torch is not None:  # never import torch just to describe the machine
        out["threads"] = torch.get_num_threads()
        out["torch"] = torch.__version__
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    return out


def describe_machine(m: dict | None = None) -> str:
    """One line, e.g. ``Intel(R) Xeon(R) Processor (avx512_bf16, amx_bf16), 2 threads, torch 2.13.0``."""
    m = m or machine()
    flags = f" ({', '.join(m['cpu_flags'])})" if m.get("cpu_flags") else ""
    parts = [f"{m['cpu']}{flags}"]
    if m.get("threads"):
        parts.append(f"{m['threads']} thread{'s' if m['threads'] != 1 else ''}")
    if m.get("cpu_quota"):
        parts.append(f"a quota of {m['cpu_quota']:g} CPUs")
    if m.get("gpu"):
        parts.append(m["gpu"])
    if m.get("torch"):
        parts.append(f"torch {m['torch']}")
    return ", ".join(parts)


def provenance(argv: list[str] | None = None) -> dict:
    """What a run record stores about its origin: command, lmforge version and commit, UTC date, machine."""
    from . import __version__

    args = sys.argv if argv is None else argv
    prog = Path(args[0]).name if args else "lmforge"
    command = shlex.join(["lmforge" if prog in ("lmforge", "__main__.py") else prog, *args[1:]]) if args else ""
    return {
        "command": command,
        "lmforge": __version__,
        "commit": git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "machine": machine(),
    }
