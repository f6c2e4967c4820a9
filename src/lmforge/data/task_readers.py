"""File readers of the ``classify``, ``pair``, ``tokens`` and ``choice`` tasks (formats: :mod:`lmforge.data.tasks`).

Each returns a :class:`~lmforge.data.task_data.TaskData` or raises :class:`~lmforge.errors.DataError` with one
line naming the file, the line or record, and what to fix.
"""

from __future__ import annotations

import dataclasses
import numbers
from pathlib import Path

from ..errors import DataError
from ..utils import check_unicode
from .columns import Columns, columns_of, file_format, missing, records, value
from .compression import open_binary
from .task_data import ChoiceExample, TaskData, TextExample, TokensExample, is_bio, is_bio_tag


def read_text(path: Path) -> str:
    """The whole of a UTF-8 data file (plain or compressed)."""
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    try:
        with open_binary(path) as (f, _):
            return f.read().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte {e.start}); convert it to UTF-8") from None


def load_text_task(path: str | Path, task: str = "classify", labelled: bool = True,
                   columns: Columns | None = None, pair: bool = False) -> TaskData:
    """Load a ``classify`` or ``pair`` file (any record format, see the module docstring).

    Args:
        path: the file; fields ``text`` (+ ``text_pair`` for ``pair``) and ``label``, where ``columns`` says.
        task: the task the examples are of (``"classify"``, ``"pair"``).
        labelled: require a ``label`` in every record.
        columns: the file's column mapping (default: the one a DataFile carries, else the field names).
        pair: each record holds a pair of texts (``text_pair`` too).
    Returns:
        TaskData whose labels are the sorted distinct labels of the file.
    """
    cols = columns_of(path, columns)
    p = Path(path)
    need = ["text"] + (["text_pair"] if pair else []) + (["label"] if labelled else [])
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
                text=text_field(where, cols.text, rec[cols.text]),
                text_pair=text_field(where, cols.text_pair, rec[cols.text_pair]) if pair else None,
                label=None if label is None or str(label).strip() == "" else label_field(where, cols.label, label),
            )
        )
    if not examples:
        raise DataError(f"{p} holds no examples")
    labels = sorted({ex.label for ex in examples if ex.label is not None})
    return TaskData(task, examples, labels, str(p))


def text_field(where: str, key: str, v) -> str:
    """The text in field ``key`` of a record; a DataError unless it is a string (``{"text": 5}`` is a mistake)."""
    if not isinstance(v, str):
        raise DataError(f"{where}: {key!r} must be a text (a JSON string), not {type(v).__name__} {v!r:.40}")
    return check_unicode(v, f"{where}: {key!r}")


def label_field(where: str, key: str, v) -> str:
    """A label as its name: a string, or a whole number or bool as written; a list, dict or fraction is refused
    (``["pos"]`` would become a class named ``['pos']``)."""
    if isinstance(v, str):
        return v.strip()
    if isinstance(v, (bool, numbers.Integral)):
        return str(v)
    if isinstance(v, numbers.Real) and float(v).is_integer():
        return str(int(v))  # 1.0 from a reader that gives floats is the label 1
    raise DataError(f"{where}: {key!r} must be a label (a string or a whole number), not {type(v).__name__} "
                    f"{v!r:.40}")


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
            if not isinstance(v, list) or not all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in v):
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

    for n, line in enumerate(read_text(p).splitlines(), 1):
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
        plain = [t for t in labels if t != "O" and not is_bio_tag(t)]
        if plain:
            raise DataError(
                f"{where[plain[0]]}: tag {plain[0]!r} is not BIO (O, B-TYPE, I-TYPE) but other tags are; "
                "use BIO tags throughout (or plain tags throughout, e.g. POS)"
            )
        if "O" not in labels:
            labels = ["O", *labels]
    return TaskData("tokens", examples, labels, str(p))


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
                label = int(label_field(at, cols.label, label))
            except ValueError:
                raise DataError(f"{at}: label {label!r} is not a choice index (0..{len(choices) - 1})") from None
            if not 0 <= label < len(choices):
                raise DataError(f"{at}: label {label} is out of range for {len(choices)} choices (0-based)")
        context = rec[cols.context]
        examples.append(ChoiceExample("" if context is None else text_field(at, cols.context, context), choices, label))
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
    return [text_field(at, "choices", c) for c in choices]
