"""The lmforge command keeps freed memory for reuse (lmforge/malloc.py): fewer page faults, same results."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from lmforge import malloc

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

# allocates and fills a 64 MiB tensor 34 times; prints the minor page faults of the last 32 rounds. The heap may grow
# to hold a few such blocks before it settles, and small allocations between rounds shift it, so a handful of rounds
# (at most 4 of 32 in 30 runs on the machine that wrote this) still land on fresh pages; the rest reuse them
PROBE = textwrap.dedent("""
    import resource, sys, torch
    from lmforge.malloc import keep_freed_memory
    print(keep_freed_memory(), file=sys.stderr)
    torch.ones(16 << 20).sum()
    torch.ones(16 << 20).sum()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(32):
        torch.ones(16 << 20).sum()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _faults(**env: str) -> tuple[int, str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("LMFORGE_MALLOC", "GLIBC_TUNABLES", "LD_PRELOAD") and not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PROBE], env=clean | env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip()), out.stderr.strip()


@pytest.mark.skipif(not GLIBC, reason="mallopt's thresholds are glibc's")
def test_kept_memory_is_reused_without_page_faults():
    kept, said = _faults()
    system, said_system = _faults(LMFORGE_MALLOC="system")
    assert said.startswith("glibc, keeping freed memory"), said
    if "mmap threshold 1024 MiB" not in said:
        pytest.skip(f"this glibc keeps blocks up to 32 MiB only, below the probe's 64 MiB: {said}")
    assert said_system == "glibc's defaults (LMFORGE_MALLOC=system)"
    # glibc's defaults map 32 fresh 64 MiB blocks, each faulted in page by page: 32 x 16,384 faults of 4 KiB
    # (at least 32 x 32 where transparent huge pages fault 2 MiB at a time); kept memory is mostly reused
    assert system >= 32 * 32, system
    assert kept < system / 3, (kept, system)


@pytest.mark.parametrize("env, said", [
    ({"LMFORGE_MALLOC": "system"}, "glibc's defaults (LMFORGE_MALLOC=system)"),
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "jemalloc (LD_PRELOAD)"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}, "glibc, as the environment tunes it"),
    ({"MALLOC_MMAP_THRESHOLD_": "65536"}, "glibc, as the environment tunes it"),
    ({"LMFORGE_MALLOC": "keep"}, None),
    ({}, None),
])
def test_the_environment_decides_first(monkeypatch, env, said):
    for k in ("LMFORGE_MALLOC", "LD_PRELOAD", "GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert malloc.environment_choice() == said
    if said is not None:
        assert malloc.keep_freed_memory() == said  # and mallopt is not called


def test_an_unknown_setting_is_one_line(tmp_path, capsys, monkeypatch):
    from lmforge import cli

    monkeypatch.setenv("LMFORGE_MALLOC", "off")
    text = tmp_path / "a.txt"
    text.write_text("one line of text\n", encoding="utf-8")
    rc = cli.main(["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "60", "--out", str(tmp_path / "tok"),
                   str(text)])
    err = capsys.readouterr().err
    assert rc == 2 and "LMFORGE_MALLOC='off': use keep" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "tok").exists()  # refused before any work


def test_the_command_sets_it_before_the_work(monkeypatch, tmp_path, capsys):
    from lmforge import cli

    calls = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: calls.append("malloc") or "kept")
    text = tmp_path / "a.txt"
    text.write_text("one line of text\n", encoding="utf-8")
    monkeypatch.setattr(cli, "check_args", lambda args: calls.append("command"))
    assert cli.main(["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "60", "--out",
                     str(tmp_path / "tok"), str(text)]) == 0
    assert calls == ["malloc", "command"]
