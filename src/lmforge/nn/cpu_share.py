"""Whether other processes hold the CPU cores torch's threads count on.

torch runs each operator's parallel region on a team of OpenMP threads, one per core by default, and
every region ends at a barrier.  When another process holds a core, the thread that lost it is
descheduled for a whole scheduler slice while the others wait at the barrier, at every operator: a
training step then runs several times slower than on the cores that are free
(``bench/bench_threads.py`` measures it).  Fewer threads than cores avoid that; what a user's machine has
free is measured here, once, at the start of a CPU run, from the kernel's counters (Linux ``/proc``;
elsewhere nothing is measured).

:func:`others_busy_cores` samples how many cores other processes kept busy over a short interval;
:func:`thread_advice` turns it into the line a run logs when torch's threads outnumber the free cores.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

#: a run is told to use fewer threads when other processes keep at least this much of a core busy
BUSY_ENOUGH = 0.5


def _cpu_ticks(stat: str) -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs from ``/proc/stat``'s first line."""
    fields = [int(x) for x in stat.splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest time is inside user)
    return total - idle, total


def _own_ticks(stat: str) -> int:
    """utime + stime of this process (every thread) from ``/proc/self/stat``."""
    after_name = stat.rsplit(")", 1)[1].split()
    return int(after_name[11]) + int(after_name[12])  # fields 14 and 15 of proc(5)


def _read(path: str) -> str:
    return Path(path).read_text()


def others_busy_cores(interval: float = 0.2, read: Callable[[str], str] = _read,
                      sleep: Callable[[float], None] = time.sleep) -> float | None:
    """Cores other processes kept busy over ``interval`` seconds (0 .. the core count), or None where the
    kernel's counters cannot be read (not Linux)."""
    try:
        busy0, total0 = _cpu_ticks(read("/proc/stat"))
        own0 = _own_ticks(read("/proc/self/stat"))
        sleep(interval)
        busy1, total1 = _cpu_ticks(read("/proc/stat"))
        own1 = _own_ticks(read("/proc/self/stat"))
    except (OSError, ValueError, IndexError):
        return None
    cores = os.cpu_count() or 1
    if total1 <= total0:
        return None
    share = max(0, (busy1 - busy0) - (own1 - own0)) / (total1 - total0)  # of all the machine's CPU time
    return min(float(cores), share * cores)


def thread_advice(threads: int, cores: int, others: float | None) -> str | None:
    """The line to log when other processes keep cores busy that ``threads`` torch threads count on, else None.

    Args:
        threads: torch's intra-op threads for this run.
        cores: the machine's logical CPUs.
        others: :func:`others_busy_cores`.
    """
    if others is None or threads <= 1 or others < BUSY_ENOUGH:
        return None
    free = max(1, int(cores - others + 0.5))
    if threads <= free:
        return None
    return (f"other processes keep {others:.1f} of the {cores} CPU cores busy, and torch's {threads} threads wait "
            f"on each other whenever one of them loses its core: this run would go faster on {free} "
            f"(start it with OMP_NUM_THREADS={free})")


def advise_threads(threads: int) -> str | None:
    """:func:`thread_advice` for this machine now; None where the user chose the threads (``OMP_NUM_THREADS``)."""
    if "OMP_NUM_THREADS" in os.environ or threads <= 1:
        return None
    return thread_advice(threads, os.cpu_count() or 1, others_busy_cores())
