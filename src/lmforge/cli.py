"""The ``lmforge`` command.  Subcommands are thin: they parse arguments and call a library function.

Each subcommand lives in ``lmforge/commands/<name>.py`` and exposes ``register(subparsers)``.
User errors (:class:`lmforge.errors.LmforgeError`) are printed as one line, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from . import __version__
from .errors import LmforgeError

# Order = order in `lmforge --help`.
COMMAND_MODULES = [
    "demo",
    "tokenizer",
    "prepare",
    "pretrain",
    "generate",
    "fill_mask",
    "embed",
    "evaluate",
    "finetune",
    "predict",
    "hf",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmforge",
        description="Pretrain word2vec, ELMo, GPT and BERT on your own corpus and transfer them to your tasks.",
    )
    parser.add_argument("--version", action="version", version=f"lmforge {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="only print results and errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"lmforge.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"lmforge.commands.{name}":
                continue  # command not built into this installation
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    from .utils import setup_logging

    setup_logging(logging.WARNING if args.quiet else logging.INFO)
    try:
        rc = args.func(args)
    except LmforgeError as e:
        print(f"lmforge {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lmforge {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
