"""How ``lmforge predict`` shows a prediction: beside its input, as a line a person reads or a JSON record."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..transfer.specs import SPECS
from ._common import fmt

# fields of an example that are gold answers, not inputs
_GOLD = ("label", "tags", "answers")


def inputs_of(example: Any) -> dict[str, Any]:
    """The input fields of a task example (text, text_pair, words, question, context, choices; no gold)."""
    return {k: v for k, v in dataclasses.asdict(example).items() if k not in _GOLD and v is not None}


def with_inputs(example: Any, prediction: dict) -> dict:
    """The prediction record with the example's inputs first (the prediction's own keys win)."""
    return {**inputs_of(example), **prediction}


def _class_line(record: dict) -> str:
    probs = record.get("probs") or {}
    text = record.get("text", "")
    if record.get("text_pair") is not None:
        text += f"  ||  {record['text_pair']}"
    return f"{record['label']} ({fmt(float(probs.get(record['label'], float('nan'))))})  {text}".rstrip()


def _tags_line(record: dict) -> str:
    return " ".join(f"{w}/{t}" for w, t in zip(record["words"], record["tags"]))


def _answer_line(record: dict) -> str:
    question = f"  <- {record['question']}" if "question" in record else ""
    return f"answer: {record['answer']!r}{question}"


def _choice_line(record: dict) -> str:
    probs = record.get("probs") or []
    k = int(record["label"])
    chosen = record["choices"][k] if "choices" in record else ""
    return f"choice {k} ({fmt(float(probs[k])) if k < len(probs) else '?'}): {chosen}".rstrip(": ")


# TaskSpec.shown_as -> how a prediction of that task is printed
_LINES = {"class": _class_line, "tags": _tags_line, "answer": _answer_line, "choice": _choice_line}


def prediction_line(task: str, record: dict) -> str:
    """One line: the prediction, then the input it is for."""
    return _LINES[SPECS[task].shown_as](record)
