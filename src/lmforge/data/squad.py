"""The file reader of the ``qa`` task: SQuAD JSON, or flat question records (formats: :mod:`lmforge.data.tasks`)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import DataError
from .columns import Columns, columns_of, file_format, missing, records, value
from .task_data import QAExample, TaskData
from .task_readers import read_text, text_field


def load_squad(path: str | Path, labelled: bool = True, columns: Columns | None = None) -> TaskData:
    """Load SQuAD-format JSON (v1.1; v2 questions marked ``is_impossible`` are skipped), or flat
    question records (see the module docstring) in any record format."""
    cols = columns_of(path, columns)
    p = Path(path)
    if file_format(p, text_as="json") in ("json", "jsonl"):
        try:
            data = json.loads(read_text(p))
        except json.JSONDecodeError as e:
            data = e  # JSON Lines, or broken JSON: read as records below
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            return _load_squad_json(p, data, labelled)
    examples = [_qa_record(at, rec, cols, labelled) for at, rec in records(p, cols, text_as="json")]
    examples = [ex for ex in examples if ex is not None]
    if not examples:
        raise DataError(f"{p} holds no questions")
    return TaskData("qa", examples, [], str(p))


def _qa_record(at: str, rec: dict, cols: Columns, labelled: bool) -> QAExample | None:
    need = ["question", "context"] + (["answers"] if labelled else [])
    for field in need:
        if getattr(cols, field) not in rec:
            raise missing(at, field, cols, rec, "qa", need)
    ctx = "" if rec[cols.context] is None else text_field(at, cols.context, rec[cols.context])
    answers = value(rec, cols.answers)
    if isinstance(answers, dict):  # HF squad: {"text": [...], "answer_start": [...]}
        texts, starts = answers.get("text") or [], answers.get("answer_start") or []
        answers = [{"text": t, "answer_start": s} for t, s in zip(texts, starts)]
    if answers is None:
        answers = []
    if not isinstance(answers, list) or any(not isinstance(a, dict) for a in answers):
        raise DataError(f"{at}: {cols.answers!r} must hold answers as {{'text': [...], 'answer_start': [...]}} or "
                        "a list of {'text', 'answer_start'}")
    pairs = _answers(at, ctx, answers)
    if labelled and not pairs:
        raise DataError(f"{at}: the question has no answers; training and test data need them")
    qid = rec.get(cols.id)
    return QAExample(str(qid if qid is not None else at), text_field(at, cols.question, rec[cols.question]), ctx,
                     pairs)


def _answers(where: str, ctx: str, answers: list[dict]) -> list[tuple[str, int]]:
    """``(text, start)`` of each answer, each checked to be at its start in the context."""
    pairs = []
    for a in answers:
        if "text" not in a or "answer_start" not in a:
            raise DataError(f"{where}: an answer needs 'text' and 'answer_start'")
        s, t = int(a["answer_start"]), str(a["text"])
        if ctx[s : s + len(t)] != t:
            raise DataError(f"{where}: answer {t!r} is not at answer_start {s} of the context")
        pairs.append((t, s))
    return pairs


def _load_squad_json(p: Path, data: dict, labelled: bool) -> TaskData:
    examples = []
    for a, article in enumerate(data["data"]):
        for b, para in enumerate(article.get("paragraphs", [])):
            where = f"{p}: data[{a}].paragraphs[{b}]"
            if "context" not in para or "qas" not in para:
                raise DataError(f"{where} needs 'context' and 'qas'")
            ctx = para["context"]
            for qa in para["qas"]:
                if qa.get("is_impossible"):
                    continue
                if "question" not in qa:
                    raise DataError(f"{where}: a question has no 'question' text")
                qid = str(qa.get("id", f"{a}-{b}-{len(examples)}"))
                answers = _answers(f"{where}, question {qid}", ctx, qa.get("answers", []))
                if labelled and not answers:
                    raise DataError(f"{where}, question {qid} has no answers; training and test data need them")
                examples.append(QAExample(qid, qa["question"], ctx, answers))
    if not examples:
        raise DataError(f"{p} holds no questions")
    return TaskData("qa", examples, [], str(p))
