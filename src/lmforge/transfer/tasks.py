"""Downstream task data (the task kinds, their example types, file formats and loaders).

The code lives in :mod:`lmforge.data.tasks` (task data is data: :mod:`lmforge.data.labelled` builds it
too); this module keeps the names transfer code has always imported from here.
"""

from __future__ import annotations

from ..data.tasks import (
    SENTENCE_TASKS,
    TASKS,
    ChoiceExample,
    Example,
    QAExample,
    TaskData,
    TextExample,
    TokensExample,
    check_labels,
    example_from_fields,
    is_bio,
    load_choices,
    load_conll,
    load_squad,
    load_task,
    load_text_task,
    write_conll,
    write_jsonl,
    write_squad,
)

__all__ = [
    "TASKS",
    "SENTENCE_TASKS",
    "TextExample",
    "TokensExample",
    "QAExample",
    "ChoiceExample",
    "Example",
    "TaskData",
    "load_text_task",
    "load_conll",
    "is_bio",
    "load_squad",
    "load_choices",
    "load_task",
    "example_from_fields",
    "check_labels",
    "write_jsonl",
    "write_conll",
    "write_squad",
]
