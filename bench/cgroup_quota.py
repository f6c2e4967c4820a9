"""A child cgroup with a CPU quota, for measuring (``bench_threads.py --quota``) and testing what a container's
``--cpus`` does to torch's threads.  Needs root and a writable cgroup mount (v1's cpu controller, or v2 with
``cpu`` in the root's ``cgroup.subtree_control``)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


@contextlib.contextmanager
def child_cgroup(cpus: float) -> Iterator[Path]:
    """Yield the ``cgroup.procs`` file of a new cgroup allowed ``cpus`` CPUs' worth of time per period; a
    process writes its pid there to join (``sh -c 'echo $$ > PROCS && exec ...'``).  The cgroup is removed
    afterwards.

    Raises:
        OSError: no cgroup can be made here (not root, a read-only mount, no cpu controller).
    """
    quota = max(1000, int(cpus * PERIOD_US))
    name = f"lmforge-quota-{uuid.uuid4().hex[:8]}"
    if (ROOT / "cpu" / "cpu.cfs_quota_us").is_file():  # v1
        folder = ROOT / "cpu" / name
        folder.mkdir()
        (folder / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (folder / "cpu.cfs_quota_us").write_text(str(quota))
    elif "cpu" in (ROOT / "cgroup.subtree_control").read_text().split():  # v2
        folder = ROOT / name
        folder.mkdir()
        (folder / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    else:
        raise OSError(f"no cpu controller to make a cgroup in under {ROOT}")
    try:
        yield folder / "cgroup.procs"
    finally:
        with contextlib.suppress(OSError):  # a process still inside keeps it; the kernel frees it when empty
            folder.rmdir()
