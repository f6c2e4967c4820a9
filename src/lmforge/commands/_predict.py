"""What ``lmforge predict`` reads and writes: its examples (texts of the command line, a file, standard input)
with the input records they came from, and each record with its prediction added, as a line a person reads or a
JSON record."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..data.columns import DataFile, columns_of, records
from ..data.formats import detect
from ..data.tasks import TaskData, TextExample, example_from_fields, load_task
from ..errors import DataError
from ..transfer.specs import SPECS
from ._common import fmt

#: the keys a prediction is written under, beside the input's own fields
PRED_KEYS = ("pred", "probs")


def text_examples(task: str, texts: Sequence[str], pairs: Sequence[str] | None, choices: Sequence[str] | None,
                  labels: list) -> tuple[TaskData, list[dict]]:
    """The examples of repeated ``--text`` (with one ``--text-pair`` each, or the ``--choice`` of one context) and
    their input records."""
    if pairs is not None and len(pairs) != len(texts):
        raise DataError(f"give one --text-pair per --text ({len(texts)} --text, {len(pairs)} --text-pair)")
    if choices and len(texts) > 1:
        raise DataError("--choice gives the choices of one context: give one --text with them (several contexts: "
                        "--file with a choices field per record)")
    flags = {"text": "--text", "text_pair": "--text-pair", "choices": "--choice"}
    examples = [example_from_fields(task, t, pairs[i] if pairs else None, choices, flags) for i, t in enumerate(texts)]
    return TaskData(task, examples, labels, "<command line>"), [inputs_of(ex) for ex in examples]


def file_examples(path: str, task: str, shown: str | None = None) -> tuple[TaskData, list[dict]]:
    """The examples of a data file and the records they came from, every field as the file has it.

    A classify file of plain text (no record format) holds one text a line, as ``lmforge encode --file`` reads.
    """
    columns = columns_of(path, None)
    p = Path(path)
    lines = SPECS[task].sentence and SPECS[task].single_text  # classify: a text is all an example holds
    if lines and detect(p) == "text" and not columns.given:
        return _lines(p, task, shown or str(p))
    data = load_task(path, task, labelled=False)
    raw = _records(p, columns) if SPECS[task].sentence or detect(p) != "text" else None  # a text file: CoNLL
    if raw is None or len(raw) != len(data.examples):  # CoNLL, SQuAD's nesting: the example is the record
        raw = [{k: v for k, v in dataclasses.asdict(ex).items() if v is not None} for ex in data.examples]
    return data, raw


def _records(p: Path, columns) -> list[dict] | None:
    try:
        return [dict(rec) for _, rec in records(p, columns)]
    except DataError:
        return None


def _lines(p: Path, task: str, shown: str) -> tuple[TaskData, list[dict]]:
    from ..models.vectors import read_texts  # the reader of `encode --file`

    texts = read_texts(p, fmt="lines")
    return TaskData(task, [TextExample(t) for t in texts], [], shown), [{"text": t} for t in texts]


@contextlib.contextmanager
def stdin_file(flag_value: str) -> Iterator[DataFile]:
    """Standard input (``--file -``) as a file the readers take, told from its content as a file would be."""
    folder = Path(tempfile.mkdtemp(prefix="lmforge-predict-"))
    try:
        path = folder / "stdin"
        with open(path, "wb") as f:
            shutil.copyfileobj(sys.stdin.buffer, f)
        if path.stat().st_size == 0:
            raise DataError("--file - read nothing from standard input; pipe the examples in (one a line)")
        yield DataFile(path, columns_of(flag_value, None))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# fields of an example that are gold answers, not inputs
_GOLD = ("label", "tags", "answers")


def inputs_of(example: Any) -> dict[str, Any]:
    """The input fields of a task example (text, text_pair, words, question, context, choices; no gold)."""
    return {k: v for k, v in dataclasses.asdict(example).items() if k not in _GOLD and v is not None}


def with_prediction(task: str, record: dict, prediction: dict) -> dict:
    """The input ``record`` unchanged, plus the prediction under ``pred`` and its probabilities under ``probs``.

    Raises:
        DataError: the record already has a field of that name (it would be overwritten).
    """
    taken = [k for k in PRED_KEYS if k in record]
    if taken:
        raise DataError(f"the input records already have a field {taken[0]!r}, which predict writes the prediction "
                        "under; rename that field in the file")
    key = SPECS[task].answer_key
    out = {**record, "pred": prediction[key]}
    if "probs" in prediction:
        out["probs"] = prediction["probs"]
    return out


def _text_of(record: dict) -> str:
    parts = [str(record[k]) for k in ("text", "text_pair") if record.get(k) is not None]
    return "  ||  ".join(parts)


def _class_line(record: dict) -> str:
    probs = record.get("probs") or {}
    return f"{record['pred']} ({fmt(float(probs.get(record['pred'], float('nan'))))})  {_text_of(record)}".rstrip()


def _tags_line(record: dict) -> str:
    words = record.get("words") or []
    return " ".join(f"{w}/{t}" for w, t in zip(words, record["pred"]))


def _answer_line(record: dict) -> str:
    question = f"  <- {record['question']}" if "question" in record else ""
    return f"answer: {record['pred']!r}{question}"


def _choice_line(record: dict) -> str:
    probs = record.get("probs") or []
    k = int(record["pred"])
    choices = record.get("choices")
    chosen = choices[k] if isinstance(choices, list) and k < len(choices) else ""
    return f"choice {k} ({fmt(float(probs[k])) if k < len(probs) else '?'}): {chosen}".rstrip(": ")


# TaskSpec.shown_as -> how a prediction of that task is printed
_LINES = {"class": _class_line, "tags": _tags_line, "answer": _answer_line, "choice": _choice_line}


def prediction_line(task: str, record: dict) -> str:
    """One line: the prediction, then the input it is for."""
    return _LINES[SPECS[task].shown_as](record)
