"""torch's threads sized to a cgroup CPU quota: the quota read from v2 and v1 files (the smallest along the
cgroup's path), the thread count rounded down, the user's OMP_NUM_THREADS respected, the command applying it
before its work, and a real quota on this machine where the test may make one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lmforge import cpu_quota as Q
from lmforge.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from cgroup_quota import child_cgroup  # noqa: E402  (bench/'s helper, which bench_threads.py --quota uses)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v2_cpu_max_gives_the_smallest_quota_along_the_path(tmp_path):
    proc = tmp_path / "cgroup"
    write(proc, "0::/kubepods/pod1/app\n")
    write(tmp_path / "fs/kubepods/cpu.max", "max 100000\n")
    write(tmp_path / "fs/kubepods/pod1/cpu.max", "250000 100000\n")
    write(tmp_path / "fs/kubepods/pod1/app/cpu.max", "400000 100000\n")
    assert Q.quota_cores(str(tmp_path / "fs"), str(proc)) == 2.5
    write(tmp_path / "fs/kubepods/pod1/cpu.max", "max 100000\n")
    assert Q.quota_cores(str(tmp_path / "fs"), str(proc)) == 4.0
    write(tmp_path / "fs/kubepods/pod1/app/cpu.max", "max 100000\n")
    assert Q.quota_cores(str(tmp_path / "fs"), str(proc)) is None


def test_v2_inside_a_container_reads_the_root_of_its_own_mount(tmp_path):
    proc = tmp_path / "cgroup"
    write(proc, "0::/system.slice/docker-abc.scope\n")  # the host's path, which the container's mount lacks
    write(tmp_path / "fs/cpu.max", "150000 100000\n")
    assert Q.quota_cores(str(tmp_path / "fs"), str(proc)) == 1.5


def test_v1_cfs_quota_over_period(tmp_path):
    proc = tmp_path / "cgroup"
    write(proc, "12:memory:/docker/abc\n5:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n")
    write(tmp_path / "fs/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "150000\n")
    write(tmp_path / "fs/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert Q.quota_cores(str(tmp_path / "fs"), str(proc)) == 1.5
    write(tmp_path / "fs/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n")
    assert Q.quota_cores(str(tmp_path / "fs"), str(proc)) is None


@pytest.mark.parametrize("content", ["", "garbage\n", "0::/x\n"])
def test_missing_or_malformed_files_mean_no_quota(tmp_path, content):
    proc = tmp_path / "cgroup"
    write(proc, content)
    write(tmp_path / "fs/x/cpu.max", "not numbers\n")
    assert Q.quota_cores(str(tmp_path / "fs"), str(proc)) is None
    assert Q.quota_cores(str(tmp_path / "fs"), str(tmp_path / "absent")) is None


@pytest.mark.parametrize(("quota", "default", "threads"), [
    (0.5, 8, 1), (1.0, 8, 1), (1.25, 8, 1), (1.5, 8, 2), (1.75, 8, 2), (2.5, 8, 2), (2.6, 8, 3), (3.9, 8, 4),
    (4.9, 16, 4), (7.99, 16, 7), (1.5, 2, None), (8.0, 8, None), (16.0, 8, None), (None, 8, None), (1.0, 1, None)])
def test_threads_are_the_quotas_whole_cpus_or_one_more_and_only_cap(quota, default, threads):
    assert Q.quota_threads(quota, default) == threads


def test_torch_default_counts_physical_cores_once(tmp_path):
    def cpu(n, phys, core):
        return f"processor\t: {n}\nphysical id\t: {phys}\ncore id\t\t: {core}\nflags\t\t: avx2\n"

    info = tmp_path / "cpuinfo"
    info.write_text("\n".join(cpu(n, n // 4, n % 2) for n in range(8)))  # 2 sockets x 2 cores x 2 hyperthreads
    assert Q.torch_default_threads(str(info)) == 4
    info.write_text("processor\t: 0\nflags\t\t: neon\n\nprocessor\t: 1\n")  # no core ids: one per CPU
    assert Q.torch_default_threads(str(info)) == (os.cpu_count() or 1)
    assert Q.torch_default_threads(str(tmp_path / "absent")) == (os.cpu_count() or 1)


def test_the_users_thread_count_wins_and_no_quota_changes_nothing(monkeypatch):
    monkeypatch.setattr(Q, "torch_default_threads", lambda: 8)
    env = {"OMP_NUM_THREADS": "6"}
    assert Q.cap_threads_to_quota(env, quota=2.0) is None and env == {"OMP_NUM_THREADS": "6"}
    env = {}
    monkeypatch.setattr(Q, "quota_cores", lambda: None)
    assert Q.cap_threads_to_quota(env) is None and env == {}


def test_the_command_caps_torch_before_its_work(monkeypatch, capsys):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(Q, "quota_cores", lambda: 1.2)
    monkeypatch.setattr(Q, "torch_default_threads", lambda: 8)
    try:
        rc = main(["predict", "/nonexistent/run", "--text", "a text"])  # fails after the cap, before any model
        assert rc == 2
        assert os.environ["OMP_NUM_THREADS"] == "1" and torch.get_num_threads() == 1
        err = capsys.readouterr().err
        assert "may use 1.2 CPUs" in err and "torch runs 1 thread, not one per core (8)" in err
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)
        torch.set_num_threads(before)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux's")
def test_a_real_quota_reaches_torch(tmp_path):
    if Q.torch_default_threads() < 2:
        pytest.skip("one core: torch's default of one thread is already no larger than any quota")
    code = ("from lmforge.cpu_quota import cap_threads_to_quota, quota_cores; q = quota_cores(); "
            "line = cap_threads_to_quota(); import torch; print(q, torch.get_num_threads()); print(line)")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    try:
        with child_cgroup(1.0) as procs:  # one CPU's worth of time
            out = subprocess.run(["sh", "-c", f'echo $$ > "{procs}" && exec "{sys.executable}" -c "{code}"'],
                                 env=env, capture_output=True, text=True, timeout=120)
    except OSError as e:
        pytest.skip(f"cannot make a cgroup here ({e}): needs root and a writable cgroup mount")
    assert out.returncode == 0, out.stderr[-2000:]
    first, line = out.stdout.splitlines()[:2]
    assert first == "1.0 1", out.stdout
    assert "may use 1 CPU (" in line and "torch runs 1 thread, not one per core" in line
