"""torch's thread count: the cores, the container's CPU quota, and what other processes leave free.

A CPU quota.  ``docker run --cpus 2`` and a Kubernetes CPU limit do not hide any core: they give the process's
cgroup a quota of CPU time per scheduler period (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
``cpu.cfs_period_us``).  torch still starts one thread per physical core, its team spends the quota in a
fraction of each period, and then every thread is held until the next one; since every operator ends at
a barrier, the whole step waits.  A team no larger than the quota is never held.
:func:`quota_cores` reads the quota that binds this process (the smallest along its cgroup's path, v2 or
v1), :func:`cap_threads_to_quota` sets ``OMP_NUM_THREADS`` to :func:`quota_threads` of it when that is
fewer than the one thread per physical core torch would start: the quota's whole CPUs, or one thread more
when the quota's fraction pays for the time a team larger than the quota is held (see
:data:`THROTTLED_SHARE`).

A busy machine.  When another process holds a core, the thread that lost it is descheduled for a
scheduler slice while the rest of the team spins at the barrier, at every operator: two threads beside
one busy process run at a fraction of one thread's speed.  :class:`AutoThreads` runs one thread per core
the others leave free (never fewer than 1, never more than the quota's count), measured from the kernel's
counters (:func:`read_ticks`), and re-checks while a run trains (:meth:`AutoThreads.poll`), so a run whose
machine gets busy mid-way drops threads and takes them back once the cores are free again.

The ``lmforge`` command calls :func:`choose_threads` before any work, unless the user set ``OMP_NUM_THREADS``
(the user's choice wins, and nothing is measured); the library leaves the thread count alone unless
:func:`choose_threads` was called.  ``bench/bench_threads.py --quota`` and ``--contend`` measure both.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"
CPUINFO = "/proc/cpuinfo"
STAT = "/proc/stat"
SELF_STAT = "/proc/self/stat"
#: set beside ``OMP_NUM_THREADS`` to the same count when lmforge chose it (a quota), so that a command started
#: from this one tells lmforge's choice from the user's
AUTO_MARK = "LMFORGE_AUTO_THREADS"
#: seconds between two looks at the free cores while a run trains: a look reads two small ``/proc`` files
#: (``bench/bench_threads.py --check-cost`` times it), and the seconds between looks are the window it measures
RECHECK_S = 2.0
#: the shortest window the first look measures; it sleeps for the rest when the work starts sooner
FIRST_WINDOW_S = 0.2
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


def user_chose_threads(environ: dict | None = None) -> bool:
    """Whether ``OMP_NUM_THREADS`` holds the user's count (set, and not the one lmforge set, :data:`AUTO_MARK`)."""
    environ = os.environ if environ is None else environ
    return "OMP_NUM_THREADS" in environ and environ.get(AUTO_MARK) != environ["OMP_NUM_THREADS"]


def cap_threads_to_quota(environ: dict | None = None, quota: float | None = None) -> str | None:
    """Set ``OMP_NUM_THREADS`` (and torch's threads, if torch is loaded) to the quota's whole CPUs.

    Args:
        environ: the environment to read and set (default ``os.environ``).
        quota: the quota in CPUs (default :func:`quota_cores`).
    Returns:
        The line saying what was set and why, or None: the user set ``OMP_NUM_THREADS``, no quota binds,
        or the quota is no smaller than torch's default thread count.
    """
    environ = os.environ if environ is None else environ
    if user_chose_threads(environ):
        return None
    quota = quota_cores() if quota is None else quota
    default = torch_default_threads()
    threads = quota_threads(quota, default)
    if threads is None:
        return None
    environ["OMP_NUM_THREADS"] = environ[AUTO_MARK] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):  # already loaded: the variable comes too late
        torch.set_num_threads(threads)
    cpus = f"{quota:g} CPU{'' if quota == 1 else 's'}"
    return (f"this process may use {cpus} (a cgroup CPU quota, as docker --cpus or a Kubernetes CPU limit sets): "
            f"torch runs {threads} thread{'s' if threads > 1 else ''}, not one per core ({default}), since a larger "
            f"team is held at every step once it spends the quota (OMP_NUM_THREADS overrides this)")


# -- what other processes leave free ----------------------------------------------------------------------------
def _read(path: str) -> str:
    return Path(path).read_text()


