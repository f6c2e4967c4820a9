"""Which characters are Chinese (CJK), the one definition every module asks.

BERT's tokenizer, sentence splitting, the word grouping of word2vec and the evaluations, joining task words into
text and the model card's language all need "is this character CJK?"; they ask here so that they agree.  A caller
that needs another set (the scripts written without spaces between words) has a function of its own built on
these ranges, named for what it answers.
"""

from __future__ import annotations

import re

# CJK Unified Ideographs, their extensions A to E and the compatibility ideographs: the ranges BERT's
# ``handle_chinese_chars`` splits into characters of their own.
CJK_IDEOGRAPHS = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
# CJK symbols and punctuation (、。「」) and the fullwidth / halfwidth forms (，！？ and fullwidth Latin)
CJK_PUNCTUATION = ((0x3000, 0x303F), (0xFF00, 0xFFEF))
# the other scripts and signs written without spaces between words (Hangul is not: Korean puts spaces between
# words)
_UNSPACED_OTHERS = (
    (0x2E80, 0x2FDF),  # CJK radicals
    (0x3040, 0x30FF),  # hiragana, katakana
    (0x3100, 0x312F),  # bopomofo
    (0x31A0, 0x31FF),  # bopomofo extended, CJK strokes, katakana extensions
    (0x3200, 0x33FF),  # enclosed CJK letters and months, CJK compatibility (㈱, ㎏)
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
)


def _in(cp: int, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(lo <= cp <= hi for lo, hi in ranges)


def _char_class(ranges: tuple[tuple[int, int], ...]) -> re.Pattern[str]:
    return re.compile("[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ranges) + "]")


def is_cjk(ch: str) -> bool:
    """Whether ``ch`` is a CJK ideograph (a Chinese character, also used in Japanese and Korean)."""
    return _in(ord(ch), CJK_IDEOGRAPHS)


def is_cjk_or_punct(ch: str) -> bool:
    """A CJK ideograph or a CJK / fullwidth punctuation mark: the characters of Chinese text."""
    cp = ord(ch)
    return _in(cp, CJK_IDEOGRAPHS) or _in(cp, CJK_PUNCTUATION)


# the same set as a regular expression, for searching a whole text at once
CJK_OR_PUNCT = _char_class(CJK_IDEOGRAPHS + CJK_PUNCTUATION)


def written_without_spaces(ch: str) -> bool:
    """Whether ``ch`` belongs to a script written without spaces between words: Chinese (Han), Japanese kana,
    Thai, Lao, Khmer, Myanmar, and CJK / fullwidth punctuation.  Next to such a character a word needs no
    boundary: 苹果 is found inside 苹果公司发布了新手机。, and two such words are joined without a space."""
    return is_cjk_or_punct(ch) or _in(ord(ch), _UNSPACED_OTHERS)
