"""``lmforge evaluate``: ``wic MODEL_DIR... [--max-pairs N] [--reference minilm]`` (the WordNet word-in-context
table), ``run RUN_DIR --test FILE [--out F]`` (a trained transfer run scored on another labelled file) and
``lm MODEL_DIR --data SHARDS`` (a pretrained model's own loss and perplexity on other text)."""

from __future__ import annotations

from pathlib import Path

from ..config import load_json
from ..data.tasks import TaskData, check_labels, load_task
from ..errors import ConfigError, LmforgeError
from ..evaluate import load_models
from ..evaluate.wic import format_wic, wic_table
from ..families import FAMILIES
from ..storage.checks import check_model_folder
from ..storage.files import atomic_write_text
from ..storage.folders import check_output_file
from ..train.pretrain import evaluate_lm
from ..train.run_config import split_sets
from ..transfer import load_run
from . import command_help
from ._columns import add_column_args
from ._common import (
    RUN_DEVICE_HELP,
    RUN_PRECISION_HELP,
    add_device_arg,
    add_inference_precision_arg,
    add_json_arg,
    add_overwrite_arg,
    pairs,
    show,
)
from .predict import add_backend_args


def register(sub) -> None:
    p = sub.add_parser(
        "evaluate",
        help=command_help("evaluate"),
    )
    tasks = p.add_subparsers(dest="task", metavar="TASK", required=True)
    w = tasks.add_parser(
        "wic",
        help="same sense or not? cosine-threshold accuracy per model and layer on WordNet example pairs",
        description=(
            "Builds balanced same-sense / different-sense sentence pairs from WordNet's examples, picks a "
            "cosine threshold per model and layer on the dev split and reports test accuracy (chance 50%)."
        ),
    )
    w.add_argument("model_dirs", nargs="*", metavar="MODEL_DIR", help="lmforge model folders")
    w.add_argument("--max-pairs", type=int, default=2000, help="pairs to build (default 2000; 0 = all)")
    w.add_argument("--reference", choices=["minilm"], help="add the real all-MiniLM-L6-v2 as a reference row")
    add_device_arg(w)
    add_json_arg(w)
    w.set_defaults(func=run_wic, reads=("model_dirs",))
    r = tasks.add_parser(
        "run",
        help="score a trained task (a folder written by `lmforge finetune`) on another labelled file",
        description="Loads the run, predicts every example of --test and prints the task's metrics (the same "
        "metrics `lmforge finetune` writes to metrics.json; --json prints them as one JSON line).",
    )
    r.add_argument("run_dir", help="folder written by `lmforge finetune --out`")
    r.add_argument("--test", required=True, help="labelled data file in the run's task format")
    r.add_argument("--out", default=None, help="also write one record per example (gold and prediction) as JSONL")
    add_overwrite_arg(r)
    add_device_arg(r, default=None, help=RUN_DEVICE_HELP)
    add_inference_precision_arg(r, default=None, help=RUN_PRECISION_HELP)
    add_backend_args(r)
    add_json_arg(r)
    r.set_defaults(func=run_run, reads=("run_dir", "--test"), writes=("--out",))
    add_column_args(r, files=("test",))
    m = tasks.add_parser(
        "lm",
        help="a pretrained model's own loss and perplexity on other shards (e.g. your domain's text)",
        description="Scores a bert / gpt / elmo model folder with its pretraining objective (GPT next token, ELMo "
        "both directions, BERT masked LM + NSP) on seeded batches of shards made with the model's tokenizer, "
        "exactly as pretraining validates. Prints the loss and perplexity (--json: one JSON line).",
    )
    m.add_argument("model_dir", help="lmforge model folder (bert, gpt or elmo)")
    m.add_argument(
        "--data", required=True, metavar="SHARDS", help="shards from `lmforge prepare --tokenizer MODEL_DIR`"
    )
    m.add_argument("--split", choices=["val", "train"], default="val", help="which split of the shards (default val)")
    m.add_argument("--batches", type=int, default=50, help="seeded batches to average (default 50)")
    m.add_argument("--batch-size", type=int, default=16, help="rows per batch (default 16)")
    m.add_argument("--seed", type=int, default=0, help="seeds which rows (and BERT masks) are drawn")
    m.add_argument(
        "--set",
        dest="overrides",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="model-config keys of the sampler, e.g. next_sentence=false for single-sentence documents",
    )
    add_device_arg(m)
    add_json_arg(m)
    m.set_defaults(func=run_lm, reads=("model_dir", "--data"))


