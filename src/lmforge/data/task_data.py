"""The examples of downstream tasks and :class:`TaskData`, the examples of one split with their task and labels.

:mod:`lmforge.data.tasks` loads them from files and from loose fields; :mod:`lmforge.transfer.specs` turns
them into inputs and targets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence

TASKS = ("classify", "pair", "tokens", "qa", "choice")

# Tasks whose every input is read as one vector (a sentence, a pair, a context with one choice).
SENTENCE_TASKS = ("classify", "pair", "choice")


@dataclasses.dataclass
class TextExample:
    """A single text (``text_pair`` None) or a pair of texts, with its label (None when unlabelled)."""

    text: str
    text_pair: str | None = None
    label: str | None = None


@dataclasses.dataclass
class TokensExample:
    """Words of a sentence with one tag each (``tags`` None when unlabelled)."""

    words: list[str]
    tags: list[str] | None = None


@dataclasses.dataclass
class QAExample:
    """A SQuAD question: ``answers`` is a list of ``(text, char_start)`` in ``context``."""

    id: str
    question: str
    context: str
    answers: list[tuple[str, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ChoiceExample:
    """A multiple-choice question: ``context`` and its ``choices``; ``label`` the right one's index (or None)."""

    context: str
    choices: list[str]
    label: int | None = None


Example = TextExample | TokensExample | QAExample | ChoiceExample


@dataclasses.dataclass
class TaskData:
    """The examples of one split plus the task kind and label list.

    Attributes:
        task: one of :data:`TASKS`.
        examples: the examples (all of the class that fits the task).
        labels: sorted class names (``classify``/``pair``) or tags (``tokens``); empty for ``qa`` and
            ``choice``.
        source: where the examples came from (a path, or a description), for messages.
    """

    task: str
    examples: list
    labels: list[str]
    source: str = "<memory>"

    def __len__(self) -> int:
        return len(self.examples)

    def subset(self, indices: Sequence[int]) -> TaskData:
        """A TaskData with the examples at ``indices`` and the same label list."""
        return TaskData(self.task, [self.examples[i] for i in indices], list(self.labels), f"{self.source}[subset]")

    def content_hash(self) -> str:
        """sha256 of the examples' content (file-independent: a subset hashes differently)."""
        h = hashlib.sha256(self.task.encode())
        for ex in self.examples:
            h.update(json.dumps(dataclasses.asdict(ex), ensure_ascii=False, sort_keys=True).encode("utf-8"))
            h.update(b"\n")
        return h.hexdigest()


def is_bio_tag(tag: str) -> bool:
    """True for a tag with a BIOES prefix (``B-PER``, ``I-LOC``...)."""
    return len(tag) > 2 and tag[0] in "BIES" and tag[1] == "-"


def is_bio(tags) -> bool:
    """True when the tag set is BIO(ES) (some tag is ``B-X``/``I-X``): entity metrics apply.

    A tag set without prefixes (e.g. POS tags) is plain tagging, scored by token accuracy.
    """
    return any(is_bio_tag(t) for t in tags)
