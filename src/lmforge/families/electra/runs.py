"""ELECTRA's side of ``lmforge export-hf RUN``: an ELECTRA transfer run as ``ElectraFor...`` of HF ``transformers``.

:mod:`lmforge.interop.runs` checks and folds the head and calls these (the :class:`~lmforge.interop.runs.RunExport`
interface).  The run's body is the discriminator: its weights map with :mod:`lmforge.families.electra.hf` (the
generator and the replaced-token head stay behind).  ELECTRA reads BERT's inputs, so the tokenizer files, the pool
check and the token / QA heads are BERT's (:mod:`lmforge.families.bert.runs`):

- ``ElectraForTokenClassification`` / ``ElectraForQuestionAnswering``: the head's Linear becomes ``classifier`` /
  ``qa_outputs`` on the top layer, as for BERT;
- ``ElectraForSequenceClassification`` reads the raw top ``[CLS]`` vector (``--pool cls``; ``--pool mean``, the
  frozen and features default for single texts, is refused; fine-tuning defaults to ``cls``) through HF's
  ``ElectraClassificationHead``:
  ``out_proj(gelu(dense(x)))``, ``dense`` C x C.  The run's head is one Linear ``z = W x + b`` (K labels); it maps
  exactly through the identity ``gelu(z) - gelu(-z) = z`` (``gelu(z) = z Φ(z)`` and ``Φ(z) + Φ(-z) = 1``):
  ``dense`` holds ``W``, ``b`` in its first K rows and ``-W``, ``-b`` in the next K (the rest zero, and
  ``gelu(0) = 0``), and ``out_proj`` subtracts the second half from the first.  This needs 2K <= C; a run with
  more labels is refused.
"""

from __future__ import annotations

import torch

from ...errors import LmforgeError
from ..bert.runs import check_pool, task_linear, write_tokenizer
from .hf import DISCRIMINATOR, hf_config_dicts, to_hf_state_dicts

#: TaskSpec.hf_head -> the HF class an ELECTRA run of that task exports to
HEADS = {
    "SequenceClassification": "ElectraForSequenceClassification",
    "TokenClassification": "ElectraForTokenClassification",
    "QuestionAnswering": "ElectraForQuestionAnswering",
}


def check(data: dict, arch: str) -> list[tuple[str, str]]:
    """A sentence run must read the top ``[CLS]`` (the one read-out HF's class has)."""
    return check_pool(data, arch, "cls", "the top [CLS] vector")


@torch.no_grad()
def classification_head(W: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
    """HF's ``classifier.dense`` and ``classifier.out_proj`` computing ``W x + b`` exactly (see the module docstring).

    Args:
        W: (K, C) the run's folded output weights; b: (K,) its bias.
    Returns:
        The four float32 tensors of ``ElectraClassificationHead``.
    Raises:
        LmforgeError: 2K > C, too many labels for the identity to fit in ``dense``.
    """
    K, C = W.shape
    if 2 * K > C:
        raise LmforgeError(f"this run has {K} labels; ElectraForSequenceClassification's head (dense {C} x {C}, "
                           f"GELU, out_proj) carries a Linear head exactly for at most {C // 2} labels (hidden "
                           "size / 2), so it cannot be exported exactly")
    dense_w, dense_b = W.new_zeros(C, C), b.new_zeros(C)  # (C, C), (C,)
    dense_w[:K], dense_w[K:2 * K] = W, -W
    dense_b[:K], dense_b[K:2 * K] = b, -b
    eye = torch.eye(K, dtype=W.dtype)
    out_w = torch.cat([eye, -eye, W.new_zeros(K, C - 2 * K)], dim=1)  # (K, C): first half minus second half
    head = {"dense.weight": dense_w, "dense.bias": dense_b, "out_proj.weight": out_w, "out_proj.bias": b.new_zeros(K)}
    return {f"classifier.{k}": v.float().contiguous() for k, v in head.items()}


def weights(run, arch: str, W: torch.Tensor, b: torch.Tensor) -> tuple[dict, dict]:
    """The HF state dict and ``config.json`` of the run: the discriminator without its replaced-token head, plus
    the task head made from ``W`` (K, C), ``b`` (K,)."""
    body = to_hf_state_dicts(run.body)[DISCRIMINATOR]
    state = {k: v for k, v in body.items() if not k.startswith("discriminator_predictions.")}
    head = classification_head(W, b) if arch == HEADS["SequenceClassification"] else task_linear(arch, W, b)
    return {**state, **head}, hf_config_dicts(run.body.config)[DISCRIMINATOR]


__all__ = ["HEADS", "check", "classification_head", "weights", "write_tokenizer"]
