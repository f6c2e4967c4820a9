"""Corpora in every common format, read as a stream of documents.

The inputs of ``lmforge prepare`` and ``lmforge tokenizer train``: files, folders and datasets.

- **text** (plain, or gzip / bzip2 / xz / zstandard compressed): documents are separated by blank
  lines and split into sentences by their layout (:mod:`lmforge.data.corpus`);
- **records** (JSON Lines, JSON, CSV, TSV, Parquet, a ``datasets`` folder, or ``--dataset NAME`` that
  the installed ``datasets`` loads offline): each record's text field (``--text-field``, default
  ``text``) is one document, split into sentences by :func:`lmforge.data.corpus.text_sentences`;
- a **folder** is read recursively (hidden files and folders lmforge wrote left out), in sorted
  order: every file whose
  content is of a known format, or only those matching ``--glob`` (a pattern without ``/`` matches
  file names at any depth, one with ``/`` the path inside the folder); a ``datasets`` folder inside
  it is one dataset.

The format is told from the content (:func:`lmforge.data.formats.detect`), so a JSON Lines file is
never read as text; ``--format`` overrides it. Every input is checked before any is read: a missing
file, a record format without the text field (the message names the fields found and the flag to
give), a folder with nothing to read.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..errors import DataError
from ..storage.folders import MARKER
from ..utils import check_unicode
from .corpus import LAYOUTS, RECORD_MODES, SENTENCE, detect_layout, iter_units, unit_sentences
from .formats import FORMATS, dataset_records, detect, is_dataset_folder, iter_records, open_dataset, record_fields
from .line_blocks import line_blocks
from .textfiles import ENCODING_ERRORS, check_file

logger = logging.getLogger(__name__)

_FORMAT_NAMES = {"text": "text", "jsonl": "JSON Lines", "json": "JSON", "csv": "CSV", "tsv": "TSV",
                 "parquet": "Parquet", "dataset": "a datasets folder"}


@dataclasses.dataclass(frozen=True)
class CorpusOptions:
    """How inputs are read.

    Attributes:
        text_field: the field (JSON, Parquet, datasets) or column (CSV/TSV; a 0-based number reads a
            file without a header row) that holds the text; several names: each source reads the first
            of them that its records have.
        format: ``"auto"`` (told from the content) or one of :data:`~lmforge.data.formats.FORMATS`.
        glob: in folders, read only the files matching this pattern.
        layout: text files: ``auto``, ``lines`` or ``paragraphs``; records: how a record's text is
            split into sentences (:func:`~lmforge.data.corpus.text_sentences`).
        encoding_errors: ``"strict"`` or ``"replace"`` for bytes that are not UTF-8.
        split: the split of a dataset that has several.
    """

    text_field: str | tuple[str, ...] = "text"
    format: str = "auto"
    glob: str | None = None
    layout: str = "auto"
    encoding_errors: str = "strict"
    split: str | None = "train"

    def __post_init__(self):
        if self.format != "auto" and self.format not in FORMATS:
            raise DataError(f"format must be auto or one of {', '.join(FORMATS)}, not {self.format!r}")
        if self.layout not in LAYOUTS:
            raise DataError(f"layout must be one of {LAYOUTS}, not {self.layout!r}")
        if self.encoding_errors not in ENCODING_ERRORS:
            raise DataError(f"encoding_errors must be one of {ENCODING_ERRORS}, not {self.encoding_errors!r}")
        names = (self.text_field,) if isinstance(self.text_field, str) else tuple(self.text_field)
        if not names or not all(names):
            raise DataError("the text field name is empty; give --text-field NAME")
        object.__setattr__(self, "text_field", names)


@dataclasses.dataclass(frozen=True)
class Source:
    """One input to read: a file, a ``datasets`` folder or a dataset loaded by name.

    Attributes:
        name: how messages and ``meta.json`` call it (the path as given, or the dataset's name).
        format: one of :data:`~lmforge.data.formats.FORMATS`.
        path: the file or folder (None for a dataset loaded by name).
        size: bytes stored on disk (what progress counts; 0 when unknown).
        layout: text: the layout it is read in (``lines``/``paragraphs``); records: the layout option.
        given: the input it came from (a folder for the files found in it), for messages.
        field: records: the field (or column) holding the text; None for text.
    """

    name: str
    format: str
    path: Path | None
    size: int
    layout: str
    given: str
    field: str | None = None

    def meta(self) -> dict:
        """The entry of ``meta.json``'s ``sources`` list."""
        where = str(self.path.resolve()) if self.path is not None else self.name
        out = {"path": where, "bytes": self.size, "format": self.format, "layout": self.layout}
        return out if self.field is None else {**out, "field": self.field}


class Corpus:
    """The inputs of one run, resolved and checked before anything is read (:meth:`open`).

    Iterating it more than once reads the inputs again (tokenizer training reads them twice).
    """

    def __init__(self, sources: list[Source], options: CorpusOptions, inputs: Sequence[str]):
        self.sources = sources
        self.options = options
        self.inputs = list(inputs)

    @classmethod
    def open(cls, paths: Sequence[str | Path] = (), datasets: Sequence[str] = (),
             options: CorpusOptions | None = None, **kwargs) -> Corpus:
        """Resolve files, folders and dataset names into sources, checking each.

        Args:
            paths: files and folders.
            datasets: names or paths for ``datasets.load_dataset`` (offline) or ``load_from_disk``.
            options: how to read them (or give :class:`CorpusOptions` fields as keywords).
        Raises:
            DataError: a missing input, a folder with nothing to read, a record format without the
                text field, no input at all.
        """
        options = options or CorpusOptions(**kwargs)
        sources: list[Source] = []
        for given in paths:
            p = Path(given)
            if not p.exists():
                raise DataError(f"file not found: {p}")
            if p.is_dir() and not is_dataset_folder(p):
                sources.extend(_folder_sources(p, options))
            else:
                sources.append(_file_source(p, options, str(p)))
        for name in datasets:
            sources.append(_dataset_source(name, options))
        if not sources:
            raise DataError("no input files given")
        return cls(sources, options, [str(p) for p in paths] + list(datasets))

    @property
    def total_bytes(self) -> int:
        """Bytes stored on disk of every source (what the progress callbacks add up to)."""
        return sum(s.size for s in self.sources)

    def units(self, on_bytes: Callable[[int], None] | None = None) -> Iterator[tuple[int, str | None]]:
        """``(mode, unit)`` for every unit of every source (see :func:`lmforge.data.corpus.iter_units`):
        ``unit`` None ends a document; :func:`~lmforge.data.corpus.unit_sentences` splits the others."""
        for _, mode, unit in self._walk(on_bytes):
            yield mode, unit

    def unit_blocks(self, on_bytes: Callable[[int], None] | None = None) -> Iterator[tuple[int, list[str], list[int]]]:
        """The units of :meth:`units` a block at a time: ``(mode, units, ends)``, ``ends`` holding for each
        document end the number of the block's units before it (0: it ends an earlier block's last unit).
        Text of one sentence a line is read a block at a time (:mod:`lmforge.data.line_blocks`)."""
        for _, mode, units, ends in self._blocks(on_bytes):
            yield mode, units, ends

    def _walk(self, on_bytes=None) -> Iterator[tuple[Source, int, str | None]]:
        for src, mode, units, ends in self._blocks(on_bytes):
            j = 0
            for k, unit in enumerate(units):
                while j < len(ends) and ends[j] == k:
                    yield src, mode, None
                    j += 1
                yield src, mode, unit
            for _ in ends[j:]:
                yield src, mode, None

    def _blocks(self, on_bytes=None) -> Iterator[tuple[Source, int, list[str], list[int]]]:
        empty = []
        for src in self.sources:
            if src.format == "text" and src.layout == "lines":
                mode, blocks = SENTENCE, line_blocks(src.path, self.options.encoding_errors, on_bytes)
            else:
                mode, units = source_units(src, self.options, on_bytes)
                blocks = _as_blocks(units)
            n = 0
            for units, ends in blocks:
                n += len(ends)
                yield src, mode, units, ends
            if n == 0:
                empty.append(src.name)
        if len(empty) == len(self.sources):
            raise DataError(f"the corpus is empty: no text in {self.describe()}")
        for name in empty:
            logger.warning("%s holds no text; skipped", name)

    def documents(self) -> Iterator[tuple[Source, list[str]]]:
        """``(source, sentences)`` per document, in order."""
        doc: list[str] = []
        for src, mode, unit in self._walk():
            if unit is None:
                yield src, doc
                doc = []
            else:
                doc.extend(unit_sentences(unit, mode))

    def sentences(self) -> Iterator[str]:
        """Every sentence of every document (tokenizer training)."""
        for mode, unit in self.units():
            if unit is not None:
                yield from unit_sentences(unit, mode)

    def describe(self) -> str:
        """The inputs as given, for messages (a folder is called one)."""
        names = [f"{g} (a directory)" if Path(g).is_dir() and not is_dataset_folder(Path(g)) else g
                 for g in self.inputs[:3]]
        return ", ".join(names) + (" ..." if len(self.inputs) > 3 else "")


def source_units(src: Source, options: CorpusOptions,
                 on_bytes: Callable[[int], None] | None = None) -> tuple[int, Iterator[str | None]]:
    """``(mode, units)`` of one source: text files by their layout, records one document each."""
    if src.format == "text":
        return iter_units(src.path, src.layout, options.encoding_errors, on_bytes)
    return RECORD_MODES[options.layout], _record_units(src, options, on_bytes)


def _as_blocks(units: Iterator[str | None], size: int = 4096) -> Iterator[tuple[list[str], list[int]]]:
    """A stream of units (None ending a document) as blocks of up to ``size`` units (see :meth:`Corpus.unit_blocks`)."""
    block: list[str] = []
    ends: list[int] = []
    for unit in units:
        if unit is None:
            ends.append(len(block))
            continue
        if len(block) >= size:  # cut before a unit, so that an end after the block's last unit stays with it
            yield block, ends
            block, ends = [], []
        block.append(unit)
    if block or ends:
        yield block, ends


def _record_units(src: Source, options: CorpusOptions, on_bytes) -> Iterator[str | None]:
    field = src.field
    if src.path is None:
        ds = open_dataset(src.name, options.split)
        records = dataset_records(ds, src.name, [field], on_bytes, src.size)
    else:
        records = iter_records(src.path, src.format, [field], by_position=_by_position(src, field),
                               encoding_errors=options.encoding_errors, on_bytes=on_bytes, split=options.split)
    for where, rec in records:
        if field not in rec:
            raise DataError(f"{where}: no {field!r} field (fields: {', '.join(map(str, rec))}); "
                            f"give {_flag(src)} NAME")
        text = _as_text(rec[field], where, field)
        if text.strip():
            yield text
            yield None


def _by_position(src: Source, field: str | tuple[str, ...]) -> bool:
    names = (field,) if isinstance(field, str) else field
    return src.format in ("csv", "tsv") and all(n.isdigit() for n in names)


def _flag(src: Source) -> str:
    return "--text-column" if src.format in ("csv", "tsv") else "--text-field"


def _as_text(value, where: str, field: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return check_unicode(value, f"{where}: {field!r}")
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return check_unicode("\n".join(value), f"{where}: {field!r}")  # a list of texts (lines): one a line
    raise DataError(f"{where}: {field!r} holds a {type(value).__name__}, not text; give --text-field NAME of a "
                    "field of strings")


def _file_source(p: Path, options: CorpusOptions, given: str, in_folder: bool = False) -> Source:
    fmt = options.format if options.format != "auto" else detect(p)
    if fmt is None:
        check_file(p)  # raises the error that says what the file looks like
        raise DataError(f"{p}: not text, JSON Lines, JSON, CSV, TSV or Parquet; give --format")
    size = _size(p)
    if fmt == "text":
        check_file(p)
        layout = detect_layout(p, options.encoding_errors).layout if options.layout == "auto" else options.layout
        return Source(str(p), fmt, p, size, layout, given)
    src = Source(str(p), fmt, p, size, options.layout, given)
    fields = record_fields(p, fmt, _by_position(src, options.text_field), options.split)
    return dataclasses.replace(src, field=_pick_field(src, fields, options, in_folder))


def _pick_field(src: Source, fields: list[str], options: CorpusOptions, in_folder: bool) -> str:
    """The first of the text field names that the source's records have (one line naming what they have)."""
    names = options.text_field
    found = next((n for n in names if n in fields), None)
    if found is not None or not fields:  # an empty file: nothing to read anyway
        return found or names[0]
    hint = f"give {_flag(src)} NAME" + (", or --glob to leave the file out" if in_folder else "")
    wanted = " or ".join(repr(n) for n in names)
    if _by_position(src, names):
        raise DataError(f"{src.name} has {len(fields)} columns, no column {' or '.join(names)} (0-based); give "
                        f"{_flag(src)} N, a position below {len(fields)}")
    kind = "column" if src.format in ("csv", "tsv") else "field"
    raise DataError(f"{src.name} is {_FORMAT_NAMES[src.format]} without a {wanted} {kind} ({kind}s: "
                    f"{', '.join(map(str, fields))}); {hint}")


def _dataset_source(name: str, options: CorpusOptions) -> Source:
    ds = open_dataset(name, options.split)
    p = Path(name)
    path = p if p.exists() else None
    size = _size(p) if path is not None else sum(os.path.getsize(f["filename"]) for f in ds.cache_files
                                                   if os.path.isfile(f.get("filename", "")))
    src = Source(name, "dataset", path, size, options.layout, name)
    return dataclasses.replace(src, field=_pick_field(src, list(ds.column_names), options, in_folder=False))


def _size(p: Path) -> int:
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return p.stat().st_size


def _folder_sources(folder: Path, options: CorpusOptions) -> list[Source]:
    """The sources in ``folder`` (recursively, sorted, hidden entries left out), by ``options.glob``."""
    found: list[Source] = []
    seen = skipped = 0
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        # hidden folders and lmforge's own outputs (shards, models ... written into the corpus folder) are no corpus
        dirs[:] = [d for d in dirs if not d.startswith(".") and not (Path(root) / d / MARKER).is_file()]
        here = Path(root)
        for d in [d for d in dirs if is_dataset_folder(here / d)]:
            dirs.remove(d)  # a datasets folder is one source, not its .arrow files
            if _matches(here / d, folder, options.glob):
                found.append(_file_source(here / d, options, str(folder), in_folder=True))
        for name in sorted(files):
            f = here / name
            if name.startswith(".") or not f.is_file():
                continue
            seen += 1
            if not _matches(f, folder, options.glob):
                continue
            fmt = options.format if options.format != "auto" else detect(f)
            if fmt is None:
                skipped += 1
                logger.info("%s: not a known format; skipped", f)
                continue
            found.append(_file_source(f, dataclasses.replace(options, format=fmt), str(folder), in_folder=True))
    if not found:
        if options.glob is not None:
            raise DataError(f"no file under {folder} matches --glob {options.glob!r} ({seen} files there); "
                            "a pattern without / matches file names at any depth, e.g. --glob '*.jsonl'")
        raise DataError(f"{folder} is a directory holding no text, JSON Lines, JSON, CSV, TSV or Parquet files "
                        f"({seen} files, {skipped} of them binary; hidden ones are left out)")
    if skipped:
        logger.warning("%s: %d file(s) of no known format (binary) skipped", folder, skipped)
    return found


def _matches(f: Path, folder: Path, pattern: str | None) -> bool:
    if pattern is None:
        return True
    rel = f.relative_to(folder).as_posix()
    return fnmatch.fnmatch(rel if "/" in pattern else f.name, pattern)


def iter_corpus(inputs: Sequence[str | Path], layout: str = "auto", encoding_errors: str = "strict",
                **options) -> Iterator[tuple[Path | str, list[str]]]:
    """Stream documents from files and folders (any format), checking every input before reading any.

    Args:
        inputs: files and folders.
        layout, encoding_errors, **options: see :class:`CorpusOptions`.
    Yields:
        ``(file, sentences)`` per document (a dataset loaded by name: its name instead of a file).
    Raises:
        DataError: a bad input, bad bytes, or no text in any input.
    """
    corpus = Corpus.open(inputs, options=CorpusOptions(layout=layout, encoding_errors=encoding_errors, **options))
    for src, doc in corpus.documents():
        yield src.path if src.path is not None else src.name, doc
