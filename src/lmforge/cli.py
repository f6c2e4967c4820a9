"""The ``lmforge`` command.  Subcommands are thin: they parse arguments and call a library function.

Each subcommand lives in ``lmforge/commands/<name>.py`` and exposes ``register(subparsers)``.
User errors (:class:`lmforge.errors.LmforgeError`) are printed as one line, exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import io
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence

from . import __version__
from .commands import COMMANDS
from .cpu_quota import choose_threads
from .errors import LmforgeError
from .malloc import keep_freed_memory
from .storage.folders import os_error_line
from .storage.guards import check_numbers, check_paths, command_paths
from .storage.writing import recover_folder
from .utils import setup_logging


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``lmforge`` parser.

    Args:
        command: build only this command's arguments (the others are listed by name and help only, so that
            ``lmforge --help`` and argparse's "invalid choice" message stay whole); ``None`` builds every command.
            Command modules import torch, so ``lmforge --help`` (``command`` an unknown name or "") imports none.
    """
    parser = argparse.ArgumentParser(
        prog="lmforge",
        allow_abbrev=False,
        description="Pretrain word2vec, ELMo, GPT, BERT and ELECTRA on your own corpus and transfer them to your "
        "tasks.",
    )
    parser.add_argument("--version", action="version", version=f"lmforge {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="only print results and errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = COMMANDS[command][0] if command in COMMANDS else None  # the one module to import, if any
    registered: set[str] = set()
    for name, (module_name, help_line) in COMMANDS.items():
        if module_name in registered:
            continue  # a module that registers several commands (export-hf, import-hf) did so at the first
        if command is not None and module_name != wanted:
            sub.add_parser(name, help=help_line)
            continue
        importlib.import_module(f"lmforge.commands.{module_name}").register(sub)
        registered.add(module_name)
    for _, p in walk_parsers(parser):
        one_grammar(p, top=p is parser)
    return parser


def walk_parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """``(command words, parser)`` for ``parser`` and every subcommand parser below it, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk_parsers(sub, (*path, name))


def one_grammar(p: argparse.ArgumentParser, top: bool) -> None:
    """What every parser of ``lmforge`` holds to (docs/cli.md, "One grammar"): no abbreviations (``--epoch`` is
    not ``--epochs``), and the global ``-q/--quiet`` accepted after the command too."""
    p.allow_abbrev = False
    built = len(p._actions) > 1  # a command listed by name only (build_parser(command)) has its help alone
    if not top and built and "-q" not in p._option_string_actions:
        # default SUPPRESS: a command line without -q after the command keeps the global option's value; the
        # help is the top level's (docs/cli.md's first section says global options go before or after)
        p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def command_of(argv: Sequence[str]) -> str:
    """The command ``argv`` names (its first word that is not an option), or "" when it names none."""
    return next((str(a) for a in argv if not str(a).startswith("-")), "")


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, but an argument a command does not take is answered in one line with the closest real
    option, exit status 2 as for argparse's own errors."""
    given = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    words, command = command_parser(parser, given)
    stray = positional_output(parser, command, given)
    if stray is not None:
        raise SystemExit(_fail(" ".join(words), f"unexpected argument '{stray}'; every output is named with --out: "
                                                f"--out {stray}"))
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        raise SystemExit(_fail(" ".join(words) or "", unknown_line(command, " ".join(words), unknown)))
    return args


def command_parser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[list[str], argparse.ArgumentParser]:
    """The command words ``argv`` names (``["benchmark", "curve"]``) and the parser of that (sub)command."""
    words: list[str] = []
    for token in map(str, argv):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and token in subs[0].choices:
            words.append(token)
            parser = subs[0].choices[token]
    return words, parser


def positional_output(parser: argparse.ArgumentParser, command: argparse.ArgumentParser,
                      argv: Sequence[str]) -> str | None:
    """The word of ``argv`` given where the command's output goes (``export-hf RUN OUT`` in the positional form
    that is gone), or ``None``: argparse would only say that --out is missing."""
    if "--out" not in command._option_string_actions or any(a == "--out" or a.startswith("--out=") for a in argv):
        return None
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            _, unknown = parser.parse_known_args([*argv, "--out", "OUT"])
        except SystemExit:
            return None  # another mistake: argparse's own message says it
    return next((u for u in unknown if not u.startswith("-")), None)


def unknown_line(parser: argparse.ArgumentParser, command: str, unknown: Sequence[str]) -> str:
    """One line for the first argument ``parser`` does not take: an option answered with the closest real
    option of that command, a stray word with where outputs go (``--out``)."""
    helping = f"`lmforge {command} --help`".replace("  ", " ")
    options = sorted(s for s in parser._option_string_actions if s.startswith("--"))
    token = str(unknown[0])
    if token.startswith("-"):
        flag = token.partition("=")[0]
        close = difflib.get_close_matches(flag, options, n=1, cutoff=0.75)
        hint = f"did you mean {close[0]}? " if close else ""
        return f"unknown option {flag}; {hint}{helping} lists the options"
    if "--out" in options:
        return f"unexpected argument '{token}'; every output is named with --out (--out {token}); {helping}"
    return f"unexpected argument '{token}'; {helping} shows what it takes"


def main(argv: list[str] | None = None) -> int:
    previous = stop_on_sigterm()  # first: a SIGTERM while torch loads is a clean exit too
    try:
        return _main(argv)
    except KeyboardInterrupt as e:  # while the command loads, before it has anything to clean up
        stopped = isinstance(e, Terminated)
        print(f"lmforge: {'terminated' if stopped else 'interrupted'}", file=sys.stderr)
        return 143 if stopped else 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    parser = build_parser(command_of(sys.argv[1:] if argv is None else argv))
    args = parse_args(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    setup_logging(logging.WARNING if args.quiet else logging.INFO)
    return _run(args)


def _run(args) -> int:
    """``args.func(args)``, with the user's mistakes, interruptions and the machine's limits as one line."""
    try:
        logging.getLogger(__name__).debug("allocator: %s", keep_freed_memory())  # lmforge/malloc.py says why
        capped = choose_threads()  # before torch loads: lmforge/cpu_quota.py says why
        if capped:
            logging.getLogger(__name__).info("%s", capped)
        check_args(args)
        rc = args.func(args)
        sys.stdout.flush()  # a full disk under a redirected stdout fails here, not silently at exit
    except LmforgeError as e:
        return _fail(args.command, str(e))
    except KeyboardInterrupt as e:
        stopped = isinstance(e, Terminated)
        print(f"lmforge {args.command}: {'terminated' if stopped else 'interrupted'}", file=sys.stderr)
        return 143 if stopped else 130
    except OSError as e:
        out = _output_of(args)
        if e.filename is None:  # e.g. a write() that hit a full disk names no file: the output, or stdout
            out = out or ("the standard output" if _stdout_full() else "this command's output")
            e = OSError(e.errno, e.strerror, out)
        return _fail(args.command, os_error_line(e, "write" if out is not None else "read"))
    except MemoryError:
        return _fail(args.command, "out of memory; use a smaller model, batch size or sequence length")
    except RuntimeError as e:
        line = out_of_memory_line(e)
        if line is None:
            raise
        return _fail(args.command, line)
    return int(rc or 0)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt."""


def stop_on_sigterm():
    """Make SIGTERM unwind the command as Ctrl-C does: every ``finally`` and ``with`` on the way releases its
    lock, ends its worker processes and removes its staged output (the default action ends the process at once,
    leaving all three behind).  ``lmforge serve`` replaces it with uvicorn's own shutdown while it serves.

    Returns:
        the handler it replaced (None where signals cannot be handled: outside the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
        raise Terminated()

    return signal.signal(signal.SIGTERM, terminate)


def check_args(args) -> None:
    """What every command gets before its work starts: the numbers range-checked, the folders it reads put
    back where a replacement was cut short, and each output checked against every input."""
    check_numbers(args)
    for _, path in command_paths(args)[0]:
        recover_folder(path)
    check_paths(*command_paths(args))  # again: a run folder put back names its model folder


def _fail(command: str, message: str) -> int:
    print(f"lmforge{' ' + command if command else ''}: error: {message}", file=sys.stderr)
    return 2


def _stdout_full() -> bool:
    """Whether stdout goes to a file system with no space left (``lmforge ... > file`` on a full disk)."""
    try:
        return os.fstatvfs(sys.stdout.fileno()).f_bavail == 0
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False


def _output_of(args) -> str | None:
    """The folder or file a command writes, if any (for messages about OS errors that name no path)."""
    if args.command == "demo":
        return args.out or "the demo folder"
    return getattr(args, "out", None) or getattr(args, "out_dir", None)


_ALLOC = re.compile(r"tried to allocate (\d+(?:\.\d+)?) ?(bytes|[KMGT]i?B)", re.IGNORECASE)


def out_of_memory_line(e: BaseException) -> str | None:
    """One line for torch's out-of-memory errors (CPU allocator or CUDA), naming the size; ``None`` otherwise."""
    text = str(e)
    oom = "out of memory" in text.lower() or "can't allocate memory" in text.lower()
    if not oom and type(e).__name__ != "OutOfMemoryError":
        return None
    m = _ALLOC.search(text)
    size = ""
    if m:
        value, unit = float(m.group(1)), m.group(2)
        scale = {"bytes": 1, "kb": 2**10, "kib": 2**10, "mb": 2**20, "mib": 2**20, "gb": 2**30, "gib": 2**30,
                 "tb": 2**40, "tib": 2**40}[unit.lower()]
        size = f" (an allocation of {value * scale / 2**30:.1f} GiB failed)"
    where = "GPU" if "cuda" in text.lower() or type(e).__name__ == "OutOfMemoryError" else "memory"
    return (f"out of {where}{size}; use a smaller model, batch size or sequence length "
            f"(e.g. --set batch_size=... n_positions=...)")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
