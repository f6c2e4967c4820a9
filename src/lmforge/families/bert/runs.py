"""BERT's side of ``lmforge export-hf RUN``: a BERT transfer run as ``BertFor...`` of HF ``transformers``.

:mod:`lmforge.interop.runs` checks and folds the head and calls these (the :class:`~lmforge.interop.runs.RunExport`
interface).  The body's weights map with :mod:`lmforge.families.bert.hf`; the head's Linear becomes ``classifier``
(``qa_outputs`` for QA); the token and QA classes have no pooler.  ELECTRA's run export
(:mod:`lmforge.families.electra.runs`) shares the pool check, the task Linear and the tokenizer files.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...config import load_json
from ...storage.files import save_json
from .hf import hf_config_dict, to_hf_state_dict

#: TaskSpec.hf_head -> the HF class a BERT run of that task exports to
HEADS = {
    "SequenceClassification": "BertForSequenceClassification",
    "TokenClassification": "BertForTokenClassification",
    "QuestionAnswering": "BertForQuestionAnswering",
}
# how a BERT-input run (BERT, ELECTRA) reads a sentence, for the refusal of a read-out its HF class does not give
READOUTS = {"cls": "the raw top [CLS] (--pool cls)", "pooler": "[CLS] through BERT's tanh pooler (--pool pooler)",
            "mean": "the mean of the token vectors (--pool mean)"}


def check_pool(data: dict, arch: str, pool: str, reads: str) -> list[tuple[str, str]]:
    """What keeps a sentence run of ``arch`` (``...ForSequenceClassification``, which ``reads`` a sentence so) whose
    ``--pool`` is not ``pool`` from mapping; token and QA classes read every position and pass."""
    got = data.get("pool")
    if arch.endswith("SequenceClassification") and got != pool:
        return [(f"this run reads {READOUTS.get(got, f'--pool {got}')}, but {arch} reads {reads}, so it cannot be "
                 "exported exactly", f"--pool {pool}")]
    return []


def check(data: dict, arch: str) -> list[tuple[str, str]]:
    """A sentence run must read ``[CLS]`` through the pooler (the one read-out HF's class has)."""
    return check_pool(data, arch, "pooler", "[CLS] through BERT's tanh pooler")


def task_linear(arch: str, W: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
    """The one-Linear head of an HF BERT-style class: ``qa_outputs`` for QA, else ``classifier``, in float32."""
    name = "qa_outputs" if arch.endswith("QuestionAnswering") else "classifier"
    return {f"{name}.weight": W.float().contiguous(), f"{name}.bias": b.float().contiguous()}


def weights(run, arch: str, W: torch.Tensor, b: torch.Tensor) -> tuple[dict, dict]:
    """The HF state dict and ``config.json`` of the run: its body without the pretraining heads, plus ``W``, ``b``."""
    state = {k: v for k, v in to_hf_state_dict(run.body).items() if not k.startswith("cls.")}
    if arch != HEADS["SequenceClassification"]:  # these HF classes have no pooler
        state = {k: v for k, v in state.items() if not k.startswith("bert.pooler.")}
    return {**state, **task_linear(arch, W, b)}, hf_config_dict(run.body.config)


def write_tokenizer(run, out: Path, max_len: int) -> None:
    """The body's WordPiece tokenizer, its ``model_max_length`` the run's ``--max-len``."""
    run.body.tokenizer.save(out)
    tc = load_json(out / "tokenizer_config.json")
    tc["model_max_length"] = max_len
    save_json(tc, out / "tokenizer_config.json")
