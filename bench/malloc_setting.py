"""The benches' ``--malloc`` flag: glibc's allocator as it comes, or keeping freed memory as ``lmforge`` does.

Both models of a bench share one process, so both run under the same setting; ``keep`` is what the
``lmforge`` command sets for itself (:mod:`lmforge.malloc`), ``system`` what a plain Python program gets.
"""

from __future__ import annotations

import argparse

from lmforge.malloc import environment_choice, keep_freed_memory

HELP = ("system: glibc's allocator as it comes (fresh pages for every block over 32 MiB); keep: keep freed memory "
        "for the next allocations, as the lmforge command does")


def add_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--malloc", choices=("system", "keep"), default="system", help=HELP)


def apply(choice: str) -> str:
    """Set this process's allocator as ``choice`` says; returns the setting in words (printed, recorded)."""
    if choice == "keep":
        return keep_freed_memory()
    return environment_choice() or "glibc's defaults"
