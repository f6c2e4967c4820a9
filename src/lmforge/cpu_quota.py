"""torch's threads sized to a container's CPU quota.

``docker run --cpus 2`` and a Kubernetes CPU limit do not hide any core: they give the process's cgroup a
quota of CPU time per scheduler period (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
``cpu.cfs_period_us``).  torch still starts one thread per physical core, its team spends the quota in a
fraction of each period, and then every thread is held until the next one; since every operator ends at
a barrier, the whole step waits.  A team no larger than the quota is never held.

:func:`quota_cores` reads the quota that binds this process (the smallest along its cgroup's path, v2 or
v1), :func:`cap_threads_to_quota` sets ``OMP_NUM_THREADS`` to :func:`quota_threads` of it when that is
fewer than the one thread per physical core torch would start: the quota's whole CPUs, or one thread more
when the quota's fraction pays for the time a team larger than the quota is held (see
:data:`THROTTLED_SHARE`).  The ``lmforge`` command calls it before any work, unless ``OMP_NUM_THREADS`` is
set (the user's choice wins); the library leaves the thread count alone.  ``bench/bench_threads.py --quota``
measures the thread counts under a real quota.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"
CPUINFO = "/proc/cpuinfo"
_V1_MOUNTS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")
#: the share of its ideal speed a team of more threads than the quota keeps: with ``n > q`` threads it runs
#: ``q / n`` of each period, and loses about a fifth more to being held mid-step (``bench/bench_threads.py
#: --quota``: 0.71-0.87 for 2 threads under quotas of 1 to 1.75 CPUs on an Intel Xeon). One thread more than
#: the whole CPUs ``w`` wins when ``q * THROTTLED_SHARE > w``: 1.5 CPUs run 2 threads, 2.5 CPUs run 2.
THROTTLED_SHARE = 0.8


def _v2_limit(folder: Path) -> float | None:
    """``cpu.max`` of a cgroup v2 folder: ``"200000 100000"`` is 2.0 CPUs, ``"max 100000"`` no limit."""
    quota, period = (folder / "cpu.max").read_text().split()[:2]
    return None if quota == "max" else int(quota) / int(period)


def _v1_limit(folder: Path) -> float | None:
    """``cpu.cfs_quota_us / cpu.cfs_period_us`` of a cgroup v1 folder; a quota of -1 is no limit."""
    quota = int((folder / "cpu.cfs_quota_us").read_text())
    period = int((folder / "cpu.cfs_period_us").read_text())
    return quota / period if quota > 0 and period > 0 else None


def _along(base: Path, path: str, limit: Callable[[Path], float | None]) -> list[float]:
    """The limits of the cgroup at ``path`` under ``base`` and of each ancestor that has one.

    Inside a container the path may name the host's hierarchy, which the container's mount does not
    show; the folders that do not exist are passed over, down to ``base`` itself.
    """
    parts = [p for p in path.strip("/").split("/") if p]
    found = []
    for k in range(len(parts), -1, -1):
        folder = base.joinpath(*parts[:k])
        try:
            value = limit(folder)
        except (OSError, ValueError, IndexError, ZeroDivisionError):
            continue
        if value is not None:
            found.append(value)
    return found


def quota_cores(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> float | None:
    """The CPUs' worth of time per period this process may use (e.g. 2.5), or None: no quota, or no cgroup
    files to read (not Linux)."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy, controllers, path = fields
        if hierarchy == "0" and not controllers:  # the unified (v2) hierarchy
            limits += _along(Path(root), path, _v2_limit)
        elif "cpu" in controllers.split(","):  # v1's cpu controller
            mount = next((Path(root) / m for m in _V1_MOUNTS if (Path(root) / m).is_dir()), None)
            if mount is not None:
                limits += _along(mount, path, _v1_limit)
    return min(limits) if limits else None


def torch_default_threads(cpuinfo: str = CPUINFO) -> int:
    """The threads torch starts when nothing sets them: one per physical core of the machine (the distinct
    ``physical id`` / ``core id`` pairs of ``/proc/cpuinfo``, so hyperthread siblings count once), else one
    per CPU."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return os.cpu_count() or 1
    cores = set()
    for block in text.split("\n\n"):
        fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in block.splitlines())}
        if "core id" in fields:
            cores.add((fields.get("physical id", "0"), fields["core id"]))
    return len(cores) or os.cpu_count() or 1


def quota_threads(quota: float | None, default: int) -> int | None:
    """The thread count for ``quota`` CPUs (see :data:`THROTTLED_SHARE`) when it is fewer than the ``default``
    torch would start, else None (a quota never raises the count)."""
    if quota is None:
        return None
    whole = int(quota)
    threads = max(1, whole + 1 if quota * THROTTLED_SHARE > whole else whole)
    return threads if threads < default else None


def cap_threads_to_quota(environ: dict | None = None, quota: float | None = None) -> str | None:
    """Set ``OMP_NUM_THREADS`` (and torch's threads, if torch is loaded) to the quota's whole CPUs.

    Args:
        environ: the environment to read and set (default ``os.environ``).
        quota: the quota in CPUs (default :func:`quota_cores`).
    Returns:
        The line saying what was set and why, or None: ``OMP_NUM_THREADS`` was already set, no quota binds,
        or the quota is no smaller than torch's default thread count.
    """
    environ = os.environ if environ is None else environ
    if "OMP_NUM_THREADS" in environ:
        return None
    quota = quota_cores() if quota is None else quota
    default = torch_default_threads()
    threads = quota_threads(quota, default)
    if threads is None:
        return None
    environ["OMP_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):  # already loaded: the variable comes too late
        torch.set_num_threads(threads)
    cpus = f"{quota:g} CPU{'' if quota == 1 else 's'}"
    return (f"this process may use {cpus} (a cgroup CPU quota, as docker --cpus or a Kubernetes CPU limit sets): "
            f"torch runs {threads} thread{'s' if threads > 1 else ''}, not one per core ({default}), since a larger "
            f"team is held at every step once it spends the quota (OMP_NUM_THREADS overrides this)")


__all__ = ["quota_cores", "torch_default_threads", "quota_threads", "cap_threads_to_quota"]