def run_wic(args) -> int:

    if args.max_pairs < 0:
        raise LmforgeError(f"--max-pairs must be >= 0, got {args.max_pairs}")
    models = load_models(args.model_dirs, args.reference, device=args.device)
    rows, info = wic_table(models, max_pairs=args.max_pairs or None)
    import dataclasses

    show(args, {"rows": [dataclasses.asdict(r) for r in rows], "info": info}, [format_wic(rows, info)])
    return 0


def run_run(args) -> int:
    import json

    if args.out:
        check_output_file(args.out, args.overwrite)  # before any work: an existing file is not replaced unasked
    run_ = load_run(args.run_dir, device=args.device, precision=args.precision)
    task = run_.cfg.task
    data = load_task(args.test, task)
    check_labels(TaskData(task, [], list(run_.labels), f"the run {args.run_dir}"), data)
    exact = run_.evaluate(data)[0] if args.quantize != "none" else None  # what int8 is held against
    metrics, records = run_.set_backend(args.backend, args.quantize).evaluate(data)
    if args.out:
        atomic_write_text(args.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    record = {"task": task, "family": run_.family, "n_test": len(data), **metrics, "backend": args.backend,
              "quantize": args.quantize, "fp32": exact}
    lines = [f"{task} run {args.run_dir} ({run_.family}) on {len(data)} examples of {args.test}: {pairs(metrics)}"
             + ("" if args.backend == "torch" else f" ({args.backend}{'' if exact is None else ' int8'})")]
    if exact is not None:
        lines.append(f"the same run in fp32 on torch: {pairs(exact)}")
    if args.out:
        lines.append(f"wrote each example's gold and prediction to {args.out}")
    show(args, record, lines)
    return 0


def _lm_keys(model_dir, pairs) -> dict[str, dict[str, str]]:
    """The ``--set`` model and data-recipe keys of ``evaluate lm`` (a training key is refused)."""
    config = Path(model_dir) / "config.json"
    family = load_json(config).get("model_type") if pairs and config.is_file() else None
    if family not in FAMILIES:
        return {}  # no model folder, or an unknown family: evaluate_lm names it
    model_over, train_over, recipe_over = split_sets(pairs, family)
    if train_over:
        raise ConfigError(f"evaluate lm takes model-config keys only, not {', '.join(sorted(train_over))}")
    return {"model_fields": model_over, "recipe_fields": recipe_over}


def run_lm(args) -> int:
    import math

    check_model_folder(args.model_dir, FAMILIES)
    val = evaluate_lm(
        args.model_dir,
        args.data,
        split=args.split,
        batches=args.batches,
        batch_size=args.batch_size,
        **_lm_keys(args.model_dir, args.overrides),
        seed=args.seed,
        device=args.device,
    )
    if not math.isfinite(val.get("loss", 0.0)):
        raise LmforgeError(
            f"{args.model_dir} gives a non-finite loss ({val['loss']}) on {args.data}: its weights are unusable; "
            f"resume its training from an earlier checkpoint with a lower learning rate"
        )
    record = {"model": str(args.model_dir), "data": str(args.data), "split": args.split, **val}
    show(args, record, [f"{args.model_dir} on the {args.split} split of {args.data} ({args.batches} batches of "
                        f"{args.batch_size}): {pairs(val)}"])
    return 0
