"""Validation during training: mean loss and model metrics over fixed seeded batches, over all ranks."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..errors import LmforgeError
from . import compute
from . import precision as prec
from .config import TrainConfig
from .distributed import DistEnv, all_reduce_sum
from .rows import first_row, row_rngs


def _ppl(x: float) -> float:
    return math.exp(x) if x < 700 else float("inf")


def add_perplexities(metrics: dict[str, float]) -> dict[str, float]:
    """Add ``<name>_ppl = exp(<name>_loss)`` for every ``*_loss`` key, and ``ppl = exp(loss)``.

    ``ppl`` is left out when the model reports two or more ``*_loss`` parts: a loss that is a sum
    of parts (BERT's MLM + NSP, ELMo's forward + backward NLL) has no perplexity of its own, and
    the parts' perplexities (``mlm_ppl``, ``lm_ppl``) are the meaningful figures.
    """
    out = dict(metrics)
    if "loss" in metrics and sum(k.endswith("_loss") for k in metrics) < 2:
        out["ppl"] = _ppl(metrics["loss"])
    for k, v in metrics.items():
        if k.endswith("_loss"):
            out[k[: -len("_loss")] + "_ppl"] = _ppl(v)
    return out


@torch.no_grad()
def evaluate(
    model: nn.Module, sampler: Any, config: TrainConfig, env: DistEnv, device: torch.device, split: str = "val"
) -> dict[str, float]:
    """Mean ``loss`` and model metrics over ``eval_batches`` fixed global batches of ``split`` (all ranks).

    Each eval batch holds ``batch_size * grad_accum * world_size`` rows, seeded
    ``[seed, 1, eval_batch, global_row]``; micro-batch means are averaged (equal weights), a metric over the
    micro-batches that define it (a NaN metric, such as an AUC without positives, is left out).

    Returns:
        ``{"loss", "ppl", <metric>, <name>_ppl for each <name>_loss}`` as floats.
    """
    cfg = config
    was_training = model.training
    model.eval()
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, torch.Tensor] = {}  # the batches that defined each metric
    # Evaluation must not move the training RNG, or eval_every would change the training run.
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for b in range(cfg.eval_batches):
            # An eval batch has the rows of a global training batch, split over ranks and micro-batches
            # the same way, so validation sees the same rows however the global batch is divided.
            for m in range(cfg.grad_accum):
                rngs = row_rngs(cfg.seed, "val", b, first_row(m, cfg.batch_size, env), cfg.batch_size)
                batch = sampler.batch(rngs, split)
                with prec.autocast(device, cfg.precision):
                    out = model(**compute.to_device(batch, device))
                if out.loss is None:
                    raise LmforgeError("the model returned no validation loss: does the sampler produce labels?")
                values = {"loss": out.loss, **(getattr(out, "metrics", None) or {})}
                for k, v in values.items():
                    v = torch.as_tensor(v, device=device).detach().float().reshape(())
                    # a metric a batch cannot define (NaN: an AUC without a replaced token) is left out of
                    # that batch's count; the loss always counts, so a diverged run still shows NaN
                    n = torch.ones((), device=device) if k == "loss" else (~v.isnan()).float()
                    v = v if k == "loss" else torch.where(v.isnan(), torch.zeros_like(v), v)
                    sums[k], counts[k] = (sums[k] + v, counts[k] + n) if k in sums else (v, n)
    model.train(was_training)
    keys = sorted(sums)
    total = all_reduce_sum(torch.stack([sums[k] for k in keys] + [counts[k] for k in keys]).double(), env)
    means = {k: _mean(float(total[i].item()), float(total[len(keys) + i].item())) for i, k in enumerate(keys)}
    return add_perplexities(means)


def _mean(total: float, count: float) -> float:
    return total / count if count else float("nan")
