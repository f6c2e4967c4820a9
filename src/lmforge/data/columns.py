"""Labelled data files in any format: which column holds what, and the records read through that mapping.

A task's examples have fields (``text``, ``text_pair`` and ``label`` for classify and pair; ``words``
and ``tags`` for tokens; ``question``, ``context``, ``answers`` and ``id`` for qa; ``context``,
``choices`` and ``label`` for choice). :class:`Columns` says where each is in a file: a column or field
name, or a 0-based position, which reads a CSV/TSV file without a header row (every row is an
example). The defaults are the field names themselves, so ``text,label`` files need no mapping.

Files may be CSV (delimiter sniffed with :class:`csv.Sniffer`), TSV, JSON Lines, JSON, Parquet or a
folder written by ``datasets``' ``save_to_disk`` (class-label ids become their names), compressed
or not (:mod:`lmforge.data.formats`). A :class:`DataFile` is a path that carries its mapping, so
code that passes file names along (``run_transfer``, the learning curve) reads them as the user
said.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

from ..errors import DataError
from .formats import detect, is_dataset_folder, iter_records
from .textfiles import check_file

#: example field -> the flag that maps it (the CLI's names, for messages)
FLAGS = {"text": "--text-column", "text_pair": "--text-pair-column", "label": "--label-column",
         "words": "--words-column", "tags": "--tags-column", "question": "--question-column",
         "context": "--context-column", "answers": "--answers-column", "id": "--id-column",
         "choices": "--choices-column"}


@dataclasses.dataclass(frozen=True)
class Columns:
    """Where each example field is in a data file: a column/field name, or a 0-based position.

    ``choices`` is one column holding a list, or several columns holding one choice each. Positions
    and names cannot be mixed: positions mean the file (CSV/TSV) has no header row.
    """

    text: str = "text"
    text_pair: str = "text_pair"
    label: str = "label"
    words: str = "words"
    tags: str = "tags"
    question: str = "question"
    context: str = "context"
    answers: str = "answers"
    id: str = "id"
    choices: tuple[str, ...] = ("choices",)
    given: frozenset[str] = frozenset()  # the fields the user mapped

    def __post_init__(self):
        values = [v for f in self.given for v in (self.choices if f == "choices" else (getattr(self, f),))]
        numbers = [v.isdigit() for v in values]
        if any(numbers) and not all(numbers):
            flags = ", ".join(FLAGS[f] for f in sorted(self.given))
            raise DataError(f"give every column ({flags}) by name or every one by 0-based position, not a mix")

    @classmethod
    def of(cls, **mapping) -> Columns:
        """Columns from the fields the user gave (None: the default)."""
        given = {k: v for k, v in mapping.items() if v is not None and v != [] and v != ()}
        if "choices" in given:
            given["choices"] = tuple(given["choices"]) if not isinstance(given["choices"], str) else (given["choices"],)
        return cls(**given, given=frozenset(given))

    @property
    def by_position(self) -> bool:
        """True when the columns are 0-based positions (a CSV/TSV file without a header row)."""
        return any(v.isdigit() for f in self.given for v in (self.choices if f == "choices" else (getattr(self, f),)))


class DataFile(str):
    """A data file's path that carries its :class:`Columns` (``str(data_file)`` is the path)."""

    columns: Columns

    def __new__(cls, path: str | Path, columns: Columns | None = None) -> DataFile:
        obj = super().__new__(cls, str(path))
        obj.columns = columns or Columns()
        return obj


def columns_of(path, columns: Columns | None) -> Columns:
    """The mapping to read ``path`` with: the one given, the one a :class:`DataFile` carries, or the defaults."""
    if columns is not None:
        return columns
    return path.columns if isinstance(path, DataFile) else Columns()


def file_format(path: Path, text_as: str = "csv") -> str:
    """The format of a labelled data file (plain text counts as ``text_as``: CSV, or CoNLL for tokens).

    Raises:
        DataError: the file is missing, a folder that ``datasets`` did not write, or binary.
    """
    if not path.exists():
        raise DataError(f"data file not found: {path}")
    if path.is_dir() and not is_dataset_folder(path):
        raise DataError(f"{path} is a directory; give a data file, or a folder written by datasets' save_to_disk")
    fmt = detect(path)
    if fmt is None:
        check_file(path)  # says it is binary
        raise DataError(f"{path}: not CSV, TSV, JSON Lines, JSON or Parquet")
    return text_as if fmt == "text" else fmt


def records(path: Path, columns: Columns, text_as: str = "csv") -> Iterator[tuple[str, dict]]:
    """``(where, record)`` of a labelled file in any format (see the module docstring)."""
    fmt = file_format(path, text_as)
    if columns.by_position and fmt not in ("csv", "tsv"):
        names = {"jsonl": "JSON Lines", "json": "JSON", "parquet": "Parquet", "dataset": "a datasets folder"}
        raise DataError(f"{path} is {names[fmt]}, whose fields have names: give the columns by name, not by "
                        "position (positions are for CSV/TSV files without a header row)")
    yield from iter_records(path, fmt, by_position=columns.by_position)


def missing(where: str, field: str, columns: Columns, rec: dict, task: str, need: list[str],
            word: str = "column ") -> DataError:
    """The error for a record without the column of ``field``: names the columns found and the flag to map it."""
    name = columns.choices[0] if field == "choices" else getattr(columns, field)
    found = ", ".join(map(str, rec)) or "none"
    if columns.by_position:
        return DataError(f"{where}: no column {name} (the rows have {len(rec)} columns, 0-based); a {task} file "
                         f"needs {', '.join(need)}: give {FLAGS[field]} N")
    if field in columns.given:  # the user mapped it already: the advice is about this file, not the flag
        return DataError(f"{where}: no {word}{name!r} (columns: {found}), which {FLAGS[field]} {name} names; every "
                         "data file of the command is read with the same column flags: give files whose columns "
                         "match")
    return DataError(f"{where}: missing {word}{name!r} (columns: {found}); a {task} file needs {', '.join(need)}: "
                     f"map yours with {FLAGS[field]} NAME")


def value(rec: dict, name: str):
    """A field's value, a JSON string decoded when it holds a list or an object (lists in CSV files)."""
    v = rec.get(name)
    if isinstance(v, str) and v.strip()[:1] in ("[", "{"):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v
