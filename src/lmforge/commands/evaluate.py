"""``lmforge evaluate``: ``wic MODEL_DIR... [--max-pairs N] [--reference minilm]`` (the WordNet word-in-context
table) and ``run RUN_DIR --test FILE [--out F]`` (a trained transfer run scored on another labelled file)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "evaluate",
        help="evaluate word representations (wic: WordNet word-in-context) or a trained run on new labelled data",
    )
    tasks = p.add_subparsers(dest="task", metavar="TASK", required=True)
    w = tasks.add_parser(
        "wic",
        help="same sense or not? cosine-threshold accuracy per model and layer on WordNet example pairs",
        description=(
            "Builds balanced same-sense / different-sense sentence pairs from WordNet's examples, picks a "
            "cosine threshold per model and layer on the dev split and reports test accuracy (chance 50%%)."
        ),
    )
    w.add_argument("model_dirs", nargs="*", metavar="MODEL_DIR", help="lmforge model folders")
    w.add_argument("--max-pairs", type=int, default=2000, help="pairs to build (default 2000; 0 = all)")
    w.add_argument("--reference", choices=["minilm"], help="add the real all-MiniLM-L6-v2 as a reference row")
    w.set_defaults(func=run_wic)
    r = tasks.add_parser(
        "run",
        help="score a trained task (a folder written by `lmforge finetune`) on another labelled file",
        description="Loads the run, predicts every example of --test and prints the task's metrics as one JSON "
        "line (the same metrics `lmforge finetune` writes to metrics.json).",
    )
    r.add_argument("run_dir", help="folder written by `lmforge finetune --out`")
    r.add_argument("--test", required=True, help="labelled data file in the run's task format")
    r.add_argument("--out", default=None, help="also write one record per example (gold and prediction) as JSONL")
    r.set_defaults(func=run_run)


def run_wic(args) -> int:
    from ..errors import LmforgeError
    from ..evaluate import load_models
    from ..evaluate.wic import format_wic, wic_table

    if args.max_pairs < 0:
        raise LmforgeError(f"--max-pairs must be >= 0, got {args.max_pairs}")
    models = load_models(args.model_dirs, args.reference)
    rows, info = wic_table(models, max_pairs=args.max_pairs or None)
    print(format_wic(rows, info))
    return 0


def run_run(args) -> int:
    import json

    from ..transfer import load_run
    from ..transfer.tasks import TaskData, check_labels, load_task
    from ..utils import atomic_write_text

    run_ = load_run(args.run_dir)
    task = run_.cfg.task
    data = load_task(args.test, task)
    check_labels(TaskData(task, [], list(run_.labels), f"the run {args.run_dir}"), data)
    metrics, records = run_.evaluate(data)
    if args.out:
        atomic_write_text(args.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    print(json.dumps({"task": task, "family": run_.family, "n_test": len(data), **metrics}))
    return 0
