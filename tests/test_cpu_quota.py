"""torch's threads sized to a cgroup CPU quota: the quota read from v2 and v1 files (the smallest along the
cgroup's path), the thread count rounded down, the user's OMP_NUM_THREADS respected, the command applying it
before its work, and a real quota on this machine where the test may make one.  Then the CPUs other processes
leave free: the kernel's counters read from a fake /proc, the count chosen from them, its re-checks on a fake
clock as the machine gets busy and free again, and a real busy process seen on this machine."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import subprocess
import sys
import time
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
    monkeypatch.setattr(Q, "_AUTO", None)  # the count the command starts stays in this test
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
        os.environ.pop(Q.AUTO_MARK, None)
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


# -- the CPUs other processes leave free -------------------------------------------------------------------------
HZ = 100  # the kernel's USER_HZ: clock ticks per second in /proc/stat and /proc/self/stat


class FakeMachine:
    """A /proc/stat and /proc/self/stat whose counters run on a fake clock: other processes wanting ``others``
    CPUs and this one ``own``, spread evenly over ``cpus`` CPUs and shared in proportion when they want more
    (plus ``extra`` CPUs this process may not run on, kept fully busy)."""

    def __init__(self, cpus: int = 2, extra: int = 0):
        self.cpus, self.extra = cpus, extra
        self.now, self.others, self.own = 1000.0, 0.0, 0.0
        self.busy = [0.0] * (cpus + extra)
        self.idle = [0.0] * (cpus + extra)
        self.own_ticks = 0.0
        self.reads = 0

    def advance(self, seconds: float) -> None:
        self.now += seconds
        used = min(self.cpus, self.others + self.own) / self.cpus  # each allowed CPU's busy share
        for i in range(self.cpus + self.extra):
            share = used if i < self.cpus else 1.0
            self.busy[i] += share * seconds * HZ
            self.idle[i] += (1 - share) * seconds * HZ
        scale = min(1.0, self.cpus / max(self.others + self.own, 1e-9))  # more demand than CPUs: shared in proportion
        self.own_ticks += self.own * scale * seconds * HZ

    def read(self, path: str) -> str:
        self.reads += 1
        if path == Q.SELF_STAT:  # proc(5): pid (comm) state, then fields 4..; utime 14, stime 15, children's 16, 17
            own = int(self.own_ticks)
            return f"4242 (py (x) y) R {' '.join(['0'] * 10)} {own // 2} 0 {own - own // 2} 0 {' '.join(['0'] * 30)}"
        assert path == Q.STAT, path
        line = "{} {} 0 {} {} 0 0 0 0 0 0"  # name user nice system idle iowait irq softirq steal guest guest_nice
        rows = [line.format(f"cpu{i}", int(b) // 2, int(b) - int(b) // 2, int(d)) for i, (b, d) in
                enumerate(zip(self.busy, self.idle))]
        return "\n".join([line.format("cpu ", int(sum(self.busy)), 0, int(sum(self.idle))), *rows, "intr 1 2 3"])


@pytest.fixture
def machine(monkeypatch):
    fake = FakeMachine()
    monkeypatch.setattr(Q, "_read", fake.read)
    monkeypatch.setattr(Q, "_clock", lambda: fake.now)
    monkeypatch.setattr(Q, "_sleep", fake.advance)
    monkeypatch.setattr(Q, "_allowed_cpus", lambda: set(range(fake.cpus)))
    return fake


def test_the_counters_count_the_allowed_cpus_and_take_this_process_out(machine):
    machine.extra = 2  # two CPUs this process may not use, always busy: they must not count
    machine.busy += [0.0, 0.0]
    machine.idle += [0.0, 0.0]
    before = Q.read_ticks({0, 1})
    machine.others, machine.own = 0.5, 1.0
    machine.advance(3.0)
    after = Q.read_ticks({0, 1})
    assert after.cpus == 2 and after.total - before.total == 2 * 3 * HZ
    assert after.own - before.own == 3 * HZ
    assert Q.others_between(before, after) == pytest.approx(0.5, abs=0.02)
    assert Q.others_between(before, before) is None  # no tick passed: nothing measured
    # without the affinity (not Linux's API): the all-CPU line, over every CPU the machine has
    whole = Q.read_ticks(None)
    assert whole.cpus == (os.cpu_count() or 1) and whole.total == sum(int(b) + int(d) for b, d in
                                                                       zip(machine.busy, machine.idle))


def test_unreadable_counters_mean_nothing_measured(monkeypatch):
    def absent(path):
        raise OSError("no /proc here")

    monkeypatch.setattr(Q, "_read", absent)
    monkeypatch.setattr(Q, "_sleep", lambda s: None)
    assert Q.read_ticks({0}) is None and Q.others_busy_cores() is None
    monkeypatch.setattr(Q, "_read", lambda path: "cpu  not numbers\n")
    assert Q.read_ticks({0}) is None


@pytest.mark.parametrize(("ceiling", "cpus", "others", "threads"), [
    (2, 2, 0.0, 2), (2, 2, 0.3, 2), (2, 2, 0.67, 1), (2, 2, 1.0, 1), (2, 2, 2.0, 1), (2, 2, None, 2),
    (8, 8, 2.2, 6), (4, 8, 3.0, 4), (2, 4, 1.0, 2), (1, 2, 0.0, 1), (3, 16, 15.9, 1)])
def test_one_thread_per_free_cpu_between_one_and_the_ceiling(ceiling, cpus, others, threads):
    assert Q.free_threads(ceiling, cpus, others) == threads


def test_the_count_follows_the_machine_busy_and_free_again(machine):
    auto = Q.AutoThreads(ceiling=2, every=2.0)
    machine.own = 1.0  # the command's start-up: one thread importing and building
    machine.advance(1.5)
    assert auto.settle() is None and auto.threads == 2 and torch.get_num_threads() == 2  # quiet: every core

    def train(seconds: float) -> list[str | None]:
        lines = []
        for _ in range(int(seconds / 0.5)):  # a step each half second
            machine.own = auto.threads
            machine.advance(0.5)
            lines.append(auto.poll())
        return lines

    reads = machine.reads
    machine.own = 2.0
    machine.advance(0.5)
    assert auto.poll() is None and machine.reads == reads  # between looks: the clock only
    machine.others = 1.0  # another process takes a core: our 2 threads and it share 2 CPUs, a third each
    lines = train(4.0)
    assert auto.threads == 1 and torch.get_num_threads() == 1
    changed = [line for line in lines if line]
    assert len(changed) == 1 and "torch now runs 1 thread (was 2)" in changed[0]
    assert lines.index(changed[0]) >= 5  # two looks agreed, 2 s apart: a single busy look changes nothing
    assert train(6.0) == [None] * 12  # still busy: stays at 1
    machine.others = 0.0  # the other process ends
    lines = train(5.0)
    assert auto.threads == 2 and torch.get_num_threads() == 2 and sum(1 for line in lines if line) == 1


def test_a_burst_shorter_than_two_looks_changes_nothing(machine):
    auto = Q.AutoThreads(ceiling=2, every=2.0)
    machine.advance(1.0)
    auto.settle()
    machine.own = 2.0
    for others in (0.0, 1.0, 0.0, 1.0, 0.0):  # busy in every other window
        machine.others = others
        machine.advance(2.0)
        assert auto.poll() is None
    assert auto.threads == 2


def test_a_busy_start_runs_fewer_threads_and_says_why(machine):
    auto = Q.AutoThreads(ceiling=2)
    machine.others, machine.own = 1.0, 1.0
    machine.advance(0.05)  # work that starts sooner than the first window: it is waited for
    line = auto.settle()
    assert machine.now - 1000.0 == pytest.approx(Q.FIRST_WINDOW_S)
    assert auto.threads == 1 and torch.get_num_threads() == 1
    assert "kept 1.0 of the 2 CPUs busy" in line and "torch runs 1 thread, one per free CPU, not 2" in line


def test_threads_someone_else_sets_are_theirs(machine):
    auto = Q.AutoThreads(ceiling=2, every=1.0)
    machine.others = 1.0
    machine.advance(1.0)
    auto.settle()
    torch.set_num_threads(2)  # a caller's own choice
    machine.others = 0.0
    for _ in range(4):
        machine.advance(1.0)
        assert auto.poll() is None
    assert auto.threads is None and torch.get_num_threads() == 2


def test_the_user_s_threads_win_over_the_automatic_count(machine, monkeypatch):
    monkeypatch.setattr(Q, "_AUTO", None)
    monkeypatch.setattr(Q, "quota_cores", lambda: None)
    monkeypatch.setattr(Q, "torch_default_threads", lambda: 2)
    env = {"OMP_NUM_THREADS": "2"}
    assert Q.choose_threads(env) is None and Q._AUTO is None and env == {"OMP_NUM_THREADS": "2"}
    env = {}
    assert Q.choose_threads(env) is None and Q._AUTO.ceiling == 2 and env == {}
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert Q.auto_threads() is Q._AUTO
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # set since: the user's
    assert Q.auto_threads() is None
    # a quota's count is lmforge's, and a command started from this one still chooses
    monkeypatch.setattr(Q, "_allowed_cpus", lambda: set(range(8)))
    monkeypatch.setattr(Q, "quota_cores", lambda: 1.0)
    monkeypatch.setattr(Q, "torch_default_threads", lambda: 4)
    env = {}
    assert "may use 1 CPU" in Q.choose_threads(env) and env == {"OMP_NUM_THREADS": "1", Q.AUTO_MARK: "1"}
    assert Q.user_chose_threads(env) is False and Q._AUTO is None  # one thread: nothing to choose
    monkeypatch.setattr(Q, "quota_cores", lambda: 3.0)
    env = {"OMP_NUM_THREADS": "1", Q.AUTO_MARK: "1"}
    Q.choose_threads(env)
    assert env["OMP_NUM_THREADS"] == "3" and Q._AUTO.ceiling == 3
    monkeypatch.setattr(Q, "quota_cores", lambda: None)
    monkeypatch.setattr(Q, "_allowed_cpus", lambda: {0, 1, 2})  # taskset -c 0-2 on the 4 cores
    assert Q.ceiling_threads() == 3


def test_the_trainer_settles_and_rechecks_the_count(machine, monkeypatch, tmp_path, caplog):
    from lmforge.families.gpt.model import GPTConfig, GPTLMHeadModel
    from lmforge.train.config import TrainConfig
    from lmforge.train.trainer import Trainer

    class Rows:
        def batch(self, rngs, split):
            ids = torch.tensor([[int(r.integers(0, 50)) for _ in range(8)] for r in rngs])
            return {"input_ids": ids, "labels": ids}

    auto = Q.AutoThreads(ceiling=2, every=1.0)
    monkeypatch.setattr(Q, "_AUTO", auto)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    machine.others, machine.own = 1.0, 1.0  # busy from the start
    machine.advance(1.0)
    real_step = Trainer._train_step

    def step(self):  # each step takes a second of the fake clock; the other process ends after 4
        machine.advance(1.0)
        machine.others = 1.0 if self.step < 4 else 0.0
        return real_step(self)

    monkeypatch.setattr(Trainer, "_train_step", step)
    torch.manual_seed(0)
    model = GPTLMHeadModel(GPTConfig(vocab_size=50, n_positions=8, n_embd=16, n_layer=1, n_head=2))
    config = TrainConfig(max_steps=10, batch_size=2, log_every=5, eval_every=0, save_every=0, device="cpu",
                         precision="fp32", seed=0)
    with caplog.at_level(logging.INFO, logger="lmforge"):
        trainer = Trainer(model, Rows(), config, tmp_path / "run", plot=False, progress=False)
        assert trainer.threads is auto and torch.get_num_threads() == 1
        trainer.train()
    assert torch.get_num_threads() == 2
    said = [r.getMessage() for r in caplog.records if "thread" in r.getMessage()]
    assert "torch runs 1 thread, one per free CPU" in said[0] and "torch now runs 2 threads (was 1)" in said[-1]


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
        busy = Q.others_busy_cores(interval=0.5)
    finally:
        stop.set()
        p.join()
    assert busy is not None and busy >= 0.5, busy


def test_hold_threads_settles_once_and_stops_following_the_load(machine, monkeypatch):
    """The demo holds one thread count (its figures repeat only at one count): settled on the CPUs free at its
    start, not changed when the other process ends."""
    auto = Q.AutoThreads(ceiling=2, every=1.0)
    monkeypatch.setattr(Q, "_AUTO", auto)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        machine.others, machine.own = 1.0, 1.0  # one of the two CPUs busy at the start
        machine.advance(1.0)
        line = Q.hold_threads()
        assert "torch runs 1 thread" in line and torch.get_num_threads() == 1
        machine.others = 0.0
        machine.advance(4.0)
        assert Q.auto_threads() is None  # what the Trainer asks for its re-checks: none from here on
        assert torch.get_num_threads() == 1
        assert Q.hold_threads() is None  # once held, a second call changes nothing
        monkeypatch.setattr(Q, "_AUTO", None)
        assert Q.hold_threads() is None  # the user's OMP_NUM_THREADS (or one thread): nothing to hold
    finally:
        torch.set_num_threads(before)
