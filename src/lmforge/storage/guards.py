"""What the CLI checks of a command's arguments before any work: outputs against inputs, numbers in range.

Every command declares the arguments it reads and writes (``set_defaults(reads=(...), writes=(...))``,
by option string or positional name).  :func:`check_paths` refuses, in one line, an output that is one
of the inputs, lies inside one (a file written into a model or run folder), or holds one (a folder that
would be replaced or cleared).  A transfer run folder also reads the model folder it was trained from,
so that one counts as an input too.

:func:`check_numbers` range-checks every number given on the command line before it reaches torch or
NumPy: floats must be finite, integers must fit 64 bits, and the arguments in :data:`RANGES` (the same
meaning in every command) must lie in their range.  A command checks what only it knows on top (the
sampling settings of ``generate`` by :func:`lmforge.generation.check_generation_args`, which the server
shares).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from ..errors import LmforgeError
from ..utils import INT64, SEED_MAX
from .folders import folder_kind, read_json_object


class Range(NamedTuple):
    """The numbers an argument takes: ``low``..``high`` (None = no bound; ``open`` ends excluded)."""

    low: float | None
    high: float | None
    what: str
    low_open: bool = False
    high_open: bool = False

    def holds(self, v: float) -> bool:
        if self.low is not None and (v <= self.low if self.low_open else v < self.low):
            return False
        return self.high is None or (v < self.high if self.high_open else v <= self.high)


#: argument name -> the range it means in every command that has it
RANGES: dict[str, Range] = {
    "seed": Range(0, SEED_MAX, f"a whole number from 0 to {SEED_MAX}"),
    "seeds": Range(0, SEED_MAX, f"whole numbers from 0 to {SEED_MAX}"),
    **{name: Range(1, None, "1 or more") for name in (
        "batch_size", "batches", "epochs", "finetune_epochs", "max_len", "vocab_size", "workers", "n_train",
        "n_test", "sizes", "pool", "dev_size", "max_answer_tokens")},
    **{name: Range(0, None, "0 or more") for name in (
        "min_frequency", "patience", "max_pairs", "min_steps", "doc_stride", "lm_weight")},
    **{name: Range(0, None, "a number > 0", low_open=True) for name in (
        "lr", "lr_grid", "finetune_lr", "lr_grid_finetune", "lr_grid_scratch")},
    "val_fraction": Range(0, 1, "in [0, 1)", high_open=True),
}
_ANY_INT = Range(*INT64, f"a whole number from {INT64[0]} to {INT64[1]}")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_numbers(args) -> None:
    """Refuse a number of the command line that is not finite, too big for 64 bits, or outside :data:`RANGES`."""
    for dest, value in sorted(vars(args).items()):
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            rule = RANGES.get(dest)
            if isinstance(v, float):  # a float needs to be finite; the 64-bit bound is for whole numbers
                if not math.isfinite(v):
                    raise LmforgeError(f"{_flag(dest)} must be a finite number, got {v}")
            elif not _ANY_INT.holds(v):
                bound = f"at most {INT64[1]}" if v > 0 else f"at least {INT64[0]}"
                raise LmforgeError(f"{_flag(dest)} must be {rule.what if rule else bound}, got {v}")
            if rule is not None and not rule.holds(v):
                raise LmforgeError(f"{_flag(dest)} must be {rule.what}, got {v}")


def _values(args, name: str) -> list[tuple[str, str]]:
    """``(how the user named it, path)`` for each path given to the argument ``name``."""
    value = getattr(args, name.lstrip("-").replace("-", "_"), None)
    shown = name if name.startswith("-") else name.upper()
    items = value if isinstance(value, (list, tuple)) else [value]
    return [(shown, str(v)) for v in items if isinstance(v, (str, os.PathLike)) and str(v)]


def _run_model(path: str) -> str | None:
    """The model folder a transfer run folder was trained from (from its ``config.json``), if any."""
    if folder_kind(path) != "run":
        return None
    model = read_json_object(Path(path) / "config.json").get("model_dir")
    return model if isinstance(model, str) and model else None


def command_paths(args) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The (name, path) pairs a parsed command reads and writes (a run folder's model folder included)."""
    reads = [pair for name in getattr(args, "reads", ()) for pair in _values(args, name)]
    for shown, path in list(reads):
        model = _run_model(path)
        if model is not None:
            reads.append((f"the model of {shown} {path}", model))
    writes = [pair for name in getattr(args, "writes", ()) for pair in _values(args, name)]
    return reads, writes


def _real(path: str) -> Path:
    return Path(os.path.realpath(path))


def _same(a: str, b: str) -> bool:
    try:
        return _real(a) == _real(b) or (os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b))
    except OSError:
        return False


def check_paths(reads: Iterable[tuple[str, str]], writes: Iterable[tuple[str, str]]) -> None:
    """Refuse an output that is, lies inside, or holds one of the inputs (one line naming both)."""
    reads = [(name, src) for name, src in reads if os.path.lexists(src)]  # what is not there cannot be harmed
    for out_name, out in writes:
        o = _real(out)
        for in_name, src in reads:
            i = _real(src)
            what = "folder" if os.path.isdir(src) else "file"
            if _same(out, src):
                raise LmforgeError(f"{out_name} {out} is the {what} this command reads ({in_name}); writing there "
                                   f"would destroy it: choose another {out_name}")
            if i in o.parents:
                raise LmforgeError(f"{out_name} {out} lies inside {src} ({in_name}), the {what} this command reads; "
                                   f"writing there could destroy it: choose an {out_name} outside it")
            if o in i.parents:
                raise LmforgeError(f"{out_name} {out} holds {src} ({in_name}), which this command reads; writing "
                                   f"there could destroy it: choose another {out_name}")
