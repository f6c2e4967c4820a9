"""Argument groups that more than one command adds: each function adds one coherent set of options to a parser.

The options are added to the parser itself (not to an ``argparse`` argument group), so ``--help`` lists them
where the command places them.
"""

from __future__ import annotations

import argparse

from ..transfer.curve import CURVE_MODES


def add_cache_dir_arg(p: argparse.ArgumentParser) -> None:
    """``--cache-dir``: where features mode keeps the vectors of a body pass."""
    p.add_argument("--cache-dir", default=None, help="features mode: vector cache (default ~/.cache/lmforge/features)")


def add_curve_draw_args(p: argparse.ArgumentParser, sizes: list[int]) -> None:
    """``--sizes``, ``--seeds``, ``--modes``: the training-set sizes of a learning curve, one draw per seed, and
    the modes trained on every draw (``sizes``: the default sizes)."""
    p.add_argument("--sizes", type=int, nargs="+", default=sizes, help="training-set sizes")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--modes", nargs="+", default=None,
                   help=f"subset of {' '.join(CURVE_MODES)}, and scratch:PRESET for the from-scratch "
                   "baseline in another preset's shape, e.g. scratch:tiny (default: scratch and every mode the "
                   "family has); the lead is reported over the strongest baseline")
