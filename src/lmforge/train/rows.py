"""Which rows a step reads: every row is a pure function of its own seeded generator.

Row ``g`` (the global row index over processes and micro-batches) of optimizer step ``s`` is drawn
with ``np.random.default_rng([seed, 0, s, g])``; row ``g`` of evaluation batch ``b`` with
``[seed, 1, b, g]``.  Micro-batch ``m`` of process ``rank`` holds rows ``m*B*W + rank*B + j``
(``B`` = batch size per process, ``W`` = world size), so the global batch is the same set of rows
however it is divided over processes and micro-batches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .distributed import DistEnv


def row_rngs(seed: int, split: str, outer: int, first_row: int, batch_size: int) -> list[np.random.Generator]:
    """One generator per row of a micro-batch: ``[seed, 0|1, step|eval_batch, global_row]``."""
    tag = 0 if split == "train" else 1
    return [np.random.default_rng([seed, tag, outer, first_row + j]) for j in range(batch_size)]


def first_row(micro: int, batch_size: int, env: DistEnv) -> int:
    """The global index of the first row of micro-batch ``micro`` on this process."""
    return micro * batch_size * env.world_size + env.rank * batch_size


def count_tokens(batch: dict[str, Any]) -> int:
    """Tokens in a batch: the attention mask's sum when there is one, else ``input_ids.numel()``."""
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        return int(mask.sum())
    ids = batch.get("input_ids")
    if isinstance(ids, torch.Tensor):
        return ids.numel()
    for v in batch.values():  # e.g. ELMo character ids (B, T, max_chars): count positions
        if isinstance(v, torch.Tensor) and v.ndim >= 2:
            return v.shape[0] * v.shape[1]
    return 0
