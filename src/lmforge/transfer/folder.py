"""A transfer run's folder, and the one-call entry point that trains, scores and writes one.

A run folder holds ``config.json`` (the :class:`~lmforge.transfer.config.TransferConfig`, the model folder,
the labels, what was chosen), ``metrics.json``, ``predictions.jsonl``, ``head.safetensors`` and, after
fine-tuning, ``body.safetensors`` (GPT's trained task-token rows otherwise: ``task_tokens.safetensors``),
plus its model card ``README.md``. :func:`save_run` writes one, :func:`load_run` opens one for prediction;
:func:`run_transfer` is ``lmforge finetune`` as a function.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..config import load_json, to_dict
from ..data.tasks import TaskData, check_labels, load_task
from ..devices import Compute, check_device, check_precision
from ..errors import CheckpointError, LmforgeError
from ..families import load
from ..storage.cards import update_card
from ..storage.checks import check_dtypes, check_recorded_weights, nonfinite_number, nonfinite_tensor
from ..storage.files import atomic_write_text, file_sha256, load_safetensors, save_json
from ..storage.writing import save_weights
from ..train.precision import describe, warn_if_emulated
from .config import TransferConfig, check_supported, saved_config
from .modes import DEFAULT_MODE
from .run import TransferRun

logger = logging.getLogger(__name__)


def _trained_tensors(run: TransferRun) -> dict[str, dict[str, torch.Tensor]]:
    """file name -> the tensors of ``run`` that the run folder keeps (what training changed)."""
    files = {"head.safetensors": {k: v.cpu() for k, v in run.model.head.state_dict().items()}}
    return {**files, **run.mode.trained_tensors(run)}  # the body (finetune) or GPT's task-token rows


def check_finite_run(run: TransferRun, files: dict[str, dict[str, torch.Tensor]], metrics: dict,
                     records: list[dict]) -> None:
    """Refuse, in one line, a run whose weights, metrics or predictions hold NaN or infinity (it diverged):
    such a run would predict nothing, and its metrics.json would not be JSON."""
    bad = next((f"{name} ({t})" for name, ts in files.items() if (t := nonfinite_tensor(ts)) is not None), None)
    bad = bad or next((f"{what} {key}" for what, rec in (("the metric", metrics), ("the prediction", records))
                       if (key := nonfinite_number(rec)) is not None), None)
    if bad is None:
        return
    lr = run.choices.get("lr") or run.cfg.lr
    used = f" (this run's was {lr:g})" if isinstance(lr, (int, float)) else ""
    raise LmforgeError(f"the training diverged: {bad} holds NaN or infinity; nothing was saved: train again with a "
                       f"lower learning rate{used}")


def save_run(run: TransferRun, out_dir: str | Path, metrics: dict, records: list[dict]) -> Path:
    """Write config.json, metrics.json, predictions.jsonl, head.safetensors (+ body.safetensors) of ``run``.

    A run that diverged (NaN or infinity in its weights, metrics or predictions) is refused before anything
    is written (:func:`check_finite_run`)."""
    files = _trained_tensors(run)
    check_finite_run(run, files, metrics, records)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, tensors in files.items():
        save_weights(tensors, out / name, "run")
    extra = {
        "model_dir": str(Path(run.model_dir).resolve()) if run.model_dir else None,
        "family": run.family,
        "labels": run.labels,
        "layer_ids": run.model.layer_ids,
        "num_states": run.num_states,
        "layer_mix": run.layer == "mix",
        "pool": run.fmt.pool,
        "choices": run.choices,
        "weights_sha256": run.vectors.weights_hash() if run.model_dir else None,
    }
    save_json({"transfer": to_dict(run.cfg), **extra}, out / "config.json")
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    atomic_write_text(out / "predictions.jsonl",
                      "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records))
    update_card(out)  # the run's model card (README.md), from the files written above
    return out


def _finite(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a run's weights file, checked against the hash its folder records; a run saved with NaN or
    infinity (by an older lmforge) is refused."""
    check_recorded_weights(path)
    tensors = load_safetensors(path)
    name = nonfinite_tensor(tensors)
    if name is not None:
        raise CheckpointError(f"{path} holds NaN or infinity ({name}): the run diverged when it was trained; train "
                              f"it again with a lower learning rate")
    return tensors


