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
    from ..errors import DataError
    from ..transfer import load_run
    from ..transfer.tasks import ChoiceExample, QAExample, TaskData, TextExample, TokensExample, load_task
    from ..utils import atomic_write_text

    run_ = load_run(args.run_dir)
    task = run_.cfg.task
    if args.file:
        data = load_task(args.file, task, labelled=False)
    else:
        if task == "pair" and args.text_pair is None:
            raise DataError("this run is a pair task: give --text-pair as well")
        if task == "qa" and args.text_pair is None:
            raise DataError("this run answers questions: give the question as --text and the context as --text-pair")
        if task == "choice" and len(args.choice or []) < 2:
            raise DataError("this run picks one of several choices: give --text CONTEXT and two or more --choice")
        if args.choice and task != "choice":
            raise DataError(f"--choice is for a choice run; this run's task is {task}")
        if task in ("classify", "pair"):
            ex = TextExample(args.text, args.text_pair if task == "pair" else None)
        elif task == "tokens":
            words = args.text.split()
            if not words:
                raise DataError("--text has no words")
            ex = TokensExample(words)
        elif task == "choice":
            ex = ChoiceExample(args.text, list(args.choice))
        else:
            ex = QAExample("q0", args.text, args.text_pair)
        data = TaskData(task, [ex], list(run_.labels), "<command line>")
    preds = run_.predict(data, use_cache=False)
    lines = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in preds)
    if args.out:
        atomic_write_text(args.out, lines)
        print(f"wrote {len(preds)} predictions to {args.out}")
    else:
        sys.stdout.write(lines)
    return 0
