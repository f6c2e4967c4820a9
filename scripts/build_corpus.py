"""Rebuild lmforge's built-in English corpus and the WordNet example table (deterministic, rerunnable).

    python scripts/build_corpus.py [--max-bytes 8000000] [--out src/lmforge/resources]

Sources (all installed on the machine, all redistributable; see CORPUS_NOTICE.txt):

1. Python's own documentation: ``pydoc_data.topics`` (prose paragraphs, code blocks dropped) and the
   docstrings of the standard library's top-level modules (read with ``ast``, never imported) —
   this is where the *programming language* sense of "python" lives.
2. WordNet 3.0 (Debian ``wordnet-base``): every synset that has example sentences (or mentions
   "python") as ``lemma, lemma: gloss.``; consecutive synsets of one lexicographer file are grouped
   into documents of 8 synsets. The *snake* sense of "python" lives here. The example sentences go
   only to the example table, never into the corpus: they are the word-in-context test sentences.
3. The King James Bible (Debian ``bible-kjv``): one verse per line, one chapter per document, in
   canonical order until the size budget is used up.

Writes, into the resources folder:

- ``corpus_en.txt.gz``: one sentence per line, a blank line between documents (BERT layout).
- ``wordnet_examples.tsv.gz``: ``synset_id<TAB>pos<TAB>lemma<TAB>sentence``, one row per WordNet
  example sentence that contains one of its synset's lemmas (whole word, case-insensitive);
  ``synset_id`` is ``<8-digit offset>-<ss_type>`` (``n v a s r``), ``pos`` is ``n v a r``
  (satellite adjectives ``s`` become ``a``), ``lemma`` is the first lemma found in the sentence
  (underscores as spaces, as it is spelled in WordNet).
- ``CORPUS_NOTICE.txt``: sources and licences.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import io
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from lmforge.data.sentences import split_sentences  # noqa: E402

WORDNET_DIR = Path("/usr/share/wordnet")
WORDNET_COPYRIGHT = Path("/usr/share/doc/wordnet-base/copyright")
WORDNET_FILES = ["noun", "verb", "adj", "adv"]
SYNSETS_PER_DOC = 8
KJV_RANGE = "gen1:1-rev22:21"

_HEADING_RULE = re.compile(r"^[*=\-~^\"']{3,}\s*$")


def _clean(s: str) -> str:
    return " ".join(s.split())


# --- Python documentation ----------------------------------------------------------------------


def _prose_documents(text: str) -> list[list[str]]:
    """Split reStructuredText-like help text into one document of prose sentences (code dropped)."""
    sentences: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln for ln in block.split("\n") if ln.strip()]
        if not lines:
            continue
        if len(lines) >= 2 and _HEADING_RULE.match(lines[1]):  # "Title\n*****"
            lines = lines[2:]
            if not lines:
                continue
        first = lines[0]
        indent = len(first) - len(first.lstrip())
        stripped = first.lstrip()
        is_item = stripped.startswith(("* ", "- ", "+ "))
        if indent >= 3 and not is_item:
            continue  # code sample or grammar rule
        if any(_HEADING_RULE.match(ln) for ln in lines):
            continue
        para = _clean(" ".join(ln.strip().lstrip("*-+ ") if i == 0 and is_item else ln.strip()
                               for i, ln in enumerate(lines)))
        if len(para) < 20 or para.startswith((">>>", "...")):
            continue
        # Prose with a few words at least, and not mostly punctuation (tables, grammar).
        letters = sum(c.isalpha() for c in para)
        if letters < 0.6 * len(para):
            continue
        sentences.extend(s for s in split_sentences(para) if len(s.split()) >= 3)
    return [sentences] if sentences else []


_SKIP_PARTS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "__phello__"}


def python_docs() -> list[list[str]]:
    """Documents from the pydoc topics (one per topic) and the standard library's docstrings (one per
    source file: module, class and function docstrings in source order), in a fixed order."""
    from pydoc_data.topics import topics

    docs: list[list[str]] = []
    for name in sorted(topics):
        docs.extend(_prose_documents(topics[name]))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if _SKIP_PARTS & set(rel.parts) or rel.name in ("this.py", "antigravity.py"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        sentences: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    for d in _prose_documents(doc):
                        sentences.extend(d)
        if sentences:
            docs.append(sentences)
    return docs


# --- WordNet -----------------------------------------------------------------------------------


def _wordnet_synsets():
    """Yield (synset_id, ss_type, lexfile, lemmas, definition, examples) over the four data files."""
    for name in WORDNET_FILES:
        path = WORDNET_DIR / f"data.{name}"
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  "):  # licence header
                    continue
                head, _, gloss = line.partition(" | ")
                fields = head.split()
                offset, lexfile, ss_type, w_cnt = fields[0], fields[1], fields[2], int(fields[3], 16)
                lemmas = []
                for i in range(w_cnt):
                    lemma = re.sub(r"\((?:a|p|ip)\)$", "", fields[4 + 2 * i]).replace("_", " ")
                    if lemma not in lemmas:
                        lemmas.append(lemma)
                gloss = gloss.strip()
                examples = [_clean(e) for e in re.findall(r'"([^"]+)"', gloss)]
                definition = _clean(gloss.split('"')[0]).rstrip(" ;:,")
                yield f"{offset}-{ss_type}", ss_type, lexfile, lemmas, definition, [e for e in examples if e]


def _contains_word(sentence: str, word: str) -> bool:
    return re.search(r"(?<![\w-])" + re.escape(word) + r"(?![\w-])", sentence, flags=re.IGNORECASE) is not None


def wordnet_documents_and_examples() -> tuple[list[list[str]], list[tuple[str, str, str, str]]]:
    docs: list[list[str]] = []
    rows: list[tuple[str, str, str, str]] = []
    cur: list[str] = []
    cur_key = None
    n_in_doc = 0
    for synset_id, ss_type, lexfile, lemmas, definition, examples in _wordnet_synsets():
        # Keep the synsets with example sentences (the WiC-style table) and every synset that mentions
        # python (the snake senses, which have no examples); all glosses would exceed the size budget.
        # The corpus gets the glosses only: the example sentences are what `lmforge evaluate wic` scores,
        # and a model pretrained on them next to their synset's gloss and same-sense neighbours would be
        # tested on its training text.
        if not examples and not any("python" in x.lower() for x in [*lemmas, definition]):
            continue
        key = (ss_type if ss_type != "s" else "a", lexfile)
        if cur and (key != cur_key or n_in_doc >= SYNSETS_PER_DOC):
            docs.append(cur)
            cur, n_in_doc = [], 0
        cur_key = key
        n_in_doc += 1
        if definition:
            d = definition if definition[-1] in ".!?" else definition + "."
            cur.append(f"{', '.join(lemmas)}: {d}")
        for ex in examples:
            lemma = next((lem for lem in lemmas if _contains_word(ex, lem)), None)
            if lemma is not None:
                rows.append((synset_id, "a" if ss_type == "s" else ss_type, lemma, ex))
    if cur:
        docs.append(cur)
    return docs, rows


# --- King James Bible --------------------------------------------------------------------------


def kjv_documents() -> list[list[str]]:
    """One document per chapter (verse numbers dropped), in canonical order."""
    try:
        out = subprocess.run(["bible", "-l100000", KJV_RANGE], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"cannot run `bible` (install Debian bible-kjv): {e}") from None
    docs: list[list[str]] = []
    cur: list[str] = []
    for line in out.splitlines():
        m = re.match(r"^\s+\d+\s+(.*)$", line)
        if m:
            cur.append(_clean(m.group(1)))
        elif line.strip():  # "Genesis 1" chapter heading
            if cur:
                docs.append(cur)
            cur = []
    if cur:
        docs.append(cur)
    return docs


# --- assembly ----------------------------------------------------------------------------------


def _doc_bytes(doc: list[str]) -> int:
    return sum(len(s.encode("utf-8")) + 1 for s in doc) + 1


def _gzip_bytes(text: str) -> bytes:
    buf = io.BytesIO()
    # mtime=0 and no file name: the same text always gives the same bytes.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(text.encode("utf-8"))
    return buf.getvalue()


NOTICE_HEAD = """lmforge built-in English corpus (corpus_en.txt.gz) and WordNet example table (wordnet_examples.tsv.gz)
=======================================================================================================

