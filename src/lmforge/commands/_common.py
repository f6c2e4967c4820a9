"""What the commands share: argument groups defined once, and how a command shows its result.

- :func:`add_compute_args`: ``--device`` and ``--precision``, the same on every training command
  (pretrain, finetune, benchmark curve, demo); :mod:`lmforge.train.precision` resolves them.
- :func:`add_device_arg` and :func:`on_device`: ``--device`` of the commands that only run a model (encode,
  generate, serve, ...): the model goes to that device.
- :func:`add_json_arg` and :func:`show`: a short human summary by default, the full record as JSON with
  ``--json``.
- :func:`refuse_flag_keys`: a ``--set`` key that a flag owns is refused, naming the flag (one way to say
  each thing).
- :func:`say`: a line on the way to the result (stdout, or stderr with ``--json`` so that stdout holds the JSON
  alone).
- :func:`progress`: a tqdm bar on a terminal, plain log lines when the output is piped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..devices import PRECISIONS, check_device
from ..errors import LmforgeError

# --set keys that a flag owns, and the flag to use instead
FLAG_KEYS = {
    "device": "--device",
    "precision": "--precision",
    "max_time": "--max-time",
    "compile": "--compile",
}


def device_arg(text: str) -> str:
    """argparse ``type`` of every ``--device``: cpu, cuda, cuda:N or auto, refused at parse time otherwise."""
    try:
        return check_device(text)
    except LmforgeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


DEVICE_HELP = "cpu, cuda, cuda:N or auto (default: auto = cuda when torch sees a GPU, else cpu)"
RUN_DEVICE_HELP = ("cpu, cuda, cuda:N or auto (= cuda when torch sees a GPU, else cpu); default: the run's own "
                   "--device, which is auto unless finetune was told otherwise")


def add_device_arg(p: argparse.ArgumentParser, default: str | None = "auto", help: str = DEVICE_HELP) -> None:
    """``--device`` of a command that runs a trained model (no training, so no precision to choose)."""
    p.add_argument("--device", type=device_arg, default=default, metavar="DEVICE", help=help)


def on_device(model, name: str):
    """``model`` moved to the device ``--device`` names (a one-line error for a GPU torch does not see)."""
    from ..train.precision import resolve_device  # imports torch: only when a command runs

    return model.to(resolve_device(name))


INFERENCE_PRECISION_HELP = (
    "fp32 (default: exactly the model's fp32 results); bf16 or fp16 (CUDA only) run the model under autocast, "
    "faster on a GPU or a CPU with native bf16, with results close to fp32's (docs/vectors.md measures them); "
    "auto: bf16 where the device computes it natively and the model is wide enough to gain")


RUN_PRECISION_HELP = ("fp32, bf16, fp16 (CUDA only) or auto (bf16 where the device computes it natively and the "
                      "body is wide enough to gain); default: the precision the run was fine-tuned in")


def add_inference_precision_arg(p: argparse.ArgumentParser, default: str | None = "fp32",
                                help: str = INFERENCE_PRECISION_HELP) -> None:
    """``--precision`` of a command that runs a trained model (default fp32: the library's own results)."""
    p.add_argument("--precision", choices=PRECISIONS, default=default, help=help)


def add_compute_args(p: argparse.ArgumentParser) -> None:
    """``--device`` and ``--precision`` (default ``None``: the run config's, else ``auto``)."""
    g = p.add_argument_group("where and in which precision to compute")
    g.add_argument(
        "--device", type=device_arg, default=None, metavar="DEVICE", help=DEVICE_HELP,
    )
    g.add_argument(
        "--precision", choices=PRECISIONS, default=None,
        help="auto (default): bf16 on a CUDA GPU with bf16; on a CPU with native bf16 (avx512_bf16 or AMX) "
        "where it measures faster for the model (a few timed steps, cached), else fp32; fp32 forces full "
        "precision; bf16 and fp16 (GPU only, with a gradient scaler) run the forward pass under autocast, the "
        "weights stay fp32. The choice is printed and saved with the run",
    )


def compute_options(args: argparse.Namespace, defaults: bool = True) -> dict[str, str]:
    """``{"device", "precision"}`` as given; with ``defaults`` the unset ones are ``auto``, else left out."""
    out = {}
    for key in ("device", "precision"):
        value = getattr(args, key, None)
        if value is not None or defaults:
            out[key] = value if value is not None else "auto"
    return out


def add_text_file_args(p: argparse.ArgumentParser, file_flag: str) -> None:
    """How ``file_flag`` (``--file``, ``--corpus``) is read: ``--text-field``/``--text-column``, ``--format``,
    ``--split``, as :func:`lmforge.models.vectors.read_texts` takes them."""
    from ..data.formats import RECORD_FORMATS  # no torch: the parser stays light

    p.add_argument("--text-field", "--text-column", dest="text_field", metavar="NAME",
                   help="the field or column holding the text (default text); a 0-based number reads a CSV/TSV "
                        "file without a header row; given for a plain-text file, it means JSON lines")
    p.add_argument("--format", choices=["auto", "lines", *RECORD_FORMATS], default="auto",
                   help=f"read {file_flag} as this format (default: told from the content and the suffix; lines = "
                        "one text a line)")
    p.add_argument("--split", default=None, metavar="NAME",
                   help="a `datasets` folder with several splits: the one to read (default train)")


def add_json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="print the full record as JSON instead of the short summary")


