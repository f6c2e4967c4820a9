"""lmforge.data.english: fortunes and GCIDE cleaned, and no WordNet example sentence let in."""

import gzip
import random
import re

import pytest

from lmforge.cli import main
from lmforge.data import english
from lmforge.data.corpus import wordnet_examples_path
from lmforge.data.textfiles import read_lines


def test_wic_sentences_are_found_as_word_runs_only():
    wic = english.WicSentences(["She changed her mind.", "a big dog", "go"])
    assert wic.found_in("Then, SHE changed her mind; and left.")
    assert wic.found_in("what a big dog!")
    assert not wic.found_in("she changed her hat")  # a partial run is not the sentence
    assert not wic.found_in("a bigger dog")  # words, not characters
    assert not wic.found_in("go away")  # examples under 3 words are not looked for


def test_fortunes_drop_attributions_and_left_out_files(tmp_path):
    (tmp_path / "people").write_text(
        "A friend is a present you give\nyourself.\n\t\t-- Robert Louis Stevenson\n%\n"
        "%%%%%%%%%%%%% ### ###\n%\nA city is a large community where people are lonesome together\n")
    (tmp_path / "people.dat").write_bytes(b"\x00\x01 binary index")
    (tmp_path / "ascii-art").write_text("A picture of a cat drawn with letters only here\n")
    assert english.fortunes(tmp_path) == [
        "A friend is a present you give yourself.",
        "A city is a large community where people are lonesome together",
    ]


def test_gcide_keeps_senses_and_quotations_and_drops_wordnet_blocks(tmp_path):
    text = (
        "Affect \\Af*fect\"\\, v. t. [imp. & p. p. {Affected}.] [L. affectus.]\n"
        "   1. To act upon; to produce an effect or change upon.\n"
        "      [1913 Webster]\n\n"
        "            The climate affected their health and spirits.\n"
        "                                                  --Macaulay.\n"
        "      [1913 Webster]\n\n"
        "abdominousness \\abdominousness\\ n.\n"
        "   1. distension of the stomach area due to overweight.\n\n"
        "   Syn: paunchiness\n"
        "        [WordNet 1.5]\n\n"
        "Affected \\Af*fect\"ed\\, a.\n"
        "   Inclined or disposed; as, well {affected} toward the caf['e]. [Obs.] [R.]\n"
        "   [1913 Webster]\n"
    )
    path = tmp_path / "gcide.dict.dz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    assert english.gcide_blocks(path) == [
        "To act upon; to produce an effect or change upon.",
        "The climate affected their health and spirits.",
        "Inclined or disposed; as, well affected toward the cafe.",
    ]


def test_benchmark_text_with_debian_names_the_missing_packages(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(english, "FORTUNES_DIR", tmp_path / "no-fortunes")
    out = tmp_path / "mix.txt"
    assert main(["benchmark", "text", "en-tweets", "--out", str(out), "--with-debian"]) == 2
    err = capsys.readouterr().err
    assert "apt-get install fortunes dict-gcide" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.slow
@pytest.mark.skipif(not (english.FORTUNES_DIR.is_dir() and english.GCIDE_DICT.is_file()),
                    reason="Debian fortunes / dict-gcide not installed (`make test` installs them when run as root)")
def test_debian_english_holds_no_wordnet_example(tmp_path, monkeypatch):
    docs = english.debian_english_documents()
    monkeypatch.setattr(english, "debian_english_documents", lambda: docs)  # built once: the CLI reuses them
    out = tmp_path / "mix.txt"
    assert main(["benchmark", "text", "en-tweets", "--out", str(out), "--with-general", "--with-debian"]) == 0
    text = out.read_text(encoding="utf-8")
    debian = "\n\n".join(docs)
    assert text.endswith(debian + "\n") and len(debian.split()) > 3_000_000
    # A WordNet example that the raw fortunes hold is left out of the mix.
    assert "parting is such sweet sorrow" in " ".join(english.fortunes()).lower()
    flat = " " + re.sub(r"[^a-z0-9']+", " ", debian.lower()) + " "
    assert " parting is such sweet sorrow " not in flat
    # Independently of the word-run finder: a seeded sample of the examples, searched as strings (the tweets
    # and the built-in corpus may hold a short example as a phrase, "he fell asleep"; they are checked elsewhere).
    examples = sorted({" ".join(re.findall(r"[a-z0-9']+", row.split("\t")[3].lower()))
                       for row in read_lines(wordnet_examples_path())})
    sample = random.Random(0).sample([e for e in examples if len(e.split()) >= 3], 1500)
    assert _word_runs_found(sample, flat.split()) == []


def _word_runs_found(phrases: list[str], words: list[str]) -> list[str]:
    """The phrases whose words occur as a run in ``words``: what ``f" {phrase} " in " ".join(words)`` finds, in
    one pass over the text (a substring search per phrase over millions of words is most of this file's time)."""
    by_start: dict[tuple[str, ...], list[list[str]]] = {}
    for phrase in phrases:
        by_start.setdefault(tuple(phrase.split()[:3]), []).append(phrase.split())
    found = set()
    for i, start in enumerate(zip(words, words[1:], words[2:])):
        for run in by_start.get(start, ()):
            if words[i:i + len(run)] == run:
                found.add(" ".join(run))
    return sorted(found)


def test_the_word_run_search_finds_what_a_substring_search_finds():
    words = "the quick brown fox jumps over the lazy dog and the quick red fox".split()
    phrases = ["the quick brown", "quick red fox", "fox jumps over the", "the lazy cat", "brown fox leaps",
               "red fox and", "dog and the quick"]
    flat = " " + " ".join(words) + " "
    assert _word_runs_found(phrases, words) == sorted(p for p in phrases if f" {p} " in flat)
    assert _word_runs_found(phrases, words) == ["dog and the quick", "fox jumps over the", "quick red fox",
                                                "the quick brown"]
