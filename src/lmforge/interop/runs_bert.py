"""BERT's side of ``lmforge export-hf RUN``: a BERT transfer run as ``BertFor...`` of HF ``transformers``.

:mod:`lmforge.interop.runs` checks and folds the head and calls these (the :class:`~lmforge.interop.runs.RunExport`
interface).  The body's weights map with :mod:`lmforge.interop.bert`; the head's Linear becomes ``classifier``
(``qa_outputs`` for QA); the token and QA classes have no pooler.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ..config import load_json, save_json
from ..errors import LmforgeError
from .bert import hf_config_dict, to_hf_state_dict

#: TaskSpec.hf_head -> the HF class a BERT run of that task exports to
HEADS = {
    "SequenceClassification": "BertForSequenceClassification",
    "TokenClassification": "BertForTokenClassification",
    "QuestionAnswering": "BertForQuestionAnswering",
}
# how a BERT run reads a sentence, for the refusal of a read-out the pooler does not give
_POOLS = {"cls": "the raw top [CLS] (--pool cls)", "mean": "the mean of the token vectors (--pool mean)"}


def check(data: dict, arch: str, refuse: Callable[[str, str], LmforgeError]) -> None:
    """Refuse a sentence run that does not read ``[CLS]`` through the pooler (the one read-out HF's class has)."""
    pool = data.get("pool")
    if arch == HEADS["SequenceClassification"] and pool != "pooler":
        raise refuse(f"this run reads {_POOLS.get(pool, f'--pool {pool}')}, but BertForSequenceClassification reads "
                     "[CLS] through BERT's tanh pooler, so it cannot be exported exactly", "--pool pooler")


def weights(run, arch: str, W: torch.Tensor, b: torch.Tensor) -> tuple[dict, dict]:
    """The HF state dict and ``config.json`` of the run: its body without the pretraining heads, plus ``W``, ``b``."""
    state = {k: v for k, v in to_hf_state_dict(run.body).items() if not k.startswith("cls.")}
    if arch != HEADS["SequenceClassification"]:  # these HF classes have no pooler
        state = {k: v for k, v in state.items() if not k.startswith("bert.pooler.")}
    name = "qa_outputs" if arch == HEADS["QuestionAnswering"] else "classifier"
    state[f"{name}.weight"] = W.float().contiguous()
    state[f"{name}.bias"] = b.float().contiguous()
    return state, hf_config_dict(run.body.config)


def write_tokenizer(run, out: Path, max_len: int) -> None:
    """The body's WordPiece tokenizer, its ``model_max_length`` the run's ``--max-len``."""
    run.body.tokenizer.save(out)
    tc = load_json(out / "tokenizer_config.json")
    tc["model_max_length"] = max_len
    save_json(tc, out / "tokenizer_config.json")
