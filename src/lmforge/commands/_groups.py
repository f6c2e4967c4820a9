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


class _HelpAll(argparse.Action):
    """``--help-all``: the full help, the options :func:`brief_help` left out of ``--help`` included."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        for action in parser._actions:
            if hasattr(action, "full_help"):
                action.help = action.full_help
        for group in parser._action_groups:
            if hasattr(group, "full_description"):
                group.description = group.full_description
        parser.print_help()
        parser.exit()


def brief_help(p: argparse.ArgumentParser, shown: tuple[str, ...], rest: str) -> None:
    """``--help`` of ``p`` lists the options named in ``shown`` (and every positional) so that it fits a
    screen; ``--help-all`` lists every option. A left-out option works as before (one spelling: only its
    help moves); docs/cli.md lists them all.

    Args:
        shown: option strings of the options ``--help`` lists.
        rest: what the others are about, for the line of ``--help-all``.
    """
    for action in p._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or set(action.option_strings) & set(shown):
            continue
        if isinstance(action, argparse._HelpAction):
            continue
        action.full_help = action.help or ""  # type: ignore[attr-defined]
        action.help = argparse.SUPPRESS
    for group in p._action_groups:
        if group._group_actions and all(a.help == argparse.SUPPRESS for a in group._group_actions):
            group.full_description = group.description  # type: ignore[attr-defined]
            group.description = None
    p.add_argument("--help-all", action=_HelpAll, help=f"show every option, also {rest}, and exit")
