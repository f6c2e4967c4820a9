"""A word-in-context (WiC-style) evaluation built from WordNet's example sentences.

Pilehvar & Camacho-Collados (2019) built WiC from WordNet, VerbNet and Wiktionary examples: two
sentences share a target word; is it used in the same sense?  Here the pairs come from WordNet 3.0's
example sentences (``lmforge/resources/wordnet_examples.tsv.gz``: synset_id, pos, lemma, sentence):

- the target must occur in both sentences as the *same* surface string (the lemma itself, whole
  word, same case) preceded by a space.  Every tokenizer therefore cuts it into the same pieces in
  both sentences (byte-level BPE would otherwise give ``Ġrun`` mid-sentence but ``Run`` at the
  start), so a static model (word2vec) gives every pair exactly the same vector pair;
- same sense = both examples belong to the same synset; different sense = two synsets of the same
  lemma and part of speech;
- each lemma contributes as many same-sense as different-sense pairs, so every subset of lemmas is
  exactly balanced;
- lemmas are split into dev (about 1/3) and test by a hash of the lemma, so no target word is in
  both splits, and the split never changes.

Score: for every model and layer, the cosine similarity of the target's vectors (mean of its
pieces) in the two sentences; the threshold that maximises dev accuracy is applied to test.  A
static model gives cosine 1.0 to every pair, so any threshold labels all test pairs alike: exactly
50 % on the balanced test set, which is chance.
"""

from __future__ import annotations

import dataclasses
import gzip
import logging
import re
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError, LmforgeError
from . import cosine, find_word, layer_names, span_vectors

logger = logging.getLogger(__name__)

RESOURCE = Path(__file__).resolve().parent.parent / "resources" / "wordnet_examples.tsv.gz"
_LEMMA_OK = re.compile(r"^[A-Za-z][A-Za-z'-]*[A-Za-z]$")


@dataclasses.dataclass(frozen=True)
class WicPair:
    """Two sentences sharing the target ``word`` (at character spans ``span1``, ``span2``)."""

    word: str
    pos: str
    sentence1: str
    span1: tuple[int, int]
    sentence2: str
    span2: tuple[int, int]
    same_sense: bool
    split: str  # "dev" or "test"


@dataclasses.dataclass
class WicRow:
    """One model layer's score.

    Attributes:
        model: the model's label; layer: the layer's name.
        threshold: cosine at or above which a pair is called "same sense" (chosen on dev).
        dev_acc, test_acc: accuracies (0..1).
    """

    model: str
    layer: str
    threshold: float
    dev_acc: float
    test_acc: float


