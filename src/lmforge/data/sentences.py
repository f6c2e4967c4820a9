"""Sentence splitting: English ``. ! ?`` with closing quotes and common abbreviations, Chinese ``。！？；…`` with
closing quotes; and how hard-wrapped lines join (layouts: :mod:`lmforge.data.corpus`).
"""

from __future__ import annotations

import re

from ..text import CJK_OR_PUNCT, is_cjk_or_punct

_CLOSERS = "\"'”’»)]}」』）》〉"
_OPENERS = "\"'“‘«([{「『（《〈"
# English: terminal punctuation, optional closing quotes/brackets, whitespace, then something that
# can start a sentence (capital, digit, or an opening quote/bracket).
_EN_BOUNDARY = re.compile(r"[.!?]+[" + re.escape(_CLOSERS) + r"]*(?=\s+[" + re.escape(_OPENERS) + r"]*[A-Z0-9])")
# Chinese: 。！？；… (and fullwidth ！？) end a sentence whatever follows; closing quotes stay with it.
_ZH_BOUNDARY = re.compile(r"(?:[。！？；!?]|…+|\.{3,})+[" + re.escape(_CLOSERS) + r"]*")
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
    if CJK_OR_PUNCT.search(text):
        for m in _ZH_BOUNDARY.finditer(text):
            # ASCII !? inside English text are handled above; here only count them next to CJK.
            if m.group(0)[0] in "!?" and not (m.start() > 0 and is_cjk_or_punct(text[m.start() - 1])):
                continue
            if m.group(0).startswith("...") and not (m.start() > 0 and is_cjk_or_punct(text[m.start() - 1])):
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


def ends_sentence(line: str) -> bool:
    """True when ``line`` ends with sentence-final punctuation (closing quotes allowed)."""
    return bool(_TERMINAL_END.search(line))


def join_wrapped(a: str, b: str) -> str:
    """Join two wrapped lines: no space between CJK characters, one space otherwise."""
    if a and b and is_cjk_or_punct(a[-1]) and is_cjk_or_punct(b[0]):
        return a + b
    return f"{a} {b}"
