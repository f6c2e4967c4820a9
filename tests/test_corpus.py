import gzip
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from lmforge.data.corpus import builtin_corpus_path, detect_layout, iter_documents, wordnet_examples_path
from lmforge.data.sentences import split_sentences
from lmforge.data.sources import iter_corpus
from lmforge.data.textfiles import read_lines
from lmforge.errors import DataError

ROOT = Path(__file__).resolve().parent.parent


# --- sentence splitting -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Mr. Smith went to Washington. He said \"Hello!\" Then he left.",
         ["Mr. Smith went to Washington.", "He said \"Hello!\"", "Then he left."]),
        ("It costs 3.14 dollars. See e.g. the docs. J. R. R. Tolkien wrote it.",
         ["It costs 3.14 dollars.", "See e.g. the docs.", "J. R. R. Tolkien wrote it."]),
        ("Is it? Yes! (It is.) Done", ["Is it?", "Yes!", "(It is.)", "Done"]),
        ("He asked \u201cwhy?\u201d and left. Fine.", ["He asked \u201cwhy?\u201d and left.", "Fine."]),
        ("version 3.11 of python. lower case start", ["version 3.11 of python. lower case start"]),
        ("他说：“今天天气很好。”我们出去吧！好不好？当然……可以；走",
         ["他说：“今天天气很好。”", "我们出去吧！", "好不好？", "当然……", "可以；", "走"]),
        ("  spaced\n out   text.  ", ["spaced out text."]),
        ("", []),
    ],
)
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


# --- layouts ------------------------------------------------------------------------------------


def test_lines_layout(tmp_path):
    f = tmp_path / "bert.txt"
    f.write_text("First sentence here.\nSecond one.\n\n\nOther document.\n  \nThird doc.\n", encoding="utf-8")
    assert detect_layout(f).layout == "lines"
    assert list(iter_documents(f)) == [["First sentence here.", "Second one."], ["Other document."], ["Third doc."]]


def test_paragraph_layout_wrapped_english(tmp_path):
    f = tmp_path / "book.txt"
    f.write_text(
        "It was a bright cold day in April, and the clocks were\n"
        "striking thirteen. Winston Smith slipped quickly through the\n"
        "glass doors. Mr. Charrington was not there.\n"
        "\n"
        "Outside, even through the shut window-pane, the world\n"
        "looked cold. \"Is it?\" he asked.\n",
        encoding="utf-8",
    )
    assert detect_layout(f).layout == "paragraphs"
    assert list(iter_documents(f)) == [
        ["It was a bright cold day in April, and the clocks were striking thirteen.",
         "Winston Smith slipped quickly through the glass doors.", "Mr. Charrington was not there."],
        ["Outside, even through the shut window-pane, the world looked cold.", "\"Is it?\" he asked."],
    ]
    # forcing the other layout is honoured
    assert next(iter_documents(f, layout="lines"))[0] == "It was a bright cold day in April, and the clocks were"


def test_paragraph_layout_chinese_one_paragraph_per_line(tmp_path):
    f = tmp_path / "zh.txt"
    f.write_text("今天天气很好。我们出去吧！你说呢？\n他说：“好。”然后走了。\n第三段没有句号\n", encoding="utf-8")
    assert detect_layout(f).layout == "paragraphs"
    docs = list(iter_documents(f))
    # no blank lines: each paragraph is a document; the unterminated last line is kept
    assert docs == [["今天天气很好。", "我们出去吧！", "你说呢？"], ["他说：“好。”", "然后走了。"], ["第三段没有句号"]]


def test_gzip_reads_like_plain(tmp_path, tiny_corpus):
    gz = tmp_path / "tiny.txt.gz"
    gz.write_bytes(gzip.compress(tiny_corpus.read_bytes()))
    assert list(iter_documents(gz)) == list(iter_documents(tiny_corpus))
    assert len(list(iter_documents(tiny_corpus))) >= 40


def test_bom_and_crlf(tmp_path):
    f = tmp_path / "win.txt"
    f.write_bytes("\ufeffOne.\r\nTwo.\r\n\r\nThree.\r\n".encode())
    assert list(iter_documents(f)) == [["One.", "Two."], ["Three."]]


