"""lmforge.text: the one definition of a CJK character, and the sets built on it."""

from lmforge.text import CJK_OR_PUNCT, is_cjk, is_cjk_or_punct, written_without_spaces


def test_cjk_ideographs_in_every_block_bert_isolates():
    for ch in "中㐀豈𠀀𪜀𫝀𫠠丽":  # main block, ext. A, compatibility, ext. B to E, compat. supplement
        assert is_cjk(ch), hex(ord(ch))
    for ch in "aZ9。，ぁカ한ก ":  # Latin, digits, CJK punctuation, kana, Hangul, Thai, space
        assert not is_cjk(ch), hex(ord(ch))


def test_cjk_punctuation_joins_the_ideographs_for_chinese_text():
    for ch in "中𠀀。、「」，！？Ａ":
        assert is_cjk_or_punct(ch) and CJK_OR_PUNCT.fullmatch(ch), hex(ord(ch))
    for ch in "a.!?ぁ한":
        assert not is_cjk_or_punct(ch) and not CJK_OR_PUNCT.fullmatch(ch), hex(ord(ch))
    assert CJK_OR_PUNCT.search("see 中国 here") and not CJK_OR_PUNCT.search("plain English.")


def test_scripts_written_without_spaces():
    for ch in "中。ぁカกລ့ក⺀ㄅ㈱":  # Han, CJK punct., kana, Thai, Lao, Myanmar, Khmer, radicals, bopomofo, enclosed
        assert written_without_spaces(ch), hex(ord(ch))
    for ch in "aé한ㄱ1-":  # Latin, Hangul (Korean puts spaces between words), its compatibility jamo, digits
        assert not written_without_spaces(ch), hex(ord(ch))
