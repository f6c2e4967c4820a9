"""Which parameters train, and how: AdamW's groups, the ones a step leaves without a gradient, and the
loss-only forward that DDP wraps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..errors import LmforgeError

# Parameters of these modules are never weight-decayed (their 1-D weights are scales, not maps).
_NORM_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm)
if hasattr(nn, "RMSNorm"):
    _NORM_TYPES = (*_NORM_TYPES, nn.RMSNorm)

_NO_LOSS = "the model returned no loss: does the sampler produce labels?"


def param_groups(model: nn.Module, weight_decay: float) -> tuple[list[dict], list[str]]:
    """AdamW parameter groups: decay for matrices, none for biases, norm weights and other 1-D tensors.

    Embedding and Linear weights (2-D) are decayed and so are conv kernels, as nanoGPT does; the
    1-D rule alone already spares biases and LayerNorm gains, and the explicit norm-module check
    keeps any norm parameter out of decay whatever its shape.  Frozen parameters are left out.

    Returns:
        ``(groups, names)``: the two groups (decayed first) and the parameter names in optimizer
        index order (the index used in the checkpoint's ``opt.<idx>.*`` keys).
    """
    norm_ids = {id(p) for m in model.modules() if isinstance(m, _NORM_TYPES) for p in m.parameters(recurse=False)}
    decay: list[tuple[str, nn.Parameter]] = []
    no_decay: list[tuple[str, nn.Parameter]] = []
    for name, p in model.named_parameters():  # shared (tied) parameters appear once
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or id(p) in norm_ids else decay).append((name, p))
    groups = [
        {"params": [p for _, p in decay], "weight_decay": weight_decay},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0},
    ]
    return groups, [n for n, _ in decay] + [n for n, _ in no_decay]


def unused_parameters(model: nn.Module, make_batch: Callable[[], dict[str, Any]], autocast: Callable[[], Any],
                      device: torch.device) -> list[str]:
    """Names of trainable parameters that one forward/backward of ``make_batch()`` leaves without a gradient.

    Runs under a forked RNG (the batch is drawn there too), then clears the gradients, so the training run
    itself is unchanged.
    """
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        batch = make_batch()
        with autocast():
            out = model(**batch)
        if getattr(out, "loss", None) is None:
            raise LmforgeError(_NO_LOSS)
        out.loss.backward()
    names = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    return names


class LossOnly(nn.Module):
    """``model(**batch).loss`` as the whole forward output.

    DDP (with ``find_unused_parameters``) walks the autograd graph from every tensor a forward returns;
    logits that the loss does not use (BERT's NSP head when ``next_sentence=false``) would make their
    parameters look used and the gradient reduction would wait for them forever.  Returning only the
    loss avoids that, and the trainer needs nothing else from a training forward.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, **batch: Any) -> torch.Tensor:
        loss = getattr(self.model(**batch), "loss", None)
        if loss is None:
            raise LmforgeError(_NO_LOSS)
        return loss