Rebuilt by scripts/build_corpus.py from three redistributable sources:

1. Python documentation: the help topics of `pydoc_data.topics` and the docstrings of the
   standard-library modules of CPython {pyver}.
   Copyright (c) 2001 Python Software Foundation; All Rights Reserved. Distributed under the
   PSF License Agreement (https://docs.python.org/3/license.html).

2. WordNet 3.0 (Debian package wordnet-base), under the WordNet 3.0 licence reproduced below: the
   glosses in the corpus, the example sentences in the example table only.

3. The King James Version of the Bible (Debian package bible-kjv): public domain text, in canonical
   order, as many chapters as the size budget allows.

Counts: {counts}

WordNet 3.0 licence (from /usr/share/doc/wordnet-base/copyright)
----------------------------------------------------------------

"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "src" / "lmforge" / "resources")
    ap.add_argument("--max-bytes", type=int, default=8_000_000, help="budget for the uncompressed corpus")
    args = ap.parse_args(argv)

    py_docs = python_docs()
    wn_docs, wn_rows = wordnet_documents_and_examples()
    kjv = kjv_documents()

    budget = args.max_bytes
    used = sum(_doc_bytes(d) for d in py_docs) + sum(_doc_bytes(d) for d in wn_docs)
    if used > budget:
        raise SystemExit(f"Python docs + WordNet alone take {used} bytes > budget {budget}")
    kjv_kept = []
    for d in kjv:
        b = _doc_bytes(d)
        if used + b > budget:
            break
        kjv_kept.append(d)
        used += b

    all_docs = py_docs + wn_docs + kjv_kept
    text = "\n\n".join("\n".join(d) for d in all_docs) + "\n"
    n_sent = sum(len(d) for d in all_docs)
    n_python_lang = sum(1 for d in py_docs for s in d if re.search(r"\bPython\b", s))
    n_python_snake = sum(1 for d in wn_docs for s in d if re.search(r"\bpython", s, re.I))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "corpus_en.txt.gz").write_bytes(_gzip_bytes(text))

    tsv = "".join("\t".join(r) + "\n" for r in wn_rows)
    (args.out / "wordnet_examples.tsv.gz").write_bytes(_gzip_bytes(tsv))

    counts = (
        f"{len(all_docs)} documents, {n_sent} sentences, {len(text.encode('utf-8'))} bytes uncompressed "
        f"(Python docs {len(py_docs)} docs, WordNet {len(wn_docs)} docs, KJV {len(kjv_kept)} of {len(kjv)} "
        f"chapters); {len(wn_rows)} WordNet example rows."
    )
    notice = NOTICE_HEAD.format(pyver=sysconfig.get_python_version(), counts=counts)
    notice += WORDNET_COPYRIGHT.read_text(encoding="utf-8") if WORDNET_COPYRIGHT.is_file() else ""
    (args.out / "CORPUS_NOTICE.txt").write_text(notice, encoding="utf-8")
    print(counts)
    print(f"sentences with 'Python' (language): {n_python_lang}; with 'python' in WordNet (snake): {n_python_snake}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
