"""``lmforge pretrain FAMILY`` (``bert``, ``gpt``, ``elmo``, ``word2vec``, ``electra``: the registry's families):
train a model family on prepared token shards."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import textwrap
from pathlib import Path

from ..config import FIELD_SYNONYMS
from ..errors import DataError, LmforgeError
from ..families import FAMILIES
from ..storage.folders import folder_kind
from ..storage.writing import output_folder, recover_folder, staged_folder
from ..train.budget import run_plan
from ..train.checkpoint import restore_model_config
from ..train.config import TrainConfig
from ..train.run_config import plan_run, resolve_run, train_run
from . import command_help
from ._common import (
    add_compute_args,
    add_json_arg,
    add_overwrite_arg,
    add_set_arg,
    fmt,
    refuse_flag_keys,
    say,
    show,
)
from ._runconfig import run_request

FAMILY_CHOICES = tuple(FAMILIES)

EPILOG_EXAMPLES = """\
examples:
  lmforge pretrain gpt --data shards/bpe --out models/gpt --config tiny --max-time 15m
  lmforge pretrain gpt --data shards/bpe --out models/gpt --budget 15m
  lmforge pretrain gpt --data shards/bpe --out models/gpt2 --plan models/gpt/plan.json
  lmforge pretrain gpt --data shards/bpe --out models/gpt --set n_layer=6 n_embd=256 max_steps=2000
  lmforge pretrain bert --data shards/wp --out models/bert --set num_hidden_layers=4 lr=3e-4 batch_size=16
  lmforge pretrain bert --data shards/wp --out models/bert --config run.toml --precision fp32
  lmforge pretrain bert --data shards/wp --out models/bert2 --config models/bert/train_config.json
  lmforge pretrain gpt --data shards/bpe --out models/gpt --resume --set max_steps=4000
  lmforge pretrain bert --data shards/legal --out models/bert-legal --init models/bert --set lr=5e-5
  torchrun --nproc_per_node 2 --no-python lmforge pretrain gpt --data shards/bpe --out models/gpt

A run file (--config run.toml, .json or .yaml) holds a whole run: model keys under [model], training
keys under [train] (or both as flat keys), and optionally preset = "tiny" as the base of the model keys:

  preset = "tiny"
  [model]
  num_hidden_layers = 4
  [train]
  max_steps = 2000
  lr = 3e-4

