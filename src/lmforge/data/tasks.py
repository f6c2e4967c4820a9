"""Downstream task data: the five task kinds, their file formats and how each loads.

The example types and :class:`TaskData` are in :mod:`lmforge.data.task_data`, the file readers in
:mod:`lmforge.data.task_readers` and :mod:`lmforge.data.squad`; :data:`KINDS` says which reader and which checks
each task takes.

- ``classify``: records with ``text`` and ``label``;
- ``pair``: records with ``text``, ``text_pair`` and ``label``;
- ``tokens``: CoNLL columns: one token a line, the word first and its tag in the LAST column,
  a blank line between sentences (``-DOCSTART-`` lines are skipped); or records with ``words`` and
  ``tags`` (two lists, as HF ``datasets`` hold them). BIO tags (``O``, ``B-PER``, ``I-PER``) get
  entity-level scores, plain tags (e.g. POS) token accuracy;
- ``qa``: SQuAD v1.1 JSON: ``{"data": [{"paragraphs": [{"context": ..., "qas": [{"id", "question",
  "answers": [{"text", "answer_start"}]}]}]}]}``; or flat records with ``question``, ``context``,
  ``answers`` (``{"text": [...], "answer_start": [...]}`` as HF's squad, or a list of
  ``{"text", "answer_start"}``) and ``id``;
- ``choice`` (multiple choice, as SWAG / Story Cloze / RACE): records with ``context``, ``choices`` (a
  list of two or more texts) and ``label`` (the 0-based index of the right choice), or with
  ``context``, ``choice0``, ``choice1``, ... and ``label``.

Records come from CSV (header row; delimiter sniffed), TSV, JSON Lines, JSON, Parquet or a
``datasets`` folder, compressed or not; :class:`~lmforge.data.columns.Columns` maps the field names
above to a file's own columns, or to 0-based positions in a file without a header row.

Every loader raises :class:`~lmforge.errors.DataError` with one line naming the file, the line or
record, and what to fix (a missing column: the columns found and the flag that maps it). Labels are
kept as strings; :class:`TaskData` carries the label list, taken from the training data (sorted),
and :func:`check_labels` rejects a test label that the training data never had.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import DataError
from .columns import Columns
from .squad import load_squad
from .task_data import TASKS, ChoiceExample, QAExample, TaskData, TextExample, TokensExample
from .task_readers import load_choices, load_conll, load_text_task


def _text_example(task_pair: bool):
    def build(text, text_pair, choices, n):
        if task_pair and text_pair is None:
            raise DataError(f"this run is a pair task: give {n['text_pair']} as well")
        return TextExample(text, text_pair if task_pair else None)
    return build


def _tokens_example(text, text_pair, choices, n):
    words = text.split()
    if not words:
        raise DataError(f"{n['text']} has no words")
    return TokensExample(words)


def _qa_example(text, text_pair, choices, n):
    if text_pair is None:
        raise DataError(
            f"this run answers questions: give the question as {n['text']} and the context as {n['text_pair']}"
        )
    return QAExample("q0", text, text_pair)


def _choice_example(text, text_pair, choices, n):
    if len(choices or []) < 2:
        raise DataError(
            f"this run picks one of several choices: give {n['text']} CONTEXT and two or more {n['choices']}"
        )
    return ChoiceExample(text, list(choices))


def _labels_seen(test: TaskData) -> set:
    return {ex.label for ex in test.examples if ex.label is not None}


def _tags_seen(test: TaskData) -> set:
    return {t for ex in test.examples for t in (ex.tags or [])}


@dataclasses.dataclass(frozen=True)
class TaskKind:
    """The data side of one task: how its files load, how one example is made from loose fields, and which
    labels a test split may only show when training did (None: answers are free, e.g. spans, indices).

    Attributes:
        load: ``(path, labelled, columns) -> TaskData``.
        from_fields: ``(text, text_pair, choices, names) -> example``; raises DataError for missing fields.
        takes_choices: loose input may give choices.
        classes: a classifier over the training labels (at least two).
        seen: the labels or tags of a test split that the training data must know.
        tags: one tag per word (the tag set of two splits is their union).
        pipeline_tag: what a model of the task does, as HF's pipeline tags name it (a run's model card, the
            ``transformers.pipeline`` an HF export of the run is read by).
    """

    load: Callable
    from_fields: Callable
    pipeline_tag: str
    takes_choices: bool = False
    classes: bool = False
    seen: Callable[[TaskData], set] | None = None
    tags: bool = False


# task -> its data side; the transfer side is lmforge.transfer.specs.TaskSpec
KINDS: dict[str, TaskKind] = {
    "classify": TaskKind(lambda p, lab, cols: load_text_task(p, "classify", lab, cols), _text_example(False),
                         "text-classification", classes=True, seen=_labels_seen),
    "pair": TaskKind(lambda p, lab, cols: load_text_task(p, "pair", lab, cols, pair=True), _text_example(True),
                     "text-classification", classes=True, seen=_labels_seen),
    "tokens": TaskKind(lambda p, lab, cols: load_conll(p, lab, cols), _tokens_example, "token-classification",
                       seen=_tags_seen, tags=True),
    "qa": TaskKind(lambda p, lab, cols: load_squad(p, lab, cols), _qa_example, "question-answering"),
    "choice": TaskKind(lambda p, lab, cols: load_choices(p, lab, cols), _choice_example, "multiple-choice",
                       takes_choices=True),
}


def load_task(path: str | Path, task: str, labelled: bool = True, columns: Columns | None = None) -> TaskData:
    """Load a data file of kind ``task`` (one of :data:`TASKS`) in any format (see the module docstring).

    Args:
        columns: where the task's fields are (default: the mapping a
            :class:`~lmforge.data.columns.DataFile` carries, else the field names themselves).
    """
    if task not in TASKS:
        raise DataError(f"unknown task '{task}'; choose one of {', '.join(TASKS)}")
    return KINDS[task].load(path, labelled, columns)


def example_from_fields(
    task: str,
    text: str,
    text_pair: str | None = None,
    choices: Sequence[str] | None = None,
    names: dict[str, str] | None = None,
):
    """One unlabelled example of ``task`` from loose fields (``lmforge predict --text``, ``lmforge serve``).

    Args:
        task: the run's task. classify: ``text``; pair: ``text`` and ``text_pair``; tokens: ``text``
            (words split on white space); qa: ``text`` is the question, ``text_pair`` the context;
            choice: ``text`` is the context, ``choices`` two or more choices.
        names: how the fields are called in messages (default: ``text``, ``text_pair``, ``choices``).
    Raises:
        DataError: a field the task needs is missing, or one it cannot use is given.
    """
    n = {"text": "text", "text_pair": "text_pair", "choices": "choices", **(names or {})}
    kind = KINDS[task]
    if choices and not kind.takes_choices:
        raise DataError(f"{n['choices']} is for a choice run; this run's task is {task}")
    return kind.from_fields(text, text_pair, choices, n)


def check_labels(train: TaskData, test: TaskData) -> None:
    """Raise a DataError when ``test`` has a label or tag that ``train`` never shows."""
    if train.task != test.task:
        raise DataError(f"train data is a '{train.task}' task but test data is '{test.task}'")
    kind = KINDS[train.task]
    if kind.classes and len(train.labels) < 2:
        raise DataError(f"{train.source} has only the label(s) {train.labels}; a classifier needs at least two")
    if kind.seen is None:
        return
    seen = kind.seen(test)
    unknown = sorted(seen - set(train.labels))
    if unknown:
        raise DataError(
            f"{test.source} has label(s) {unknown[:5]} that the training data {train.source} never shows; "
            "add examples of them to the training data or drop them from the test data"
        )


# the example types and TaskData are documented as importable from here (docs/transfer.md)
__all__ = ["KINDS", "TASKS", "ChoiceExample", "QAExample", "TaskData", "TaskKind", "TextExample", "TokensExample",
           "check_labels", "example_from_fields", "load_task"]
