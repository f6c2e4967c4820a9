"""Stopping a command from outside (issue 50, item 8): SIGTERM unwinds it as Ctrl-C does (its lock released, its
worker processes ended, exit status 143 with one line), and a SIGKILL leaves no worker waiting forever.

``prepare --workers 2`` runs in a child process whose chunk encoder is slowed down, so that the signal arrives
while its workers are busy; a caller reading the child's output must see the pipe close.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmforge.cli import main

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

SLOW_PREPARE = """
import signal, sys, time
# Ctrl-C's handler as in a terminal: a child inherits an ignored SIGINT from its parent (a background job, or a
# test process that ignored it), and Python keeps it ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
import lmforge.data.chunks as chunks
import lmforge.data.shards as shards
shards.CHUNK_CHARS = 500  # a chunk a document or so: ~40 chunks, so the pool runs
real = chunks.encode_chunk
def slow(*args, **kwargs):
    time.sleep(2.0)  # ~40 s of work: far longer than the wait before the signal, even on a busy machine
    return real(*args, **kwargs)
chunks.encode_chunk = slow  # the forked workers inherit it
from lmforge.cli import main
sys.exit(main(sys.argv[1:]))
"""


def children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(c) for c in (task / "children").read_text().split()]
    return kids


def running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may never reap an orphan)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def start_prepare(tmp_path: Path, corpus: Path, tokenizer: Path) -> tuple[subprocess.Popen, list[int]]:
    """The slowed-down ``prepare --workers 2`` in a child process, once its two workers run; (process, workers)."""
    argv = ["prepare", "--tokenizer", tokenizer, "--out", tmp_path / "shards", "--workers", "2", corpus]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_PREPARE, *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while len(workers := children(proc.pid)) < 2:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.05)
    time.sleep(1.0)  # the workers are busy with chunks now
    return proc, workers


def locks(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".lock") or p.name == "lock"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_prepare_ends_its_workers_and_releases_its_lock(tmp_path, tiny_corpus, wordpiece_tokenizer_dir,
                                                                   sig):
    """Before: SIGTERM ended prepare at once (exit 143, no line) and left its lock and two workers blocked."""
    proc, workers = start_prepare(tmp_path, tiny_corpus, wordpiece_tokenizer_dir)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)  # returns only once every holder of the pipe is gone
    assert proc.returncode == (143 if sig == signal.SIGTERM else 130), err
    assert "Traceback" not in err and err.strip().splitlines()[-1].endswith(
        "terminated" if sig == signal.SIGTERM else "interrupted"), err
    assert not [w for w in workers if running(w)]
    assert not locks(tmp_path) and not (tmp_path / "shards").exists()


def test_a_killed_prepare_leaves_no_worker_behind(tmp_path, tiny_corpus, wordpiece_tokenizer_dir, capsys):
    """Before: SIGKILL orphaned the workers, blocked forever on their queue, and a caller reading the pipe hung."""
    proc, workers = start_prepare(tmp_path, tiny_corpus, wordpiece_tokenizer_dir)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while [w for w in workers if running(w)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [w for w in workers if running(w)]
    # the lock of the killed run is taken over, and the shards are written whole
    assert main(["-q", "prepare", "--tokenizer", str(wordpiece_tokenizer_dir), "--out", str(tmp_path / "shards"),
                 str(tiny_corpus)]) == 0
    assert (tmp_path / "shards" / "meta.json").is_file()


def test_sigterm_in_process_is_a_clean_exit(tmp_path, tiny_corpus, wordpiece_tokenizer_dir, capsys, monkeypatch):
    """The handler turns SIGTERM into an exception that every ``finally`` sees, and puts the old handler back."""
    import lmforge.data.shards as shards_mod

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
        raise AssertionError("SIGTERM was not handled")

    monkeypatch.setattr(shards_mod, "_encode_into", terminated)
    before = signal.getsignal(signal.SIGTERM)
    rc = main(["prepare", "--tokenizer", str(wordpiece_tokenizer_dir), "--out", str(tmp_path / "s"), str(tiny_corpus)])
    assert rc == 143 and "terminated" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before
    assert not locks(tmp_path) and not (tmp_path / "s").exists()


def test_sigterm_while_the_command_loads_is_a_clean_exit(tmp_path, tiny_corpus, wordpiece_tokenizer_dir):
    """Before the handler was installed first, a SIGTERM during the imports ended the process silently (-15)."""
    script = "import os, signal, sys\nimport lmforge.cli as cli\n" \
             "real = cli.build_parser\n" \
             "def slow(*a, **k):\n    os.kill(os.getpid(), signal.SIGTERM)\n    return real(*a, **k)\n" \
             "cli.build_parser = slow\nsys.exit(cli.main(sys.argv[1:]))\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", script, "prepare", "--tokenizer", str(wordpiece_tokenizer_dir),
                           "--out", str(tmp_path / "s"), str(tiny_corpus)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 143 and proc.stderr.strip() == "lmforge: terminated", proc.stderr
    assert not (tmp_path / "s").exists()
