"""The advice a CPU run logs about threads when other processes hold cores (tests/test_cpu_quota.py tests the
measurement)."""

from __future__ import annotations

import pytest

from lmforge.nn import cpu_share
from lmforge.nn.cpu_share import thread_advice


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