def read_examples(path: str | Path | None = None) -> list[tuple[str, str, str, str]]:
    """The (synset_id, pos, lemma, sentence) rows of the WordNet examples file."""
    p = Path(path) if path is not None else RESOURCE
    if not p.is_file():
        raise DataError(f"WordNet examples not found at {p}; reinstall lmforge (the file ships with it)")
    rows = []
    with gzip.open(p, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 4:
                raise DataError(f"{p} line {n}: expected 4 tab-separated columns, got {len(parts)}")
            rows.append((parts[0], parts[1], parts[2], parts[3]))
    return rows


def _target_span(sentence: str, lemma: str) -> tuple[int, int] | None:
    """Span of ``lemma`` as a whole word preceded by a space, exact case; None if absent."""
    return find_word(sentence, lemma, match_case=True, spaced=True)


def _split_of(lemma: str) -> str:
    return "dev" if zlib.crc32(lemma.lower().encode("utf-8")) % 3 == 0 else "test"


def build_pairs(
    rows: list[tuple[str, str, str, str]] | None = None,
    max_pairs: int | None = 2000,
    per_lemma: int = 2,
    seed: int = 0,
) -> list[WicPair]:
    """Balanced same-sense / different-sense pairs from WordNet examples (see the module docstring).

    Args:
        rows: (synset_id, pos, lemma, sentence) rows; default: the shipped file.
        max_pairs: stop adding lemmas once this many pairs are collected (None = all).
        per_lemma: at most this many same-sense and as many different-sense pairs per (lemma, pos).
        seed: fixes which pairs and lemmas are drawn.
    Returns:
        Pairs, each lemma contributing equally many of both labels, dev and test by lemma.
    """
    if rows is None:
        rows = read_examples()
    groups = _group_examples(rows)
    keys = sorted(groups)
    order = np.random.default_rng(seed).permutation(len(keys))
    pairs: list[WicPair] = []
    for k in order:
        drawn = _lemma_pairs(*keys[k], groups[keys[k]], per_lemma, seed)
        pairs += drawn
        if drawn and max_pairs is not None and len(pairs) >= max_pairs:
            break
    if not any(p.split == "dev" for p in pairs) or not any(p.split == "test" for p in pairs):
        raise LmforgeError("too few WiC pairs for a dev and a test split; raise --max-pairs")
    return pairs


_Example = tuple[str, tuple[int, int]]  # a sentence and the span of its target word


def _group_examples(rows: list[tuple[str, str, str, str]]) -> dict[tuple[str, str], dict[str, list[_Example]]]:
    """(lemma, pos) -> synset -> its distinct sentences in which the target is found, with the target's span."""
    groups: dict[tuple[str, str], dict[str, list[_Example]]] = defaultdict(dict)
    for synset, pos, lemma, sentence in rows:
        if not _LEMMA_OK.match(lemma):
            continue
        span = _target_span(sentence, lemma)
        if span is None:
            continue
        examples = groups[(lemma, pos)].setdefault(synset, [])
        if all(s != sentence for s, _ in examples):
            examples.append((sentence, span))
    return groups


def _lemma_pairs(lemma: str, pos: str, synsets: dict[str, list[_Example]], per_lemma: int, seed: int
                 ) -> list[WicPair]:
    """Up to ``per_lemma`` same-sense and as many different-sense pairs of one (lemma, pos), drawn with a seed of
    their own (none when it cannot give both)."""
    names = sorted(synsets)
    same = [(a, b) for s in names for i, a in enumerate(synsets[s]) for b in synsets[s][i + 1 :]]
    diff = [
        (a, b)
        for i, s in enumerate(names)
        for t in names[i + 1 :]
        for a in synsets[s]
        for b in synsets[t]
        if a[0] != b[0]
    ]
    n = min(len(same), len(diff), per_lemma)
    if n == 0:
        return []
    rng = np.random.default_rng([seed, zlib.crc32(f"{lemma}/{pos}".encode())])
    split = _split_of(lemma)
    pairs = []
    for label, pool in ((True, same), (False, diff)):
        for j in sorted(rng.choice(len(pool), size=n, replace=False).tolist()):
            (s1, sp1), (s2, sp2) = pool[j]
            if rng.random() < 0.5:  # which sentence comes first carries no information
                (s1, sp1), (s2, sp2) = (s2, sp2), (s1, sp1)
            pairs.append(WicPair(lemma, pos, s1, sp1, s2, sp2, label, split))
    return pairs


def pair_similarities(model, pairs: list[WicPair], batch_size: int = 64) -> tuple[list[str], np.ndarray]:
    """Cosine of the target between the two sentences of every pair, for every layer of ``model``.

    Each distinct sentence is embedded once.
    Returns:
        (layer names, (n_layers, n_pairs) float64 array).
    """
    sentences = sorted({p.sentence1 for p in pairs} | {p.sentence2 for p in pairs})
    index = {s: i for i, s in enumerate(sentences)}
    embedded = []
    for start in range(0, len(sentences), batch_size):
        embedded.extend(model.embed(sentences[start : start + batch_size]))
    names = layer_names(embedded[0])
    sims = np.zeros((len(names), len(pairs)))
    for k, p in enumerate(pairs):
        a = span_vectors(embedded[index[p.sentence1]], p.span1)  # (L, C)
        b = span_vectors(embedded[index[p.sentence2]], p.span2)
        sims[:, k] = cosine(a, b).numpy()
    return names, sims


def best_threshold(sims: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """The threshold t maximising accuracy of ``sim >= t`` -> same sense; ties go to the lowest t.

    Returns:
        (t, accuracy on these pairs).
    """
    candidates = np.concatenate([np.unique(sims), [np.inf]])
    best_t, best_acc = float(candidates[0]), -1.0
    for t in candidates:
        acc = float(np.mean((sims >= t) == labels))
        if acc > best_acc:
            best_t, best_acc = float(t), acc
    return best_t, best_acc


def evaluate_wic(model, pairs: list[WicPair], label: str = "model") -> list[WicRow]:
    """Score one model on the pairs: one :class:`WicRow` per layer."""
    names, sims = pair_similarities(model, pairs)
    labels = np.array([p.same_sense for p in pairs])
    dev = np.array([p.split == "dev" for p in pairs])
    rows = []
    for li, name in enumerate(names):
        t, dev_acc = best_threshold(sims[li, dev], labels[dev])
        test_acc = float(np.mean((sims[li, ~dev] >= t) == labels[~dev]))
        rows.append(WicRow(label, name, t, dev_acc, test_acc))
    return rows


def wic_table(models: list[tuple[str, object]], max_pairs: int | None = 2000) -> tuple[list[WicRow], dict]:
    """Score several ``(label, model)`` pairs on the same WiC pairs.

    Returns:
        (rows, info) where info counts the pairs: ``{"dev": n, "test": n, "lemmas": n}``.
    """
    pairs = build_pairs(max_pairs=max_pairs)
    info = {
        "dev": sum(p.split == "dev" for p in pairs),
        "test": sum(p.split == "test" for p in pairs),
        "lemmas": len({p.word for p in pairs}),
    }
    logger.info("WiC: %d dev and %d test pairs over %d target words", info["dev"], info["test"], info["lemmas"])
    rows: list[WicRow] = []
    with torch.no_grad():
        for label, model in models:
            rows.extend(evaluate_wic(model, pairs, label))
    return rows, info


def format_wic(rows: list[WicRow], info: dict) -> str:
    """A plain-text table of the rows (accuracies in percent)."""
    mw = max([len("model")] + [len(r.model) for r in rows])
    lw = max([len("layer")] + [len(r.layer) for r in rows])
    head = f"{'model':<{mw}}  {'layer':<{lw}}  {'threshold':>9}  {'dev acc':>7}  {'test acc':>8}"
    lines = [
        f"WiC (WordNet examples): {info['dev']} dev / {info['test']} test pairs, {info['lemmas']} target words, "
        "balanced (chance = 50.0 %)",
        head,
        "-" * len(head),
    ]
    for r in rows:
        t = "inf" if not np.isfinite(r.threshold) else f"{r.threshold:.4f}"
        lines.append(f"{r.model:<{mw}}  {r.layer:<{lw}}  {t:>9}  {100 * r.dev_acc:6.1f}%  {100 * r.test_acc:7.1f}%")
    return "\n".join(lines)
