"""The benches' ``--threads``: one count for both sides of a ratio, by default the one the ``lmforge`` command runs.

``torch.set_num_threads`` sizes the one intra-op team of the process, so lmforge's model and the reference
(``transformers``) in one bench run on the same count.  Nothing in lmforge changes it while a bench runs: only
the ``lmforge`` command starts the automatic count (:func:`lmforge.cpu_quota.choose_threads`), and no bench
calls it; :func:`check` makes sure at the end.  Left unset, ``--threads`` is what the command would choose
now (:class:`lmforge.cpu_quota.AutoThreads`): on a busy machine both sides then run on the free cores, not
two threads fighting for one.
"""

from __future__ import annotations

import argparse

import torch

from lmforge.cpu_quota import AutoThreads, ceiling_threads, user_chose_threads

HELP = ("torch threads for both sides (default: what the lmforge command chooses now, one per CPU other processes "
        "leave free; OMP_NUM_THREADS when set)")


def add_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--threads", type=int, default=None, help=HELP)


def apply(threads: int | None) -> tuple[int, str]:
    """Set torch's threads to ``threads``, or choose them as the command would; returns the count and the line
    saying where it came from (printed, recorded)."""
    if threads is not None:
        why = "--threads"
    elif user_chose_threads():
        threads, why = torch.get_num_threads(), "OMP_NUM_THREADS"
    else:
        auto = AutoThreads(ceiling_threads())
        line = auto.settle()
        threads = int(auto.threads or 1)
        why = "lmforge's choice" + (f": {line.split(':')[0]}" if line else ", every core free")
    torch.set_num_threads(threads)
    return threads, f"{threads} torch thread{'s' if threads > 1 else ''} for both sides ({why})"


def check(threads: int) -> None:
    """Stop with a message if the thread count changed while the bench ran: its ratios would compare unlike."""
    if torch.get_num_threads() != threads:
        raise SystemExit(f"torch's thread count changed from {threads} to {torch.get_num_threads()} during the bench")
