"""The arguments of ``lmforge pretrain`` as a plain :class:`lmforge.train.run_config.RunRequest`.

The command only parses; :func:`lmforge.train.run_config.resolve_run` turns the request into the one resolved run
configuration (presets, run files, ``--set``, ``--init``, ``--resume``, ``--plan``, ``--budget``, device and
precision).
"""

from __future__ import annotations

import argparse

from ..train.run_config import RunRequest


def compute_flags(args: argparse.Namespace) -> dict[str, str | bool]:
    """``--device``, ``--precision`` and ``--compile`` where given (they override a run file and ``--set``)."""
    return {k: v for k in ("device", "precision", "compile") if (v := getattr(args, k, None)) is not None}


def run_request(args: argparse.Namespace) -> RunRequest:
    """The request ``lmforge pretrain``'s arguments make, strings as given."""
    return RunRequest(
        family=args.family, out=args.out, data=args.data, config=args.config, overrides=tuple(args.overrides),
        max_time=args.max_time, init=args.init, resume=args.resume, overwrite=args.overwrite, budget=args.budget,
        plan=args.plan, search_shape=args.search_shape, **compute_flags(args),
    )