def load_run(run_dir: str | Path, device: str | None = None, precision: str | None = None) -> TransferRun:
    """Open a finished run folder for prediction: body (+ fine-tuned weights) and trained head.

    Args:
        run_dir: a folder written by ``lmforge finetune``.
        device: where to predict (``cpu``, ``cuda``, ``cuda:N``, ``auto``); None = the run's own setting.
        precision: ``fp32``, ``bf16``, ``fp16`` (CUDA) or ``auto``; None = the precision the run trained in.
    """
    p = Path(run_dir)
    if not (p / "config.json").is_file() or not (p / "head.safetensors").is_file():
        raise CheckpointError(
            f"{p} is not a transfer run folder (needs config.json and head.safetensors from finetune)"
        )
    data = load_json(p / "config.json")
    if "transfer" not in data:
        raise CheckpointError(f"{p / 'config.json'} is not a transfer run config")
    cfg = saved_config(data, p)
    if device is not None:
        cfg = dataclasses.replace(cfg, device=check_device(device))
    if precision is not None:
        cfg = dataclasses.replace(cfg, precision=check_precision(precision))
    model_dir = data.get("model_dir")
    if not model_dir or not Path(model_dir).is_dir():
        raise CheckpointError(f"the run's model folder {model_dir} is gone; the run needs it to predict")
    body = load(model_dir)
    if cfg.transfer_mode.reads_model_weights and data.get("weights_sha256"):
        if file_sha256(Path(model_dir) / "model.safetensors") != data["weights_sha256"]:
            raise CheckpointError(f"{model_dir} changed since this run was trained; retrain the run on this model")
    run = TransferRun(body, cfg, data["labels"], model_dir)  # (GPT: adds its task tokens to the body first)
    warn_if_emulated(run.cfg.precision, run.device)
    run.mode.restore(run, p, _finite)  # the fine-tuned body, or GPT's trained task-token rows
    run.num_states = data.get("num_states")
    run.choices = data.get("choices", {})
    ids = data["layer_ids"]
    run.extract_ids = list(ids)
    run.build(ids)
    head_state = _finite(p / "head.safetensors")
    check_dtypes(head_state, run.model.head.state_dict(), p / "head.safetensors")
    try:
        run.model.head.load_state_dict(head_state)
    except RuntimeError as e:
        raise CheckpointError(f"{p / 'head.safetensors'} does not fit the run's config ({str(e)[:120]})") from None
    run.model.eval()
    return run


def as_data(d: TaskData | str | Path, task: str, labelled: bool = True) -> TaskData:
    """``d`` itself, or the data file ``d`` read as ``task``."""
    return d if isinstance(d, TaskData) else load_task(d, task, labelled)


def load_body(model: nn.Module | str | Path) -> tuple[nn.Module, str | None]:
    """A loaded body and its folder (None when ``model`` is already a module)."""
    if isinstance(model, nn.Module):
        return model, None
    return load(model), str(model)


def fit_summary(run: TransferRun, facts: dict, n_train: int, n_test: int | None = None) -> dict:
    """What ``metrics.json`` says of a fitted run besides its test metrics: the validation score the choices
    were made on, the choices, the run's kind and sizes, its training loss and time, a ScalarMix's weights."""
    metric = run.spec.main_metric(run.labels)
    out = {
        f"val_{facts.get('val_metric', metric)}": facts["val_score"],
        "task": run.cfg.task,
        "mode": run.cfg.mode,
        "family": run.family,
        "from_scratch": run.cfg.from_scratch,
        "n_train": n_train,
        **({"n_test": n_test} if n_test is not None else {}),
        "choices": facts["choices"],
        "train_loss": facts["train_loss"],  # the task's loss; GPT's auxiliary LM loss is aux_lm_loss
        "train_seconds": facts["train_seconds"],
    }
    if run.model.head.scalar_mix is not None:
        out["layer_weights"] = [round(w, 4) for w in run.model.head.layer_weights()]
        out["gamma"] = round(run.model.head.gamma(), 4)
    if facts.get("aux_lm_loss") is not None:
        out["aux_lm_loss"] = facts["aux_lm_loss"]
    if run.cfg.freeze_layers is not None:
        out["freeze_layers"] = run.cfg.freeze_layers
    return out


def run_transfer(
    model: nn.Module | str | Path,
    task: str,
    train: TaskData | str | Path,
    test: TaskData | str | Path,
    mode: str = DEFAULT_MODE,
    out_dir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    compute: Compute | None = None,
    **options,
) -> dict:
    """Carry a pretrained body over to a labelled task and measure it.

    Args:
        model: a model folder (any family) or a loaded body with ``.tokenizer``.
        task: ``classify``, ``pair``, ``tokens``, ``qa`` or ``choice``.
        train, test: data files (see :mod:`lmforge.data.tasks`) or loaded :class:`TaskData`.
        mode: ``frozen``, ``features`` or ``finetune``.
        out_dir: when given, the run folder (metrics.json, predictions.jsonl, config.json, weights).
        progress: called with a line per epoch.
        compute: the command's device and precision (:class:`lmforge.devices.Compute`), resolved once; default:
            resolved from the ``device`` and ``precision`` options.
        **options: any other :class:`TransferConfig` field (epochs, lr, lr_grid, freeze_layers, ...).
    Returns:
        The metrics dict (also written to ``out_dir/metrics.json``): the task's metrics on ``test``,
        ``val_<metric>`` (the validation score the choices were made on: the held-out split, or the
        cross-validated accuracy of features + logreg), ``choices`` (epoch, lr, layer, strength), plus
        ``mode``, ``family``, ``n_train``, ``n_test``, ``train_loss``, ``train_seconds`` and, with a
        ScalarMix, ``layer_weights`` and ``gamma``.
    """
    try:
        cfg = TransferConfig(task=task, mode=mode, **options)
    except TypeError as e:
        raise LmforgeError(f"invalid transfer settings: {e}") from None
    body, model_dir = load_body(model)
    check_supported(getattr(body, "model_type", None), cfg)
    train_d = as_data(train, task)
    test_d = as_data(test, task)
    check_labels(train_d, test_d)
    run = TransferRun(body, cfg, train_d.labels, model_dir, compute)
    logger.info("%s", describe(cfg.precision, run.cfg.precision, run.device))  # the choice, saved in config.json
    facts = run.fit(train_d, progress)
    metrics, records = run.evaluate(test_d)
    result = {**{k: round(v, 6) for k, v in metrics.items()}, **fit_summary(run, facts, len(train_d), len(test_d))}
    if out_dir is not None:
        save_run(run, out_dir, result, records)
    return result
