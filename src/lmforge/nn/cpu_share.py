"""Whether other processes hold the CPU cores torch's threads count on.

torch runs each operator's parallel region on a team of OpenMP threads, one per core by default, and
every region ends at a barrier.  When another process holds a core, the thread that lost it is
descheduled for a whole scheduler slice while the others wait at the barrier, at every operator: a
training step then runs several times slower than on the cores that are free
(``bench/bench_threads.py`` measures it).  Fewer threads than cores avoid that; what a user's machine has
free is measured here, once, at the start of a CPU run, from the kernel's counters (Linux ``/proc``;
elsewhere nothing is measured).

:func:`lmforge.cpu_quota.others_busy_cores` samples how many cores other processes kept busy over a short
interval; :func:`thread_advice` turns it into the line a run logs when torch's threads outnumber the free cores
and nothing chose them for it (the ``lmforge`` command does: :class:`lmforge.cpu_quota.AutoThreads`).
"""

from __future__ import annotations

import os

from ..cpu_quota import others_busy_cores

#: a run is told to use fewer threads when other processes keep at least this much of a core busy
BUSY_ENOUGH = 0.5


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
