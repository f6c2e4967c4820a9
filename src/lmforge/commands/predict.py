"""``lmforge predict RUN_DIR --text "..." [--text-pair "..." | --choice "..." ...] | --file F``: use a trained run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..data.formats import is_dataset_folder
from ..data.tasks import TaskData, example_from_fields, load_task
from ..errors import DataError
from ..transfer import load_run
from ..utils import atomic_write_text
from . import command_help
from ._common import RUN_DEVICE_HELP, RUN_PRECISION_HELP, add_device_arg, add_inference_precision_arg, show
from ._predict import prediction_line, with_inputs


def register(sub) -> None:
    p = sub.add_parser(
        "predict",
        help=command_help("predict"),
        description="Prints one line per example: the prediction beside its input (--json: one JSON record per "
        "example; with --file each record holds the example's input fields too). classify/pair: the label and "
        "class probabilities; tokens: the words (split on white space) and their tags; qa: --text is the question, "
        "--text-pair the context; "
        "choice: --text is the context, each --choice one choice (the index of the chosen one and the probabilities).",
    )
    p.add_argument("run_dir", help="folder written by `lmforge finetune --out`")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="one text (tokens task: words separated by spaces; qa: the question)")
    src.add_argument("--file", help="a file in the task's format (labels optional) to predict every example of")
    p.add_argument("--text-pair", default=None, help="the second text of a pair task, or the context for qa")
    p.add_argument(
        "--choice",
        action="append",
        default=None,
        metavar="TEXT",
        help="choice task: one choice (give two or more); --text is the context",
    )
    p.add_argument("--out", default=None,
                   help="write the predictions (JSONL, each beside its input) here instead of printing them")
    p.add_argument("--json", action="store_true",
                   help="print one JSON record per example (with --out: one JSON record of what was written)")
    add_device_arg(p, default=None, help=RUN_DEVICE_HELP)
    add_inference_precision_arg(p, default=None, help=RUN_PRECISION_HELP)
    add_backend_args(p)
    p.set_defaults(func=run, reads=("run_dir", "--file"), writes=("--out",))


def add_backend_args(p) -> None:
    """``--backend`` and ``--quantize`` of a run (predict, evaluate run)."""
    p.add_argument("--backend", choices=["torch", "onnx", "auto"], default="torch",
                   help="run the fine-tuned model on torch or on ONNX Runtime (the onnx extra; frozen and finetune "
                        "runs), or auto: the faster on this machine, measured once per run (default torch)")
    p.add_argument("--quantize", choices=["none", "int8"], default="none",
                   help="int8: ONNX Runtime's dynamic int8 (with --backend onnx), approximate: `lmforge evaluate run` "
                        "shows its test score beside fp32's (default none: exact)")


def run(args) -> int:

    given = [("--text", args.text), ("--text-pair", args.text_pair), *(("--choice", c) for c in args.choice or [])]
    for flag, value in given:
        if value is not None and not value.strip():
            raise DataError(f"{flag} is empty; give the text to predict on")
    if args.file and os.path.isdir(args.file) and not is_dataset_folder(Path(args.file)):
        raise DataError(f"--file {args.file} is a folder, not a data file; give one file in the task's format "
                        f"(or a folder written by datasets' save_to_disk)")
    run_ = load_run(args.run_dir, device=args.device, precision=args.precision).set_backend(args.backend,
                                                                                          args.quantize)
    task = run_.cfg.task
    if args.file:
        data = load_task(args.file, task, labelled=False)
    else:
        flags = {"text": "--text", "text_pair": "--text-pair", "choices": "--choice"}
        ex = example_from_fields(task, args.text, args.text_pair, args.choice, flags)
        data = TaskData(task, [ex], list(run_.labels), "<command line>")
    preds = run_.predict(data, use_cache=False)
    beside = [with_inputs(ex, p) for ex, p in zip(data.examples, preds)]  # each prediction beside its input
    records = beside if args.file else preds  # --text: the record the server answers too
    if args.out:
        atomic_write_text(args.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in beside))
        show(args, {"out": str(args.out), "predictions": len(preds), "task": task},
             [f"wrote {len(preds)} predictions, each beside its input, to {args.out}"])
    elif args.json:
        sys.stdout.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    else:
        sys.stdout.write("".join(prediction_line(task, r) + "\n" for r in beside))
    return 0