def test_progress_callback_counts_every_byte(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("x.\n" * 10000)
    seen = []
    list(read_lines(f, on_bytes=seen.append))
    assert sum(seen) == f.stat().st_size and len(seen) > 1


# --- errors -------------------------------------------------------------------------------------


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        list(iter_corpus([tmp_path / "missing.txt"]))
    with pytest.raises(DataError, match="is a directory"):
        list(iter_corpus([tmp_path]))


def test_non_utf8_names_file_and_line(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes(b"fine line.\nanother fine line.\ncaf\xe9 au lait.\n")
    with pytest.raises(DataError) as e:
        list(iter_corpus([f]))
    msg = str(e.value)
    assert str(f) in msg and "line 3" in msg and "--encoding-errors replace" in msg and "\n" not in msg
    docs = list(iter_corpus([f], encoding_errors="replace"))
    assert docs[0][1][2] == "caf\ufffd au lait."


def test_binary_file(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    with pytest.raises(DataError, match="binary"):
        list(iter_corpus([f]))
    late = tmp_path / "late.txt"  # a NUL byte after the first 8 KiB is still caught, with its line
    late.write_bytes(b"text line.\n" * 2000 + b"bad\x00line\n")
    with pytest.raises(DataError, match="line 2001"):
        list(iter_corpus([late]))


def test_bad_gzip(tmp_path):
    f = tmp_path / "broken.txt.gz"
    f.write_bytes(b"this is not gzip data at all\n")
    with pytest.raises(DataError, match="gzip"):
        list(iter_corpus([f]))


def test_empty_corpus(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("")
    b.write_text("\n   \n\n")
    with pytest.raises(DataError, match="corpus is empty"):
        list(iter_corpus([a, b]))
    with pytest.raises(DataError, match="no input files"):
        list(iter_corpus([]))


# --- built-in corpus and tables ------------------------------------------------------------------


def _builtin_sentences() -> list[str]:
    with gzip.open(builtin_corpus_path(), "rt", encoding="utf-8") as f:
        return [ln.rstrip("\n") for ln in f]


def test_builtin_corpus_size_layout_and_both_python_senses():
    lines = _builtin_sentences()
    text = "\n".join(lines)
    assert 6_000_000 < len(text.encode("utf-8")) <= 8_000_000
    assert detect_layout(builtin_corpus_path()).layout == "lines"
    docs = list(iter_documents(builtin_corpus_path()))
    assert len(docs) > 5000
    language = [s for s in lines if re.search(r"\bPython\b", s)
                and re.search(r"\b(interpreter|program|code|module|syntax|language)s?\b", s)]
    snake = [s for s in lines if re.search(r"\bpythons?\b", s, re.I) and re.search(r"\b(boas?|snakes?)\b", s)]
    assert len(language) >= 50, language[:5]
    assert len(snake) >= 3, snake
    assert any(s.startswith("python: ") for s in lines)  # the WordNet synset "python: large Old World boas."
    assert (builtin_corpus_path().parent / "CORPUS_NOTICE.txt").read_text().count("WordNet 3.0") >= 2


def test_wordnet_examples_table():
    with gzip.open(wordnet_examples_path(), "rt", encoding="utf-8") as f:
        rows = [ln.rstrip("\n").split("\t") for ln in f]
    assert len(rows) > 30_000
    for synset_id, pos, lemma, sentence in rows[::97]:
        assert re.fullmatch(r"\d{8}-[nvasr]", synset_id) and pos in "nvar"
        assert re.search(r"(?<![\w-])" + re.escape(lemma) + r"(?![\w-])", sentence, re.I), (lemma, sentence)
    # polysemy: one lemma with several synsets (a WiC-style task needs them)
    bank = {r[0] for r in rows if r[2] == "bank"}
    assert len(bank) >= 3


def test_builtin_corpus_holds_no_word_in_context_sentence():
    # the example sentences are what `lmforge evaluate wic` scores; the corpus keeps only their glosses
    with gzip.open(wordnet_examples_path(), "rt", encoding="utf-8") as f:
        examples = {ln.rstrip("\n").split("\t")[3] for ln in f}
    lines = _builtin_sentences()
    assert len(examples) > 30_000
    assert not examples & set(lines)
    text = "\n".join(lines)
    long = sorted(e for e in examples if len(e) > 40)  # nor inside a longer line
    assert not [e for e in long[::50] if e in text]
    assert any(s.startswith("bank, ") or s.startswith("bank: ") for s in lines)  # the glosses stay


def test_people_daily_raw_text():
    from lmforge.data.corpus import iter_people_daily

    it = iter_people_daily()
    first = next(it)
    assert first == "迈向充满希望的新世纪——一九九八年新年讲话（附图片１张）"
    tagged = next(iter_people_daily(tagged=True))
    assert tagged[:2] == [("迈向", "v"), ("充满", "v")]
    assert all("/" not in s for s, _ in zip(it, range(500)))


def test_people_daily_file_is_read_as_documents(tmp_path):
    from lmforge.data.corpus import write_people_daily_text

    p = write_people_daily_text(tmp_path / "pd.txt", max_lines=200)
    docs = list(iter_documents(p))
    assert len(docs) == 200  # a paragraph per line, no blank lines: one document each
    assert any(len(d) > 2 for d in docs) and all(s for d in docs for s in d)


@pytest.mark.slow
def test_build_corpus_script_is_deterministic_and_matches_shipped(tmp_path):
    notice = (builtin_corpus_path().parent / "CORPUS_NOTICE.txt").read_text()
    if not Path("/usr/share/wordnet/data.noun").is_file() or subprocess.run(
            ["which", "bible"], capture_output=True).returncode != 0:
        # `make test` installs them when it runs as root (as CI does); a non-root user may lack them.
        pytest.skip("WordNet / bible-kjv Debian packages not installed (apt-get install wordnet-base bible-kjv)")
    if f"CPython {sysconfig.get_python_version()}" not in notice:
        # pydoc_data.topics differs between CPython releases, so a byte-equal rebuild needs the same one.
        pytest.skip("the shipped corpus was built from another Python's documentation")
    out = tmp_path / "res"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build_corpus.py"), "--out", str(out)], check=True,
                   capture_output=True)
    for name in ("corpus_en.txt.gz", "wordnet_examples.tsv.gz", "CORPUS_NOTICE.txt"):
        assert (out / name).read_bytes() == (builtin_corpus_path().parent / name).read_bytes(), name
