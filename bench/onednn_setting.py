"""The benches' ``--onednn`` flag: run under the current ``LMFORGE_ONEDNN`` setting, or once under each.

lmforge's fp32 CPU linears may go through oneDNN's kernel, a private PyTorch operator: where it measured
faster on this machine (``LMFORGE_ONEDNN=auto``, the default), always (``1``) or never (``0``; see
:mod:`lmforge.nn.cpu_ops`).  ``--onednn both`` reruns the bench in a fresh process with it on and with it
off (the switch is read at import), so one command reports both.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

CHOICES = ("env", "auto", "on", "off", "both")
HELP = (
    "oneDNN linear kernel: env = as LMFORGE_ONEDNN says (auto unless it is set), auto = where it measures "
    "faster on this machine, on, off, or both = run the bench once with it on and once with it off"
)


def add_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--onednn", choices=CHOICES, default="env", help=HELP)


def apply(choice: str, script: str, argv: list[str], json_flag: str | None = None) -> int | None:
    """Set the switch for this process, or (``both``) run ``script`` once per setting and return its status.

    Returns None when the caller should go on with the bench in this process.  Call before importing lmforge.
    """
    if choice in ("auto", "on", "off"):
        os.environ["LMFORGE_ONEDNN"] = {"auto": "auto", "on": "1", "off": "0"}[choice]
        return None
    if choice == "env":
        return None
    rc = 0
    for value, label in (("1", "on"), ("0", "off")):
        args = _without_flag(argv, "--onednn")
        if json_flag is not None and json_flag in args:
            i = args.index(json_flag) + 1
            p = Path(args[i])
            args[i] = str(p.with_name(f"{p.stem}-onednn-{label}{p.suffix}"))
        print(f"\n== oneDNN linear {label} (LMFORGE_ONEDNN={value}) ==", flush=True)
        env = dict(os.environ, LMFORGE_ONEDNN=value)
        rc = subprocess.run([sys.executable, script, *args, "--onednn", "env"], env=env).returncode or rc
    return rc


def _without_flag(argv: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out
