"""Other processes' share of the CPU, from the kernel's counters, and the advice a CPU run logs about threads."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

import pytest

from lmforge.nn import cpu_share
from lmforge.nn.cpu_share import others_busy_cores, thread_advice


def _stat(user: int, idle: int) -> str:
    return f"cpu  {user} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n"


def _self(utime: int, stime: int) -> str:  # proc(5): pid (comm) state, then fields 4.. ; utime is 14, stime 15
    return "1234 (python (x) y) R " + " ".join(["0"] * 10) + f" {utime} {stime} " + " ".join(["0"] * 30)


def _reader(snapshots: list[dict[str, str]]):
    calls = {"n": 0}

    def read(path: str) -> str:
        snap = snapshots[0] if calls["n"] < 2 else snapshots[1]
        calls["n"] += 1
        return snap[path]

    return read


def test_others_busy_cores_counts_everyone_but_this_process(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    # 400 ticks of machine time pass; 250 are busy, 50 of them this process's: others kept 200/400 of 4 cores = 2
    before = {"/proc/stat": _stat(1000, 5000), "/proc/self/stat": _self(10, 5)}
    after = {"/proc/stat": _stat(1250, 5150), "/proc/self/stat": _self(50, 15)}
    got = others_busy_cores(read=_reader([before, after]), sleep=lambda s: None)
    assert got == pytest.approx(2.0)
    # no time passed, or unreadable counters: no figure
    assert others_busy_cores(read=_reader([before, before]), sleep=lambda s: None) is None

    def broken(path):
        raise OSError("no /proc here")

    assert others_busy_cores(read=broken, sleep=lambda s: None) is None


def test_thread_advice_names_the_free_cores_only_when_threads_outnumber_them():
    line = thread_advice(2, 2, 1.0)
    assert "OMP_NUM_THREADS=1" in line and "1.0 of the 2" in line and "\n" not in line
    assert "OMP_NUM_THREADS=6" in thread_advice(8, 8, 2.2)
    assert thread_advice(2, 2, 0.3) is None  # a little background work: not worth fewer threads
    assert thread_advice(1, 2, 1.5) is None  # one thread has nobody to wait for
    assert thread_advice(4, 8, 3.0) is None  # enough free cores for the threads
    assert thread_advice(2, 2, None) is None  # nothing measured (not Linux)


def test_the_user_s_own_thread_count_is_never_second_guessed(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setattr(cpu_share, "others_busy_cores", lambda: pytest.fail("sampled although the user chose"))
    assert cpu_share.advise_threads(2) is None


def _spin(stop):
    while not stop.is_set():
        sum(range(10_000))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_spinning_process_is_seen_as_a_busy_core():
    stop = mp.Event()
    p = mp.Process(target=_spin, args=(stop,), daemon=True)
    p.start()
    try:
        time.sleep(0.3)
        busy = others_busy_cores(interval=0.5)
    finally:
        stop.set()
        p.join()
    assert busy is not None and busy >= 0.5, busy
