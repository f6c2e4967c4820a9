"""``lmforge pretrain {bert,gpt,elmo,word2vec}``: train a model family on prepared token shards."""

from __future__ import annotations

import argparse
import math
import os

from ..models import FAMILIES

FAMILY_CHOICES = tuple(FAMILIES)

EPILOG = """\
examples:
  lmforge pretrain gpt --data shards/bpe --out models/gpt --config tiny --max-time 15m
  lmforge pretrain gpt --data shards/bpe --out models/gpt --budget 15m
  lmforge pretrain gpt --data shards/bpe --out models/gpt2 --plan models/gpt/plan.json
  lmforge pretrain bert --data shards/wp --out models/bert --set max_steps=2000 lr=3e-4 batch_size=16
  lmforge pretrain gpt --data shards/bpe --out models/gpt --resume --max-steps 4000
  lmforge pretrain bert --data shards/legal --out models/bert-legal --init models/bert --set lr=5e-5
  torchrun --nproc_per_node 2 --no-python lmforge pretrain gpt --data shards/bpe --out models/gpt

--set takes model config keys (those of the preset) and training keys: max_steps max_time batch_size
grad_accum lr min_lr_ratio warmup_steps decay_steps schedule weight_decay beta1 beta2 eps grad_clip
bf16 eval_every eval_batches log_every save_every seed device.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "pretrain",
        help="pretrain a model family (bert, gpt, elmo, word2vec) on token shards",
        description="Pretrain a model family on shards made by `lmforge prepare`, writing a model folder. "
        "Checkpoints go to OUT/training_state; --resume continues exactly where a run stopped.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("family", choices=FAMILY_CHOICES, help="which model family to train")
    p.add_argument("--data", required=True, metavar="SHARDS", help="shard folder written by `lmforge prepare`")
    p.add_argument("--out", required=True, metavar="MODEL_DIR", help="model folder to write (or resume)")
    p.add_argument(
        "--config", metavar="PRESET|FILE", help="a preset of the family (e.g. tiny, mini) or a JSON config file"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="override model or training config fields, e.g. --set lr=3e-4 n_layer=6",
    )
    p.add_argument("--max-steps", type=int, metavar="N", help="optimizer steps in total (same as --set max_steps=N)")
    p.add_argument(
        "--max-time", metavar="DURATION", help="time budget of this run, e.g. 90s, 15m, 1h; then save and stop"
    )
    p.add_argument(
        "--budget",
        metavar="TIME|TOKENS",
        help="plan the run from a budget, e.g. 15m, 1h or 20Mtok: a throughput probe picks the shape and the "
        "number of steps (saved as OUT/plan.json), then exactly that many steps run (docs/training.md)",
    )
    p.add_argument("--plan", metavar="PLAN_JSON", help="replay a saved plan.json exactly (no probe)")
    p.add_argument("--resume", action="store_true", help="continue the training saved in MODEL_DIR/training_state")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in a MODEL_DIR that already holds a model (its model files and training state are "
        "deleted), or write into a folder of another kind",
    )
    p.add_argument("--tokenizer", metavar="DIR", help="check that this tokenizer made the shards")
    p.add_argument(
        "--init",
        metavar="MODEL_DIR",
        help="continue pretraining this model folder (same family) on new shards: domain-adaptive pretraining; "
        "its config and weights are the start, its tokenizer must have made the shards",
    )
    p.add_argument(
        "--log",
        choices=["jsonl", "tensorboard"],
        default=None,
        help="jsonl: metrics.jsonl and training_curves.png (default); tensorboard: also TensorBoard event files "
        "beside them (bert, gpt, elmo; same as --set log=tensorboard)",
    )
    p.set_defaults(func=run)


def format_metrics(val: dict[str, float]) -> str:
    """A two-column table of metric name and value."""
    width = max([len("metric"), *(len(k) for k in val)])
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  {'-' * 10}"]
    for k, v in val.items():
        text = "inf" if math.isinf(v) else (f"{v:.4f}" if abs(v) < 1e5 else f"{v:.4g}")
        lines.append(f"{k:<{width}}  {text}")
    return "\n".join(lines)


def check_val_split(data_dir: str) -> None:
    """Refuse shards without a validation split before training (pretraining ends with a validation)."""
    import json
    from pathlib import Path

    from ..errors import DataError

    try:
        meta = json.loads((Path(data_dir) / "meta.json").read_text(encoding="utf-8"))
        val_tokens = int(meta["splits"]["val"]["tokens"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # opening the shards gives the precise error
    if val_tokens == 0:
        raise DataError(
            f"the shards in {data_dir} have no validation split (prepared with --val-fraction 0); pretraining "
            f"needs one: run `lmforge prepare` again with e.g. --val-fraction 0.05"
        )


def check_configs(args, overrides: list[str]) -> None:
    """Find config problems (unknown keys, bad values, presets) before the output folder is touched."""
    from ..config import apply_overrides
    from ..train import pretrain as driver
    from ..train.config import TrainConfig

    module = driver.family_module(args.family)
    trainer_based = not hasattr(module, "run_pretraining")
    model_over, train_over = driver.split_all_overrides(overrides, driver.family_config_class(args.family, module),
                                                        trainer_based)
    if not args.resume and args.init is None:
        apply_overrides(driver.build_model_config(args.family, module, args.config), model_over)
    if trainer_based:
        apply_overrides(apply_overrides(TrainConfig(), dict(getattr(module, "TRAIN_DEFAULTS", {}))), train_over)


def _clear_for_overwrite(out, kind: str | None) -> None:
    """--overwrite: delete the files of the lmforge folder of ``kind`` at ``out`` (other files stay)."""
    import shutil

    from ..folders import _KNOWN, _entries

    if kind in (None, "other", "demo"):
        return
    from fnmatch import fnmatch

    for name in _entries(out):
        if any(fnmatch(name, pat) for pat in _KNOWN[kind]):
            target = out / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()


def run(args) -> int:
    from pathlib import Path

    from ..folders import folder_kind, output_folder
    from ..train.checkpoint import restore_model_config
    from ..train.config import parse_duration
    from ..train.pretrain import pretrain

    overrides = list(args.overrides)
    if args.max_steps is not None:
        overrides.append(f"max_steps={args.max_steps}")
    if args.log is not None:
        if args.family == "word2vec":
            from ..errors import LmforgeError

            raise LmforgeError("word2vec trains in one gensim pass, no training curve: --log is for bert, gpt, elmo")
        overrides.append(f"log={args.log}")
    max_time = parse_duration(args.max_time) if args.max_time is not None else None
    if args.resume and args.overwrite:
        from ..errors import LmforgeError

        raise LmforgeError("--resume continues the run in --out and --overwrite starts afresh; give one of them")
    check_configs(args, overrides)
    check_val_split(args.data)
    planned = getattr(args, "budget", None) is not None or getattr(args, "plan", None) is not None
    if planned:
        from ..train.budget import check_budget_args, plan_for_cli, run_plan

        check_budget_args(args)  # clashing options, a bad budget or plan file: before --out is touched
    kind_before = folder_kind(args.out)
    with output_folder(args.out, "model", args.overwrite, inputs=[args.data, args.init, args.tokenizer]) as out:
        if args.overwrite and os.environ.get("RANK", "0") == "0":
            _clear_for_overwrite(Path(out), kind_before)
        if args.resume:
            restore_model_config(out)
        plan = plan_for_cli(args) if planned else None
        if plan is not None:
            print(plan.describe(), flush=True)
        result = run_plan(plan, args.data, args.out, tokenizer_dir=args.tokenizer) if plan else pretrain(
            args.family,
            args.data,
            args.out,
            preset_or_file=args.config,
            overrides=overrides,
            resume=args.resume,
            max_time=max_time,
            tokenizer_dir=args.tokenizer,
            init=args.init,
        )
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun only rank 0 reports
    head = f"{args.family} model written to {result.out_dir}"
    if result.step is not None:
        head += f" after {result.step} steps"
        if result.tokens_seen:
            head += f" ({result.tokens_seen:,} tokens)"
    if result.stop_reason == "max_time":
        head += "; time budget reached, continue with --resume"
    print(head)
    print("final validation metrics:")
    print(format_metrics(result.val))
    return 0
