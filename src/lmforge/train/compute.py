"""How a training step computes on its device: the optimizer, batches on the device, precision auto's probe, compile.

The Trainer's loop asks this module rather than spelling each choice itself:

- :func:`make_optimizer`: AdamW, fused where torch has a fused kernel for the device (CUDA and, since
  torch 2.4, CPU): one kernel over all parameters instead of a dozen passes per tensor list, which is
  what a step of a model made of many small tensors spends its optimizer time on.
- :func:`to_device`: a batch on the device; on a GPU through pinned memory with non-blocking copies, so
  the copy of the next step's batch overlaps the current step's kernels (the Trainer builds that batch
  while the GPU still works: it reads nothing back from the device between log steps).
- :func:`precision_probe`: the step ``--precision auto`` times in fp32 and bf16 (a real batch, forward
  and backward, under a forked RNG; the gradients are cleared afterwards).
- :func:`compile_model`: ``torch.compile`` of the training forward, for ``--compile``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import precision as prec


def fused_adamw_available(device: torch.device) -> bool:
    """Whether this torch has a fused AdamW kernel for ``device`` (CUDA; CPU from torch 2.4)."""
    return _fused_adamw(device.type)


@functools.cache
def _fused_adamw(kind: str) -> bool:
    if "fused" not in inspect.signature(torch.optim.AdamW).parameters:
        return False
    if kind == "cuda":
        return True
    if kind == "cpu":
        try:  # torch < 2.4 refuses fused=True for CPU parameters when the optimizer is built
            torch.optim.AdamW([nn.Parameter(torch.zeros(1))], fused=True)
        except (RuntimeError, ValueError):
            return False
        return True
    return False


def make_optimizer(groups: list[dict], lr: float, betas: tuple[float, float], eps: float,
                   device: torch.device) -> torch.optim.AdamW:
    """AdamW over ``groups`` (fused where :func:`fused_adamw_available`); the state dict is the same either way."""
    fused = {"fused": True} if fused_adamw_available(device) else {}
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **fused)


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``batch`` with its tensors on ``device``; on CUDA pinned first and copied without blocking the host."""
    if device.type != "cuda":
        return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
    return {k: (v.pin_memory().to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
            for k, v in batch.items()}


def precision_probe(model: nn.Module, batch: Callable[[], dict[str, Any]],
                    device: torch.device) -> Callable[[str], Callable[[], None]]:
    """``step(precision)`` for :func:`lmforge.train.precision.choose_precision`: one forward and backward of
    ``model`` on ``batch()`` (built once, on the first call) under that precision's autocast."""
    cache: dict[str, dict] = {}

    def step(precision: str) -> Callable[[], None]:
        def run() -> None:
            if "batch" not in cache:
                cache["batch"] = batch()
            with prec.autocast(device, precision):
                loss = model(**cache["batch"]).loss
            loss.backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        return run

    return step


@contextlib.contextmanager
def probing(model: nn.Module, device: torch.device):
    """Around a probe: the RNG streams forked (a run's dropout masks do not depend on whether it probed) and
    the gradients the probe leaves cleared."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            yield
        finally:
            model.zero_grad(set_to_none=True)


def compile_model(module: nn.Module) -> nn.Module:
    """``torch.compile(module)`` (inductor); the first steps of a run pay the compilation."""
    return torch.compile(module)


__all__ = ["fused_adamw_available", "make_optimizer", "to_device", "precision_probe", "probing", "compile_model"]
