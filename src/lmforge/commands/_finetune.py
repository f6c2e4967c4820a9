"""What ``lmforge finetune`` adds around :func:`lmforge.transfer.run_transfer`: the run file and ``--set``, the
held-out test split, the progress bar and the summary.

Settings come, last one winning, from the TransferConfig defaults, a run file (``--config``: a finished
run's ``config.json``, or a ``.toml`` / ``.json`` / ``.yaml`` file of transfer keys, flat or under
``[transfer]``), ``--set KEY=VALUE`` (the keys without a flag of their own) and the flags. One key is the
command's, not the transfer's: ``log`` (``jsonl``, or ``tensorboard`` for event files in the run folder too), the
same key ``lmforge pretrain`` takes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from ..config import from_dict, load_config_file, parse_overrides
from ..errors import ConfigError, LmforgeError
from ..train.precision import resolve_device
from ..train.tblog import LOG_CHOICES
from ..transfer.config import TransferConfig
from ..transfer.modes import DEFAULT_MODE
from ._common import add_set_arg, fmt, pairs

# flags whose value means "not given" (booleans: the state a flag changes)
_UNSET = {"from_scratch": False, "both_orders": False}


def add_run_file_args(p: argparse.ArgumentParser) -> None:
    """``--config`` (a run file) and ``--set`` (transfer keys that have no flag)."""
    p.add_argument(
        "--config", metavar="FILE", default=None,
        help="transfer settings from a file: a finished run's config.json (repeats that run) or a .toml / .json / "
        ".yaml file of TransferConfig keys (flat or under [transfer]); --set and the flags override it",
    )
    add_set_arg(p, "transfer keys without a flag of their own, e.g. --set dropout=0.2 warmup=0.1 weight_decay=0 "
                   "head_hidden=256 cv_folds=3; log=tensorboard also writes TensorBoard event files into --out (train "
                   "loss per epoch, test metrics), as pretrain's --set log=tensorboard does")


def _fields() -> set[str]:
    return {f.name for f in dataclasses.fields(TransferConfig)}


def _flag(key: str) -> str:
    return "--no-refit" if key == "refit" else "--" + key.replace("_", "-")


def read_run_file(path: str | Path) -> dict[str, Any]:
    """The transfer keys of a run file (see the module docstring)."""

    data = load_config_file(path)
    section = data.get("transfer", data)
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: 'transfer' must be a table of settings")
    return dict(section)


def _log_choice(value: Any) -> str:
    if value not in LOG_CHOICES:
        raise ConfigError(f"log must be {' or '.join(LOG_CHOICES)}, got {value!r}")
    return value


def transfer_settings(args: argparse.Namespace) -> tuple[str, str, dict[str, Any], str]:
    """``(task, mode, options, log)``: ``options`` for :func:`run_transfer` from the run file, ``--set`` and the
    flags, and how the command logs the run (``log``: jsonl or tensorboard)."""
    fields = _fields()
    flagged = {k for k in vars(args) if k in fields}
    merged: dict[str, Any] = read_run_file(args.config) if args.config else {}
    over = parse_overrides(args.overrides)
    for key in over:
        if key in flagged:
            raise LmforgeError(f"--set {key}=... has a flag of its own here; use {_flag(key)}")
    merged.update(over)
    log = _log_choice(merged.pop("log", "jsonl"))
    typed = from_dict(TransferConfig, {"task": merged.get("task", "classify"), **merged}) if merged else None
    options = {k: getattr(typed, k) for k in merged} if typed is not None else {}
    for key in flagged:
        value = getattr(args, key)
        if value is not None and _UNSET.get(key, object()) != value and not (key == "refit" and value is True):
            options[key] = value
    task, mode = options.pop("task", None), options.pop("mode", None)
    if task is None:
        raise LmforgeError("give --task (classify, pair, tokens, qa or choice), or a --config that names it")
    return task, mode or DEFAULT_MODE, options, log


# -- the summary ----------------------------------------------------------------------------------------------

_NOT_METRICS = {"n_train", "n_test", "train_loss", "aux_lm_loss", "train_seconds", "gamma", "freeze_layers"}


def _choices_line(choices: dict) -> str | None:
    if not choices:
        return None
    parts = []
    scalars = {k: v for k, v in choices.items() if not isinstance(v, (dict, list))}
    if scalars:
        parts.append(pairs(scalars))
    refit = choices.get("refit")
    if isinstance(refit, dict):
        parts.append(f"then refit on all {refit.get('examples')} examples for {refit.get('epochs')} epochs")
    trials = choices.get("lr_trials")
    if trials:
        parts.append("lr trials " + ", ".join(f"{fmt(t['lr'], 'lr')} -> {fmt(t['val_score'])}" for t in trials))
    return "chosen on the validation split: " + "; ".join(p for p in parts if p)


def summary(record: dict, out: str, held_out: str | None, log: str = "jsonl") -> list[str]:
    """The lines a person reads after a finetune run."""
    scratch = ", from scratch" if record.get("from_scratch") else ""
    metrics = {k: v for k, v in record.items() if k not in _NOT_METRICS and not k.startswith("val_")}
    lines = [f"{record['task']} on {record['family']} ({record['mode']}{scratch}): {pairs(metrics)} "
             f"on {record['n_test']} test examples ({record['n_train']} trained on)"]
    val = {k: v for k, v in record.items() if k.startswith("val_") and v is not None}
    if val:
        lines.append("validation: " + pairs(val))
    choices = _choices_line(record.get("choices") or {})
    if choices:
        lines.append(choices)
    loss = f"train loss {fmt(record.get('train_loss'))}" if record.get("train_loss") is not None else "fitted"
    if record.get("aux_lm_loss") is not None:
        loss += f" (auxiliary LM loss {fmt(record['aux_lm_loss'])}, reported apart)"
    saved = Path(out) / "config.json"
    where = ""
    if saved.is_file():

        cfg = json.loads(saved.read_text(encoding="utf-8")).get("transfer", {})
        where = f", precision {cfg.get('precision')} on {resolve_device(cfg.get('device') or 'auto')}"
    lines.append(f"{loss} in {fmt(record.get('train_seconds'))} s{where}")
    if held_out:
        lines.append(held_out)
    lines.append(f"wrote {out}/metrics.json, predictions.jsonl, config.json and the weights; repeat the run with "
                 f"--config {out}/config.json")
    if log == "tensorboard":
        lines.append(f"TensorBoard event files in {out}: tensorboard --logdir {out}")
    return lines
