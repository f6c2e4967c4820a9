"""``lmforge predict RUN_DIR --text "..." [--text ...] | --file F|-``: use a trained run.

Every record written is the input as it came (a file's record, every field kept, gold labels included) plus the
prediction under ``pred`` and the probabilities under ``probs``: a scorer reads the gold ``label`` and ``pred``
apart, as in the run's own predictions.jsonl.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..data.formats import is_dataset_folder
from ..errors import DataError
from ..storage.files import atomic_write_text
from ..storage.folders import check_output_file
from ..transfer import load_run
from . import command_help
from ._columns import add_column_args
from ._common import (
    RUN_DEVICE_HELP,
    RUN_PRECISION_HELP,
    add_device_arg,
    add_inference_precision_arg,
    add_overwrite_arg,
    show,
)
from ._predict import file_examples, inputs_of, prediction_line, stdin_file, text_examples, with_prediction


def register(sub) -> None:
    p = sub.add_parser(
        "predict",
        help=command_help("predict"),
        description="Prints one line per example: the prediction beside its input (--json: one JSON record per "
        "example, the input's fields unchanged plus pred and probs). classify/pair: the label and class "
        "probabilities; tokens: the words (split on white space) and their tags; qa: --text is the question, "
        "--text-pair the context; choice: --text is the context, each --choice one choice (the index of the chosen "
        "one and the probabilities).",
    )
    p.add_argument("run_dir", help="folder written by `lmforge finetune --out`")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", action="append", metavar="TEXT",
                     help="one text (tokens task: words separated by spaces; qa: the question); repeat it for "
                     "several")
    src.add_argument("--file", metavar="FILE",
                     help="the examples (labels optional, kept in the output): a file in the task's format (JSON "
                     "Lines, CSV/TSV, JSON, Parquet, a datasets folder; tokens: CoNLL), for classify also plain text "
                     "with one text a line; - reads standard input")
    p.add_argument("--text-pair", action="append", default=None, metavar="TEXT",
                   help="the second text of a pair task, or the context for qa (one per --text)")
    p.add_argument("--choice", action="append", default=None, metavar="TEXT",
                   help="choice task: one choice (give two or more); --text is the context")
    p.add_argument("--out", default=None,
                   help="write the records (JSON Lines: each input plus pred) here instead of printing them")
    add_overwrite_arg(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON record per example (with --out: one JSON record of what was written)")
    add_device_arg(p, default=None, help=RUN_DEVICE_HELP)
    add_inference_precision_arg(p, default=None, help=RUN_PRECISION_HELP)
    add_backend_args(p)
    p.set_defaults(func=run, reads=("run_dir", "--file"), writes=("--out",))
    add_column_args(p, files=("file",))


def add_backend_args(p) -> None:
    """``--backend`` and ``--quantize`` of a run (predict, evaluate run)."""
    p.add_argument("--backend", choices=["torch", "onnx", "auto"], default="torch",
                   help="run the fine-tuned model on torch or on ONNX Runtime (the onnx extra; frozen and finetune "
                        "runs), or auto: the faster on this machine, measured once per run (default torch)")
    p.add_argument("--quantize", choices=["none", "int8"], default="none",
                   help="int8: ONNX Runtime's dynamic int8 (with --backend onnx), approximate: `lmforge evaluate run` "
                        "shows its test score beside fp32's (default none: exact)")


def run(args) -> int:
    if args.out:
        check_output_file(args.out, args.overwrite)  # before any work: an existing file is not replaced unasked
    for flag, values in (("--text", args.text), ("--text-pair", args.text_pair), ("--choice", args.choice)):
        if any(not v.strip() for v in values or []):
            raise DataError(f"{flag} is empty; give the text to predict on")
    if args.file and args.file != "-" and os.path.isdir(args.file) and not is_dataset_folder(Path(args.file)):
        raise DataError(f"--file {args.file} is a folder, not a data file; give one file in the task's format "
                        f"(or a folder written by datasets' save_to_disk)")
    run_ = load_run(args.run_dir, device=args.device, precision=args.precision).set_backend(args.backend,
                                                                                          args.quantize)
    if args.file == "-":
        with stdin_file(args.file) as path:
            data, inputs = file_examples(path, run_.cfg.task, "standard input")
    elif args.file:
        data, inputs = file_examples(args.file, run_.cfg.task)
    else:
        data, inputs = text_examples(run_.cfg.task, args.text, args.text_pair, args.choice, list(run_.labels))
    preds = run_.predict(data, use_cache=False)
    records = [with_prediction(run_.cfg.task, rec, p) for rec, p in zip(inputs, preds)]
    lines = "".join(json.dumps(r, ensure_ascii=False, default=_plain) + "\n" for r in records)
    if args.out:
        atomic_write_text(args.out, lines)
        show(args, {"out": str(args.out), "predictions": len(records), "task": run_.cfg.task},
             [f"wrote {len(records)} records, each input plus its prediction, to {args.out}"])
    elif args.json:
        sys.stdout.write(lines)
    else:
        shown = [with_prediction(run_.cfg.task, inputs_of(ex), p) for ex, p in zip(data.examples, preds)]
        sys.stdout.write("".join(prediction_line(run_.cfg.task, r) + "\n" for r in shown))
    return 0


def _plain(value):
    """A value of a Parquet or datasets record that JSON has no type for (numpy arrays, dates) as JSON can hold."""
    return value.tolist() if hasattr(value, "tolist") else str(value)
