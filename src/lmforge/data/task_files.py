"""Task data written as the files ``lmforge finetune`` reads: JSONL (classify, pair), CoNLL (tokens), SQuAD JSON
(qa)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from ..errors import DataError
from ..storage.files import atomic_write_text
from .tasks import QAExample, TaskData, TextExample, TokensExample


def write_jsonl(examples: Iterable[TextExample], path: str | Path) -> None:
    """Write text examples as JSONL (``text``, optional ``text_pair``, ``label``), atomically."""
    lines = []
    for ex in examples:
        rec = {"text": ex.text}
        if ex.text_pair is not None:
            rec["text_pair"] = ex.text_pair
        if ex.label is not None:
            rec["label"] = ex.label
        lines.append(json.dumps(rec, ensure_ascii=False))
    atomic_write_text(path, "\n".join(lines) + "\n")


def write_conll(examples: Iterable[TokensExample], path: str | Path) -> None:
    """Write tagged sentences as two-column CoNLL, atomically."""
    blocks = []
    for ex in examples:
        tags = ex.tags or ["O"] * len(ex.words)
        blocks.append("\n".join(f"{w} {t}" for w, t in zip(ex.words, tags)))
    atomic_write_text(path, "\n\n".join(blocks) + "\n")


def write_squad(examples: Iterable[QAExample], path: str | Path) -> None:
    """Write QA examples as SQuAD v1.1 JSON (one paragraph per example), atomically."""
    paras = [
        {
            "context": ex.context,
            "qas": [
                {
                    "id": ex.id,
                    "question": ex.question,
                    "answers": [{"text": t, "answer_start": s} for t, s in ex.answers],
                }
            ],
        }
        for ex in examples
    ]
    atomic_write_text(path, json.dumps({"version": "1.1", "data": [{"title": "lmforge", "paragraphs": paras}]}))


# task -> the writer of its file format
WRITERS = {"classify": write_jsonl, "pair": write_jsonl, "tokens": write_conll}


def write_task(data: TaskData, path: str | Path) -> Path:
    """Write ``data`` as JSONL (classify / pair) or CoNLL (tokens) for ``lmforge finetune``."""
    p = Path(path)
    if data.task not in WRITERS:
        raise DataError(f"write_task writes classify / pair / tokens data, not {data.task}")
    WRITERS[data.task](data.examples, p)
    return p
