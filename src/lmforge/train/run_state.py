"""A Trainer's checkpoint: what goes into ``training_state/``, what a resumed run takes back, and the guard
that keeps non-finite weights out of it.

The files and their atomic replacement are :mod:`lmforge.train.checkpoint`'s.  This module decides what a
:class:`~lmforge.train.trainer.Trainer` saves (counters, optimizer, scheduler, grad scaler, every rank's RNG,
the train and model configs) and refuses a state whose weights or loss are not finite, so that ``--resume``
always starts from a usable one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from ..config import to_dict
from ..errors import CheckpointError, LmforgeError
from ..storage.checks import nonfinite_tensor
from . import checkpoint as ckpt
from . import compute
from . import precision as prec
from .config import TrainConfig
from .distributed import DistEnv, any_rank
from .rows import first_row, row_rngs
from .schedule import restore_scheduler, scheduler_state

logger = logging.getLogger(__name__)


class Trainer(Protocol):
    """What a checkpoint saves of :class:`lmforge.train.trainer.Trainer` and a resume sets back (the trainer
    imports this module, so this one names the members instead of importing the class)."""

    config: TrainConfig
    env: DistEnv
    out_dir: Path
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler | None
    param_names: list[str]
    step: int
    tokens_seen: int
    elapsed_before: float


# -- never save what cannot be resumed ----------------------------------------------------------------
def nonfinite_parameter(model: nn.Module, env: DistEnv) -> str | None:
    """The name of the first parameter holding NaN or infinity (over all ranks), or ``None``."""
    bad = nonfinite_tensor(dict(model.named_parameters()))
    return bad if any_rank(bad is not None, env) else None


@torch.no_grad()
def loss_is_finite(model: nn.Module, sampler: Any, config: TrainConfig, env: DistEnv, device: torch.device,
                   step: int) -> bool:
    """Whether the current weights give a finite loss on step ``step``'s first micro-batch (all ranks).

    Weights can be finite yet already unusable (attention scores that overflow): such a state
    must not become the checkpoint a ``--resume`` starts from.  One forward in eval mode, on a
    forked RNG, so the training run itself is unchanged.
    """
    was_training = model.training
    model.eval()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        rngs = row_rngs(config.seed, "train", step, first_row(0, config.batch_size, env), config.batch_size)
        batch = sampler.batch(rngs, "train")
        with prec.autocast(device, config.precision):
            loss = getattr(model(**compute.to_device(batch, device)), "loss", None)
    model.train(was_training)
    ok = loss is None or bool(torch.isfinite(loss.detach().float()).all())
    return not any_rank(not ok, env)


def diverged_error(what: str, step: int, lr: float, out_dir: Path) -> LmforgeError:
    """The error for a run whose loss or weights became non-finite: how to resume with a lower lr."""
    lower = f"{lr / 10:g}"
    state = ckpt.find_state_dir(out_dir)
    if state is not None:
        try:
            saved = int(json.loads((state / "state.json").read_text(encoding="utf-8"))["step"])
        except (OSError, ValueError, KeyError, TypeError):
            saved = None
        at = f" (step {saved})" if saved is not None else ""
        how = (f"the last finite checkpoint{at} in {out_dir} is kept: continue from it with a lower "
               f"learning rate by adding --resume --set lr={lower} to the same command")
    else:
        how = f"no checkpoint was saved yet: start again with a lower learning rate, e.g. --set lr={lower}"
    return LmforgeError(
        f"{what} at step {step}; nothing non-finite was saved; {how} "
        f"(or raise warmup_steps, keep grad_clip on)"
    )


# -- what a checkpoint holds ----------------------------------------------------------------------------
def state_files(trainer: Trainer, rngs: list[dict[str, torch.Tensor]], elapsed: float
                ) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
    """``(files, state)`` for :func:`lmforge.train.checkpoint.write_state_dir`: tensors, and JSON counters.

    The state also records the model config, so a kill after the first state but before the model
    folder's ``config.json`` still leaves a folder that ``--resume`` continues.
    """
    opt_tensors, opt_meta = ckpt.flatten_optimizer(trainer.optimizer.state_dict())
    rng_tensors = {f"rng.{kind}.{r}": t for r, st in enumerate(rngs) for kind, t in st.items()}
    state = {
        "step": trainer.step,
        "tokens_seen": trainer.tokens_seen,
        "elapsed": elapsed,
        "world_size": trainer.env.world_size,
        "seed": trainer.config.seed,
        "scheduler": scheduler_state(trainer.scheduler),
        "optimizer": opt_meta,
        "param_names": trainer.param_names,
        "train_config": to_dict(trainer.config),
    }
    if trainer.scaler is not None:
        state["grad_scaler"] = trainer.scaler.state_dict()
    model = trainer.model
    model_config = getattr(model, "config", None)
    if dataclasses.is_dataclass(model_config) and getattr(model, "model_type", None):
        state["model_config"] = {"model_type": model.model_type, **to_dict(model_config)}
    files = {
        "model.safetensors": model.state_dict(),
        "optimizer.safetensors": opt_tensors,
        "rng.safetensors": rng_tensors,
    }
    return files, state


# -- taking it back -------------------------------------------------------------------------------------
def restore(trainer: Trainer) -> Path:
    """Load ``trainer.out_dir``'s training state into the trainer; returns the state folder.

    Hyperparameters come from the trainer's *current* config (so ``--set lr=...`` on resume takes effect
    from there); with an unchanged config the run is bit-identical to an uninterrupted one.
    """
    path, state, files = ckpt.read_state_dir(trainer.out_dir)
    where = f"the training state in {path}"
    if state.get("param_names") != trainer.param_names:
        raise CheckpointError(f"{where} was saved for a different model (its parameters differ from this config's)")
    try:
        trainer.model.load_state_dict(files["model.safetensors"])
        opt = ckpt.unflatten_optimizer(files["optimizer.safetensors"], state["optimizer"])
        trainer.optimizer.load_state_dict(opt)
    except (KeyError, ValueError, RuntimeError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{where} does not fit this model: {msg}") from None
    _restore_hyperparameters(trainer, state)
    trainer.step = int(state["step"])
    trainer.tokens_seen = int(state["tokens_seen"])
    trainer.elapsed_before = float(state.get("elapsed", 0.0))
    _restore_rng(trainer, state, files["rng.safetensors"])
    return path


def _restore_hyperparameters(trainer: Trainer, state: dict[str, Any]) -> None:
    """The optimizer groups, grad scaler and schedule of the state, with the current config's hyperparameters."""
    cfg, optimizer = trainer.config, trainer.optimizer
    for group, wd in zip(optimizer.param_groups, (cfg.weight_decay, 0.0)):
        group.update(betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=wd, initial_lr=cfg.lr)
    if trainer.scaler is not None and "grad_scaler" in state:
        trainer.scaler.load_state_dict(state["grad_scaler"])
    n_groups = len(optimizer.param_groups)
    restore_scheduler(trainer.scheduler, {**state["scheduler"], "base_lrs": [cfg.lr] * n_groups})


def _restore_rng(trainer: Trainer, state: dict[str, Any], rng: dict[str, torch.Tensor]) -> None:
    """This rank's saved RNG states; with another world size, dropout is reseeded (the data order is kept)."""
    env = trainer.env
    keys = {kind: f"rng.{kind}.{env.rank}" for kind in ("cpu", "cuda")}
    mine = {kind: rng[key] for kind, key in keys.items() if key in rng}
    if int(state.get("world_size", 1)) == env.world_size and "cpu" in mine:
        ckpt.set_rng_states(mine)
        return
    if env.is_main:
        logger.warning(
            "checkpoint was written by %s process(es), this run has %d: dropout RNG reseeded, "
            "the data order is unchanged",
            state.get("world_size"),
            env.world_size,
        )
    seed_dropout(trainer.config.seed, trainer.step, env.rank)


def seed_dropout(seed: int, step: int, rank: int) -> None:
    """Seed torch's RNG (dropout) for a run starting at ``step`` on ``rank``."""
    torch.manual_seed(int(np.random.SeedSequence([seed, 2, step, rank]).generate_state(1)[0]))