def _clock() -> float:
    return time.monotonic()


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def _allowed_cpus() -> set[int] | None:
    """The CPUs this process may run on (``taskset``, ``docker --cpuset-cpus``), None where the OS does not say."""
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None


@dataclass(frozen=True)
class Ticks:
    """The kernel's CPU-time counters at one moment, in clock ticks (``USER_HZ``)."""

    busy: int  # ticks the CPUs this process may use spent working, for anyone (steal counts: a VM's host took them)
    total: int  # all their ticks, idle ones too
    own: int  # this process's ticks, every thread's, and its children's once reaped (data preparation's workers)
    cpus: int  # how many CPUs ``busy`` and ``total`` count


def read_ticks(cpus: set[int] | None = None) -> Ticks | None:
    """The counters of ``/proc/stat`` (the ``cpuN`` lines of ``cpus``, else the all-CPU line) and
    ``/proc/self/stat``; None where they cannot be read (not Linux).

    Why these counters and not ``/proc/loadavg``'s ``procs_running``: that is one instant's count of runnable
    threads, our own among them, which jumps with every operator's barrier; the tick counters add up the
    whole window between two readings, and this process's own ticks can be taken out exactly, so what is left
    is the CPU time everyone else used.  No sleep is needed while training: the window is the time between
    two looks.
    """
    try:
        rows = [line.split() for line in _read(STAT).splitlines() if line.startswith("cpu")]
        picked = [r for r in rows if r[0] != "cpu" and cpus is not None and int(r[0][3:]) in cpus]
        n = len(picked) if picked else (os.cpu_count() or 1)
        busy = total = 0
        for r in picked or [r for r in rows if r[0] == "cpu"]:
            v = [int(x) for x in r[1:9]]  # user nice system idle iowait irq softirq steal (guest is inside user)
            total += sum(v)
            busy += sum(v) - v[3] - (v[4] if len(v) > 4 else 0)
        after_name = _read(SELF_STAT).rsplit(")", 1)[1].split()
        own = sum(int(x) for x in after_name[11:15])  # utime, stime, cutime, cstime: fields 14-17 of proc(5)
    except (OSError, ValueError, IndexError):
        return None
    return Ticks(busy, total, own, n)


def others_between(before: Ticks, after: Ticks) -> float | None:
    """The cores other processes kept busy between two readings (0 .. ``cpus``); None if no tick passed."""
    total = after.total - before.total
    if total <= 0:
        return None
    others = max(0, (after.busy - before.busy) - (after.own - before.own))
    return min(float(after.cpus), others / total * after.cpus)


def others_busy_cores(interval: float = 0.2) -> float | None:
    """The cores other processes keep busy, measured over ``interval`` seconds; None where nothing can be read."""
    cpus = _allowed_cpus()
    before = read_ticks(cpus)
    _sleep(interval)
    after = read_ticks(cpus)
    return None if before is None or after is None else others_between(before, after)


def free_threads(ceiling: int, cpus: int, others: float | None) -> int:
    """One thread per CPU the others leave free, rounded to the nearest (others keeping more than half a core busy
    take that core), from 1 to ``ceiling``; ``ceiling`` where nothing was measured."""
    if others is None:
        return ceiling
    return max(1, min(ceiling, math.floor(cpus - others + 0.5)))


