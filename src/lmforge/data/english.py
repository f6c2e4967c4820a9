"""More English text from Debian packages: fortunes and the GCIDE dictionary, WordNet examples left out.

The built-in corpus (Python docs, WordNet glosses, the King James Bible) is 1.4M words of mostly
archaic or technical English. Two Debian packages hold 3.8M words more of everyday and dictionary
English (``apt-get install fortunes dict-gcide``):

- ``fortunes``: every record of ``/usr/share/games/fortunes/*`` (quotations, jokes, short prose),
  attribution lines dropped, one record per document; ASCII art, Perl and the ``translate-me`` file
  are left out, as are records that are mostly not letters;
- ``dict-gcide`` (the Collaborative International Dictionary of English: Webster 1913 and later
  supplements): every sense block with its illustrative quotations, headword lines,
  pronunciations, etymologies, citations (``--Milton.``) and synonym lists dropped, 8 blocks per
  document. Blocks taken from WordNet (marked ``[WordNet 1.5]`` and similar) are left out.

**No WordNet example sentence goes in.** A fortune or GCIDE block that contains one (as a run of
its words, case-insensitive, for every example of 3 words or more) is dropped: those sentences are
what ``lmforge evaluate wic`` scores. The same packages give the same text.

``lmforge benchmark text NAME --out OUT --with-debian`` appends :func:`debian_english_documents` to a
benchmark's in-domain text.
"""

from __future__ import annotations

import gzip
import logging
import re
from collections.abc import Iterable
from pathlib import Path

from ..errors import DataError
from .corpus import wordnet_examples_path
from .textfiles import read_lines

logger = logging.getLogger(__name__)

FORTUNES_DIR = Path("/usr/share/games/fortunes")
GCIDE_DICT = Path("/usr/share/dictd/gcide.dict.dz")
FORTUNE_FILES_LEFT_OUT = {"ascii-art", "translate-me", "perl"}
GCIDE_BLOCKS_PER_DOC = 8

_SOURCE_MARK = re.compile(r"^\s*\[([^\]]*(?:Webster|WordNet|PJC|AS|Century|Suppl)[^\]]*)\]\s*$")
_ATTRIBUTION = re.compile(r"^\s+--")


def _mostly_text(t: str) -> bool:
    return len(t) >= 20 and sum(c.isalpha() for c in t) >= 0.6 * len(t)


def fortunes(folder: Path | None = None) -> list[str]:
    """Every fortune record (of ``folder``, default :data:`FORTUNES_DIR`) as one line of text, in file-name order."""
    folder = Path(folder or FORTUNES_DIR)
    if not folder.is_dir():
        raise DataError(f"{folder} not found; install Debian's fortunes and GCIDE: apt-get install fortunes dict-gcide")
    out = []
    for f in sorted(folder.iterdir()):
        if f.suffix or f.name in FORTUNE_FILES_LEFT_OUT or not f.is_file():
            continue
        for record in f.read_bytes().decode("utf-8", "replace").split("\n%\n"):
            lines = [ln.strip() for ln in record.split("\n")
                     if ln.strip() and ln.strip() != "%" and not _ATTRIBUTION.match(ln)]
            text = re.sub(r"\s+", " ", " ".join(lines))
            if _mostly_text(text):
                out.append(text)
    return out


def _clean_gcide_block(lines: list[str]) -> str:
    # Entry headers start in column 0 (headword \pronunciation\, part of speech [etymology]).
    kept = [ln.strip() for ln in lines
            if ln.strip() and ln.startswith(" ") and not ln.strip().startswith(("Syn:", "Syn.", "Usage:"))]
    t = " ".join(kept)
    if not t or "GCIDE" in t or "Webster's Revised" in t or "GNU" in t:
        return ""  # the licence preamble of each letter's file
    t = re.sub(r"\[[=.'\"`~^-]?([a-zA-Z]{1,2})[\^~]?\]", r"\1", t)  # letter codes: [=a], ['e], [i^], [ae]
    t = re.sub(r"\\[^\\]{0,60}\\", " ", t)  # pronunciations
    t = re.sub(r"\{([^}]*)\}", r"\1", t)  # cross-reference braces
    t = re.sub(r"\[[^\]]{0,80}\]", " ", t)  # [Obs.], [R.], etymologies
    t = re.sub(r"--\s*[A-Z][A-Za-z.&' ]{0,40}?(\.|$)(?=\s|$)", " ", t)  # citations: --Milton.
    t = re.sub(r"(^|\s)(\d+\.|\([a-z]\))\s", " ", t)  # sense numbers
    return re.sub(r"\s+", " ", t).strip()


def gcide_blocks(path: Path | None = None) -> list[str]:
    """Every non-WordNet sense block of GCIDE (``path``, default :data:`GCIDE_DICT`) as one line, in order."""
    path = Path(path or GCIDE_DICT)
    if not path.is_file():
        raise DataError(f"{path} not found; install Debian's fortunes and GCIDE: apt-get install fortunes dict-gcide")
    out, block = [], []
    # A dictzip file is gzip with a random-access index; streamed line by line.
    with gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="") as f:
        for line in f:
            line = line.rstrip("\n")
            mark = _SOURCE_MARK.match(line)
            if not mark:
                block.append(line)
                continue
            if "WordNet" not in mark.group(1):
                text = _clean_gcide_block(block)
                if _mostly_text(text):
                    text = re.sub(r"^[^\[\]]{0,200}\]\s*", "", text)  # an etymology's tail from the header
                    if len(text) >= 20:
                        out.append(text)
            block = []
    return out


def _words(s: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", s.lower())


class WicSentences:
    """Finds WordNet example sentences (3 words or more) inside a text, by their words."""

    def __init__(self, sentences: Iterable[str]):
        self._by_start: dict[tuple[str, ...], list[list[str]]] = {}
        for s in sentences:
            w = _words(s)
            if len(w) >= 3:
                self._by_start.setdefault(tuple(w[:3]), []).append(w)

    def found_in(self, text: str) -> bool:
        w = _words(text)
        for i in range(len(w) - 2):
            for cand in self._by_start.get(tuple(w[i:i + 3]), ()):
                if w[i:i + len(cand)] == cand:
                    return True
        return False


def wic_sentences() -> WicSentences:
    """The finder of every sentence in lmforge's WordNet example table (what ``evaluate wic`` scores)."""
    return WicSentences(line.split("\t")[3] for line in read_lines(wordnet_examples_path()))


def debian_english_documents() -> list[str]:
    """Fortunes (one per document), then GCIDE blocks (8 per document, one per line); no WordNet example."""
    wic = wic_sentences()
    fo, gc = fortunes(), gcide_blocks()
    fo_kept = [t for t in fo if not wic.found_in(t)]
    gc_kept = [t for t in gc if not wic.found_in(t)]
    logger.info("Debian English: %d fortunes (%d left out for a WordNet example), %d GCIDE blocks (%d left out)",
                len(fo_kept), len(fo) - len(fo_kept), len(gc_kept), len(gc) - len(gc_kept))
    per = GCIDE_BLOCKS_PER_DOC
    return fo_kept + ["\n".join(gc_kept[i:i + per]) for i in range(0, len(gc_kept), per)]