def add_overwrite_arg(p: argparse.ArgumentParser) -> None:
    """``--overwrite``, with the one meaning it has in every command that writes (docs/cli.md, "Existing outputs")."""
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing output: the new one is written beside it and takes its place only "
                   "when complete; files lmforge did not write there are kept (an input is never replaced)")


def say(args: argparse.Namespace, text: str) -> None:
    """A line on the way to the result: on stdout, or on stderr with ``--json`` (stdout holds the JSON alone)."""
    print(text, file=sys.stderr if getattr(args, "json", False) else sys.stdout, flush=True)


def add_set_arg(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help=help)


def refuse_flag_keys(pairs: Sequence[str], owned: dict[str, str] | None = None) -> None:
    """A one-line error for a ``--set`` key that a flag owns (``device=cuda`` -> use ``--device cuda``)."""
    owned = FLAG_KEYS if owned is None else owned
    for pair in pairs:
        key, _, value = pair.partition("=")
        key = key.strip()
        if key in owned:
            flag = owned[key]
            example = flag if " " in flag or not value.strip() else f"{flag} {value.strip()}"
            raise LmforgeError(f"--set {key}=... is not a setting here; use {example}")


# -- numbers a person reads ---------------------------------------------------------------------------------


def fmt(value: Any, key: str = "") -> str:
    """A figure for a person: 4 significant digits, learning rates in scientific notation, counts as is."""
    if value is None:
        return "-"
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if key == "lr" or key.endswith("_lr") or key.startswith("lr_"):
            mantissa, _, exp = f"{value:.3e}".partition("e")
            return f"{mantissa.rstrip('0').rstrip('.')}e{exp}"
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt(v, key) for v in value) + "]"
    return str(value)


def pairs(record: dict, keys: Sequence[str] | None = None) -> str:
    """``"accuracy 0.8125, macro_f1 0.8"``: the numeric entries of ``record`` (or ``keys``) as text."""
    keys = list(record) if keys is None else [k for k in keys if k in record]
    items = [(k, record[k]) for k in keys
             if isinstance(record[k], (int, float)) and not isinstance(record[k], bool)]
    return ", ".join(f"{k} {fmt(v, k)}" for k, v in items)


def jsonable(obj: Any) -> Any:
    """``obj`` with float noise cleaned (``0.00030000000000000003`` -> ``0.0003``) and NaN / inf as null."""
    if isinstance(obj, float):
        return float(f"{obj:.12g}") if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def show(args: argparse.Namespace, record: Any, summary: Sequence[str] | Callable[[], Sequence[str]]) -> None:
    """Print ``record`` as one JSON document with ``--json``, else the human ``summary`` lines."""
    if getattr(args, "json", False):
        print(json.dumps(jsonable(record), ensure_ascii=False))
        return
    for line in summary() if callable(summary) else summary:
        print(line)


# -- progress -----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def progress(desc: str, total: int | None = None, unit: str = "epoch", quiet: bool = False,
             quiet_loggers: Sequence[str] = ()) -> Iterator[Callable[[str], None]]:
    """A callback ``line(text)`` for long work: on a terminal it moves a tqdm bar (showing ``text``), the
    ``quiet_loggers`` (whose lines the bar shows) say only warnings meanwhile and other log lines go above the
    bar; when piped the bar is off (tqdm's ``disable=None``) and the loggers' plain lines are the progress."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True,
               disable=True if quiet else None)
    loggers = [logging.getLogger(name) for name in quiet_loggers] if not bar.disable else []
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)

    def line(text: str) -> None:
        bar.update(1)
        bar.set_postfix_str(text[:80], refresh=True)

    try:
        with logging_redirect_tqdm(loggers=[logging.getLogger("lmforge")]) if not bar.disable \
                else contextlib.nullcontext():
            yield line
    finally:
        bar.close()
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