class AutoThreads:
    """The thread count lmforge chooses for this process: :meth:`settle` once the work starts, :meth:`poll` during it.

    Args:
        ceiling: never more threads: torch's default, or the quota's count (:func:`quota_threads`).
        every: seconds between the looks of :meth:`poll`.

    The first window runs from here to :meth:`settle` (the command's start-up, at least :data:`FIRST_WINDOW_S`).
    A change during the run needs two looks in a row to agree, so one burst of another process does not
    cost a thread pool rebuild.  Once anything else sets torch's threads (a caller's ``torch.set_num_threads``),
    the choice is theirs and :meth:`poll` stops.
    """

    def __init__(self, ceiling: int, every: float = RECHECK_S):
        self.ceiling = ceiling
        self.every = every
        self.threads: int | None = None  # the count last set; None before settle() and after someone else set one
        self.others: float | None = None  # the cores the others kept busy in the last window
        self.cpus = ceiling
        self._allowed = _allowed_cpus()
        self._pending: int | None = None
        self._mark, self._t = read_ticks(self._allowed), _clock()

    def _look(self) -> int:
        """The count for the window since the last look; the next window starts now."""
        now = read_ticks(self._allowed)
        self.others = None if now is None or self._mark is None else others_between(self._mark, now)
        self.cpus = now.cpus if now is not None else self.ceiling
        self._mark, self._t = now, _clock()
        return free_threads(self.ceiling, self.cpus, self.others)

    def _why(self) -> str:
        return f"other processes kept {self.others or 0:.1f} of the {self.cpus} CPUs busy"

    def settle(self) -> str | None:
        """Set torch's threads for the CPUs free since the start; the line to log when that is fewer than the
        ceiling, else None."""
        import torch  # loaded by the work that asks: the command line itself does not wait for torch

        wait = FIRST_WINDOW_S - (_clock() - self._t)
        if wait > 0:
            _sleep(wait)
        self.threads, self._pending = self._look(), None
        torch.set_num_threads(self.threads)
        if self.threads >= self.ceiling:
            return None
        plural = "s" if self.threads > 1 else ""
        return (f"{self._why()}: torch runs {self.threads} thread{plural}, one per free CPU, not {self.ceiling}, "
                f"re-checked every {self.every:g} s while training (OMP_NUM_THREADS overrides this)")

    def poll(self) -> str | None:
        """Between steps: every ``every`` seconds, count the free CPUs again; the line to log when the count
        changed, else None.  Between looks it only reads the clock."""
        if self.threads is None or _clock() - self._t < self.every:
            return None
        import torch

        if torch.get_num_threads() != self.threads:  # someone else set them: theirs from now on
            self.threads = None
            return None
        threads = self._look()
        if threads == self.threads or threads != self._pending:
            self._pending = None if threads == self.threads else threads
            return None
        before, self.threads, self._pending = self.threads, threads, None
        torch.set_num_threads(threads)
        return f"{self._why()}: torch now runs {threads} thread{'s' if threads > 1 else ''} (was {before})"


_AUTO: AutoThreads | None = None


def choose_threads(environ: dict | None = None) -> str | None:
    """What the ``lmforge`` command does before any work: cap ``OMP_NUM_THREADS`` to the quota
    (:func:`cap_threads_to_quota`) and start the count of free CPUs that :func:`auto_threads` hands to the work.
    Nothing when the user set ``OMP_NUM_THREADS``. Returns the quota's line, or None."""
    global _AUTO
    environ = os.environ if environ is None else environ
    _AUTO = None
    if user_chose_threads(environ):
        return None
    quota = quota_cores()
    line = cap_threads_to_quota(environ, quota)
    ceiling = ceiling_threads(quota)
    _AUTO = AutoThreads(ceiling) if ceiling > 1 else None  # one thread: nothing to choose
    return line


def hold_threads() -> str | None:
    """Settle lmforge's thread count once (the CPUs free now) and keep it for the rest of the process: for work
    whose figures must repeat (floating-point sums depend on the thread count), such as the demo's.  Nothing when
    the user's ``OMP_NUM_THREADS`` decides or there is one thread.  Returns the settle line to log, or None."""
    global _AUTO
    auto = auto_threads()
    if auto is None:
        return None
    _AUTO = None  # no re-check from here on: auto_threads() answers None
    return auto.settle()


def ceiling_threads(quota: float | None = None) -> int:
    """The most threads lmforge runs: one per physical core, no more than the CPUs this process may run on
    (``taskset``, ``docker --cpuset-cpus``), or the count of a smaller ``quota`` (default: the quota that binds
    this process)."""
    quota = quota_cores() if quota is None else quota
    allowed = _allowed_cpus()
    default = min(torch_default_threads(), len(allowed) if allowed else sys.maxsize)
    return quota_threads(quota, default) or default


def auto_threads() -> AutoThreads | None:
    """The count :func:`choose_threads` started, or None: not started, one thread, or the user's
    ``OMP_NUM_THREADS`` (set since) decides."""
    return None if user_chose_threads() else _AUTO


__all__ = ["quota_cores", "torch_default_threads", "quota_threads", "cap_threads_to_quota", "user_chose_threads",
           "read_ticks", "others_between", "others_busy_cores", "free_threads", "AutoThreads", "choose_threads",
           "hold_threads", "ceiling_threads",
           "auto_threads"]
