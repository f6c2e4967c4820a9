"""Downstream task data: the five task kinds, their file formats and their loaders.

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
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import DataError
from .columns import Columns, columns_of, file_format, missing, records, value
from .compression import open_binary

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


# -- reading -----------------------------------------------------------------------------------------
def _read_text(path: Path) -> str:
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    try:
        with open_binary(path) as (f, _):
            return f.read().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte {e.start}); convert it to UTF-8") from None


def load_text_task(path: str | Path, task: str = "classify", labelled: bool = True,
                   columns: Columns | None = None) -> TaskData:
    """Load a ``classify`` or ``pair`` file (any record format, see the module docstring).

    Args:
        path: the file; fields ``text`` (+ ``text_pair`` for ``pair``) and ``label``, where ``columns`` says.
        task: ``"classify"`` or ``"pair"``.
        labelled: require a ``label`` in every record.
        columns: the file's column mapping (default: the one a DataFile carries, else the field names).
    Returns:
        TaskData whose labels are the sorted distinct labels of the file.
    """
    cols = columns_of(path, columns)
    p = Path(path)
    need = ["text"] + (["text_pair"] if task == "pair" else []) + (["label"] if labelled else [])
    examples = []
    for where, rec in records(p, cols):
        for field in need:
            key = getattr(cols, field)
            if key not in rec:
                raise missing(where, field, cols, rec, task, need)
            if rec[key] is None or str(rec[key]).strip() == "":
                raise DataError(f"{where}: empty {key!r}")
        label = rec.get(cols.label)
        examples.append(
            TextExample(
                text=str(rec[cols.text]),
                text_pair=str(rec[cols.text_pair]) if task == "pair" else None,
                label=None if label is None or str(label).strip() == "" else str(label).strip(),
            )
        )
    if not examples:
        raise DataError(f"{p} holds no examples")
    labels = sorted({ex.label for ex in examples if ex.label is not None})
    return TaskData(task, examples, labels, str(p))


def load_conll(path: str | Path, labelled: bool = True, columns: Columns | None = None) -> TaskData:
    """Load a ``tokens`` file: CoNLL columns (``word [... columns] TAG`` per line, a blank line between
    sentences; ``columns`` may give the word's and the tag's 0-based column), or records with a list of
    words and a list of tags (JSON Lines, Parquet, datasets).

    With ``labelled=False`` a line may hold the word only, and a record needs no tags.
    """
    cols = columns_of(path, columns)
    p = Path(path)
    if file_format(p, text_as="conll") in ("conll", "csv", "tsv"):
        return _load_conll_text(p, labelled, cols)
    examples: list[TokensExample] = []
    where: dict[str, str] = {}
    need = ["words"] + (["tags"] if labelled else [])
    for at, rec in records(p, cols):
        lists = {}
        for field in need:
            key = getattr(cols, field)
            if key not in rec:
                raise missing(at, field, cols, rec, "tokens", need)
            v = value(rec, key)
            if not isinstance(v, list) or not all(isinstance(x, (str, int)) for x in v):
                raise DataError(f"{at}: {key!r} must be a list of {field} (strings), not {type(v).__name__}")
            lists[field] = [str(x) for x in v]
        if labelled and len(lists["words"]) != len(lists["tags"]):
            raise DataError(f"{at}: {len(lists['words'])} words but {len(lists['tags'])} tags; give one tag a word")
        if lists["words"]:
            examples.append(TokensExample(lists["words"], lists.get("tags")))
            where.update((t, at) for t in lists.get("tags", []))
    return _tokens_data(p, examples, where)


def _load_conll_text(p: Path, labelled: bool, cols: Columns) -> TaskData:
    mapped = {f: getattr(cols, f) for f in ("words", "tags") if f in cols.given}
    if any(not v.isdigit() for v in mapped.values()):
        raise DataError(f"{p} is CoNLL (columns without names): give --words-column and --tags-column as 0-based "
                        "positions")
    wi, ti = int(mapped.get("words", 0)), int(mapped.get("tags", -1))
    examples: list[TokensExample] = []
    words: list[str] = []
    tags: list[str] = []
    where: dict[str, str] = {}  # tag -> a line it is on, for messages

    def flush():
        if words:
            examples.append(TokensExample(list(words), list(tags) if labelled else None))
        words.clear()
        tags.clear()

    for n, line in enumerate(_read_text(p).splitlines(), 1):
        fields = line.split()
        if not fields:
            flush()
            continue
        if fields[0] == "-DOCSTART-":
            continue
        if labelled:
            if len(fields) < 2 or max(wi, ti) >= len(fields):
                raise DataError(f"{p}:{n}: expected 'word ... TAG' columns, got {line.strip()!r}")
            tags.append(fields[ti])
            where[fields[ti]] = f"{p}:{n}"
        words.append(fields[wi] if wi < len(fields) else fields[0])
    flush()
    if not examples:
        raise DataError(f"{p} holds no sentences (CoNLL: one 'word TAG' a line, blank line between sentences)")
    return _tokens_data(p, examples, where)


def _tokens_data(p: Path, examples: list[TokensExample], where: dict[str, str]) -> TaskData:
    """TaskData of tagged sentences; a tag set that mixes BIO and plain tags is refused."""
    if not examples:
        raise DataError(f"{p} holds no sentences")
    labels = sorted({t for ex in examples for t in (ex.tags or [])})
    if is_bio(labels):
        plain = [t for t in labels if t != "O" and not _bio_prefixed(t)]
        if plain:
            raise DataError(
                f"{where[plain[0]]}: tag {plain[0]!r} is not BIO (O, B-TYPE, I-TYPE) but other tags are; "
                "use BIO tags throughout (or plain tags throughout, e.g. POS)"
            )
        if "O" not in labels:
            labels = ["O", *labels]
    return TaskData("tokens", examples, labels, str(p))


def _bio_prefixed(tag: str) -> bool:
    return len(tag) > 2 and tag[0] in "BIES" and tag[1] == "-"


def is_bio(tags) -> bool:
    """True when the tag set is BIO(ES) (some tag is ``B-X``/``I-X``): entity metrics apply.

    A tag set without prefixes (e.g. POS tags) is plain tagging, scored by token accuracy.
    """
    return any(_bio_prefixed(t) for t in tags)


def load_squad(path: str | Path, labelled: bool = True, columns: Columns | None = None) -> TaskData:
    """Load SQuAD-format JSON (v1.1; v2 questions marked ``is_impossible`` are skipped), or flat
    question records (see the module docstring) in any record format."""
    cols = columns_of(path, columns)
    p = Path(path)
    if file_format(p, text_as="json") in ("json", "jsonl"):
        try:
            data = json.loads(_read_text(p))
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
    ctx, answers = str(rec[cols.context] or ""), value(rec, cols.answers)
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
    return QAExample(str(qid if qid is not None else at), str(rec[cols.question]), ctx, pairs)


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


def load_choices(path: str | Path, labelled: bool = True, columns: Columns | None = None) -> TaskData:
    """Load a multiple-choice file: records ``{"context", "choices": [...], "label"}`` or with
    ``context, choice0, choice1, ..., label`` (``label``: the 0-based index of the right choice)."""
    cols = columns_of(path, columns)
    p = Path(path)
    need = ["context", "choices"] + (["label"] if labelled else [])
    examples = []
    for at, rec in records(p, cols):
        if cols.context not in rec:
            raise missing(at, "context", cols, rec, "choice", need, word="")
        choices = _choices(at, rec, cols, need)
        if len(choices) < 2 or any(not c.strip() for c in choices):
            raise DataError(
                f"{at}: needs two or more non-empty choices "
                "('choices': [...] in JSONL; columns choice0, choice1, ... in CSV; or --choices-column)"
            )
        label = rec.get(cols.label)
        if label is None or str(label).strip() == "":
            if labelled:
                raise DataError(f"{at}: missing {cols.label!r} (the 0-based index of the right choice; columns: "
                                f"{', '.join(map(str, rec))}; map yours with --label-column NAME)")
            label = None
        else:
            try:
                label = int(str(label).strip())
            except ValueError:
                raise DataError(f"{at}: label {label!r} is not a choice index (0..{len(choices) - 1})") from None
            if not 0 <= label < len(choices):
                raise DataError(f"{at}: label {label} is out of range for {len(choices)} choices (0-based)")
        examples.append(ChoiceExample(str(rec[cols.context] or ""), choices, label))
    if not examples:
        raise DataError(f"{p} holds no examples")
    return TaskData("choice", examples, [], str(p))


def _choices(at: str, rec: dict, cols: Columns, need: list[str]) -> list[str]:
    """A record's choices: one column holding a list, several columns (one choice each), or choice0, choice1 ..."""
    if len(cols.choices) > 1:
        absent = [c for c in cols.choices if c not in rec]
        if absent:
            raise missing(at, "choices", dataclasses.replace(cols, choices=(absent[0],)), rec, "choice", need)
        choices = [rec[c] for c in cols.choices if rec[c] is not None and str(rec[c]).strip() != ""]
    elif cols.choices[0] in rec:
        choices = value(rec, cols.choices[0])
        if not isinstance(choices, list):
            raise DataError(f"{at}: {cols.choices[0]!r} must be a list of texts")
    elif "choices" not in cols.given:
        keys = sorted((k for k in rec if k and k.startswith("choice") and k[6:].isdigit()), key=lambda k: int(k[6:]))
        choices = [rec[k] for k in keys if rec[k] is not None and str(rec[k]).strip() != ""]
    else:
        raise missing(at, "choices", cols, rec, "choice", need)
    return [str(c) for c in choices]


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
    """

    load: Callable
    from_fields: Callable
    takes_choices: bool = False
    classes: bool = False
    seen: Callable[[TaskData], set] | None = None
    tags: bool = False


# task -> its data side; the transfer side is lmforge.transfer.specs.TaskSpec
KINDS: dict[str, TaskKind] = {
    "classify": TaskKind(lambda p, lab, cols: load_text_task(p, "classify", lab, cols), _text_example(False),
                         classes=True, seen=_labels_seen),
    "pair": TaskKind(lambda p, lab, cols: load_text_task(p, "pair", lab, cols), _text_example(True),
                     classes=True, seen=_labels_seen),
    "tokens": TaskKind(lambda p, lab, cols: load_conll(p, lab, cols), _tokens_example, seen=_tags_seen, tags=True),
    "qa": TaskKind(lambda p, lab, cols: load_squad(p, lab, cols), _qa_example),
    "choice": TaskKind(lambda p, lab, cols: load_choices(p, lab, cols), _choice_example, takes_choices=True),
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
