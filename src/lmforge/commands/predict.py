"""``lmforge predict RUN_DIR --text "..." [--text-pair "..." | --choice "..." ...] | --file F``: use a trained run."""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser(
        "predict",
        help="run a trained task (a folder written by `lmforge finetune`) on new text",
        description="Prints one JSON line per example. classify/pair: the label and class probabilities; tokens: "
        "the words (split on white space) and their tags; qa: --text is the question, --text-pair the context; "
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
    p.add_argument("--out", default=None, help="write the predictions (JSONL) here instead of printing them")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..data.tasks import TaskData, example_from_fields, load_task
    from ..errors import DataError
    from ..transfer import load_run
    from ..utils import atomic_write_text

    given = [("--text", args.text), ("--text-pair", args.text_pair), *(("--choice", c) for c in args.choice or [])]
    for flag, value in given:
        if value is not None and not value.strip():
            raise DataError(f"{flag} is empty; give the text to predict on")
    run_ = load_run(args.run_dir)
    task = run_.cfg.task
    if args.file:
        data = load_task(args.file, task, labelled=False)
    else:
        flags = {"text": "--text", "text_pair": "--text-pair", "choices": "--choice"}
        ex = example_from_fields(task, args.text, args.text_pair, args.choice, flags)
        data = TaskData(task, [ex], list(run_.labels), "<command line>")
    preds = run_.predict(data, use_cache=False)
    lines = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in preds)
    if args.out:
        atomic_write_text(args.out, lines)
        print(f"wrote {len(preds)} predictions to {args.out}")
    else:
        sys.stdout.write(lines)
    return 0