Every run saves OUT/train_config.json in that form: pass it back as --config to repeat the run.
--set overrides the file; --device and --precision override both.
"""


def _key_names() -> str:
    """The epilog's list of keys: training keys, and each family's names for its shape."""
    flag_owned = ("device", "precision", "max_time", "compile")
    train = " ".join(f.name for f in dataclasses.fields(TrainConfig) if f.name not in flag_owned)
    trained = ", ".join(n for n, f in FAMILIES.items() if f.trainer)
    lines = [textwrap.fill(f"training keys ({trained}): {train}", width=104, subsequent_indent="  "),
             "the shape keys of each family (--set):"]
    for name, fam in FAMILIES.items():
        fields = {f.name for f in dataclasses.fields(fam.config_class)}
        shape = [n for group in FIELD_SYNONYMS[:5] for n in group if n in fields]
        lines.append(f"  {name}: {' '.join(dict.fromkeys(shape))}")
    lines.append("a key of another family is answered with this family's name for it (n_layer -> num_hidden_layers).")
    return "\n".join(lines) + "\n"


def register(sub) -> None:
    p = sub.add_parser(
        "pretrain",
        help=command_help("pretrain"),
        description="Pretrain a model family on shards made by `lmforge prepare`, writing a model folder. "
        "Checkpoints go to OUT/training_state; --resume continues exactly where a run stopped.",
        epilog=EPILOG_EXAMPLES + "\n" + _key_names(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("family", choices=FAMILY_CHOICES, help="which model family to train")
    p.add_argument("--data", required=True, metavar="SHARDS", help="shard folder written by `lmforge prepare`")
    p.add_argument("--out", required=True, metavar="MODEL_DIR", help="model folder to write (or resume)")
    p.add_argument(
        "--config", metavar="PRESET|FILE",
        help="a preset of the family (e.g. tiny, mini) or a run file (.toml, .json, .yaml) with model and training "
        "keys, such as a model folder's train_config.json",
    )
    add_set_arg(p, "override model or training keys, e.g. --set lr=3e-4 max_steps=2000 n_layer=6 (gpt) or "
                   "num_hidden_layers=6 (bert); the keys are listed below")
    p.add_argument(
        "--max-time", metavar="DURATION", help="time budget of this run, e.g. 90s, 15m, 1h; then save and stop"
    )
    p.add_argument(
        "--budget",
        metavar="TIME|TOKENS",
        help="plan the run from a budget, e.g. 15m, 1h or 20Mtok: a throughput probe of the preset gives the "
        "number of steps (saved as OUT/plan.json), then exactly that many steps run (docs/training.md)",
    )
    p.add_argument("--search-shape", action="store_true",
                   help="with --budget and no --config: choose the shape among the family's presets too "
                   "(docs/training.md)")
    p.add_argument("--plan", metavar="PLAN_JSON", help="replay a saved plan.json exactly (no probe)")
    p.add_argument("--resume", action="store_true", help="continue the training saved in MODEL_DIR/training_state")
    add_overwrite_arg(p)
    p.add_argument("--tokenizer", metavar="DIR", help="check that this tokenizer made the shards")
    p.add_argument(
        "--init",
        metavar="MODEL_DIR",
        help="continue pretraining this model folder (same family) on new shards: domain-adaptive pretraining; "
        "its config and weights are the start, its tokenizer must have made the shards",
    )
    add_compute_args(p)
    p.add_argument("--compile", action="store_true", default=None,
                   help="run the training forward through torch.compile: a minute or more of compilation before "
                   "the first step, off by default (docs/training.md has the measurements); saved with the run")
    add_json_arg(p)
    p.set_defaults(func=run, reads=("--data", "--init", "--tokenizer", "--plan", "--config"), writes=("--out",))


def format_metrics(val: dict[str, float]) -> str:
    """A two-column table of metric name and value (4 significant digits)."""
    width = max([len("metric"), *(len(k) for k in val)])
    lines = [f"{'metric':<{width}}  value", f"{'-' * width}  {'-' * 10}"]
    for k, v in val.items():
        lines.append(f"{k:<{width}}  {fmt(float(v), k)}")
    return "\n".join(lines)


def check_val_split(data_dir: str) -> None:
    """Refuse shards without a validation split before training (pretraining ends with a validation)."""
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


def _replacing(args) -> bool:
    """Whether this run replaces a folder at --out (``--overwrite`` over something there): then the new model
    is trained beside it and swapped in when complete, which one process does alone."""
    if not args.overwrite:
        return False
    if os.environ.get("RANK", "0") == "0":
        recover_folder(args.out, writer=True)  # a replacement cut short: its old folder back first, then decide
    if folder_kind(args.out) is None:
        return False
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise LmforgeError(f"--overwrite trains the new model beside {args.out} and swaps it in when complete, which "
                           f"a torchrun job cannot share; move {args.out} away or choose another --out")
    return True


@contextlib.contextmanager
def _replacement(out: Path, replacing: bool):
    """The folder the run trains into: ``out`` itself, or with ``--overwrite`` over a folder a new one beside it,
    which takes its place when complete.  A divergence there discards it: its message names ``out`` instead
    (its advice to ``--resume`` from the discarded folder's checkpoint no longer holds)."""
    if not replacing:
        yield out
        return
    with staged_folder(out, "model") as tmp:
        try:
            yield tmp
        except LmforgeError as e:
            if str(tmp) not in str(e) or "non-finite" not in str(e):
                raise
            raise LmforgeError(f"{str(e).split(';')[0]}; the new run is discarded and {out} is as it was: start "
                               f"again with a lower learning rate (--set lr=...)") from None


def run(args) -> int:
    refuse_flag_keys(args.overrides)
    run_config = resolve_run(run_request(args))  # every setting, checked before --out is touched
    check_val_split(args.data)
    replacing = _replacing(args)
    # an existing model is continued (--resume) or refused by the run itself, which names --resume too
    with output_folder(args.out, "model", args.overwrite, inputs=[args.data, args.init, args.tokenizer],
                       existing="continue", beside=replacing) as out:
        with _replacement(out, replacing) as target:
            if args.resume:
                restore_model_config(out)
            if run_config.budget is not None or run_config.plan is not None:
                plan = plan_run(run_config, args.data)
                say(args, plan.describe())
                result = run_plan(plan, args.data, target, tokenizer_dir=args.tokenizer, compute=run_config.compute)
            else:
                result = train_run(run_config, args.data, target, tokenizer_dir=args.tokenizer)
    if replacing:
        result = dataclasses.replace(result, out_dir=Path(args.out))
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun only rank 0 reports
    show(args, _record(result), lambda: _summary(args, result))
    return 0


def _record(result) -> dict:
    """The full record of a run (``--json``): the result and the run's saved training config."""
    record = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(result).items()}
    saved = Path(result.out_dir) / "train_config.json"
    if saved.is_file():
        train = json.loads(saved.read_text(encoding="utf-8"))
        train.pop("model", None)
        train.pop("data", None)
        record["train_config"] = train
    return record


def _summary(args, result) -> list[str]:
    head = f"{args.family} model written to {result.out_dir}"
    if result.step is not None:
        head += f" after {result.step} steps"
        if result.tokens_seen:
            head += f" ({result.tokens_seen:,} tokens"
            head += f" in {fmt(result.elapsed)} s)" if result.elapsed else ")"
    if result.stop_reason == "max_time":
        head += "; time budget reached, continue with --resume"
    lines = [head]
    if result.train_loss is not None and result.step is not None:
        lines.append(f"last training loss {fmt(result.train_loss)}")
    lines += ["final validation metrics:", format_metrics(result.val)]
    if result.step is not None:
        lines.append(f"repeat this run with --config {result.out_dir}/train_config.json")
    return lines
