"""Seeing polysemy: the cosine similarity of one word across sentences, for every model and layer.

``lmforge embed MODEL_DIR... "He got bit by Python." "Python is my favorite programming language." --word python``

``lmforge embed MODEL_DIR... "我喜欢吃苹果。" "苹果公司发布了新手机。" --word 苹果``

The word is located in each sentence by its characters with :func:`lmforge.evaluate.find_word` (whole
word and case-insensitive where words are separated by spaces; anywhere inside unsegmented Chinese or
Japanese text) and its vector is the mean of its tokens (:func:`lmforge.evaluate.word_rows`: those
inside its character span), so a word split into several pieces works with any tokenizer.  A static
model (word2vec) gives exactly 1.0; a contextual one gives less where the contexts differ.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging

from ..errors import LmforgeError
from . import cosine, find_word, layer_names, span_vectors

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class PolysemyRow:
    """One model layer's similarities of the word across the sentences.

    Attributes:
        model: the model's label.
        layer: the layer's name (e.g. ``"lstm2"``, ``"layer6"``, ``"word2vec"``).
        pairs: ``{(i, j): cosine}`` for every pair of sentences i < j (0-based).
    """

    model: str
    layer: str
    pairs: dict[tuple[int, int], float]

    @property
    def mean(self) -> float:
        return sum(self.pairs.values()) / len(self.pairs)


def word_similarities(model, sentences: list[str], word: str, label: str = "model") -> list[PolysemyRow]:
    """Cosine similarity of ``word`` between every pair of ``sentences``, for every layer of ``model``.

    Args:
        model: anything with ``embed(texts) -> list[TokenLayers]`` (every lmforge family).
        sentences: at least two texts, each containing ``word``.
        word: the word to compare (see :func:`~lmforge.evaluate.find_word`).
        label: the model's name in the rows.
    Returns:
        One :class:`PolysemyRow` per layer, lowest first.
    """
    if len(sentences) < 2:
        raise LmforgeError("give at least two sentences to compare the word across")
    spans = []
    for k, s in enumerate(sentences):
        span = find_word(s, word)
        if span is None:
            raise LmforgeError(f"the word '{word}' does not occur in sentence {k + 1}: {s!r}")
        spans.append(span)
    embedded = model.embed(list(sentences))
    vectors = [span_vectors(tl, sp) for tl, sp in zip(embedded, spans)]  # each (L, C)
    names = layer_names(embedded[0])
    rows = []
    for li, name in enumerate(names):
        pairs = {
            (i, j): float(cosine(vectors[i][li], vectors[j][li]))
            for i, j in itertools.combinations(range(len(sentences)), 2)
        }
        rows.append(PolysemyRow(label, name, pairs))
    return rows


def polysemy_table(models: list[tuple[str, object]], sentences: list[str], word: str) -> list[PolysemyRow]:
    """:func:`word_similarities` for several ``(label, model)`` pairs, rows concatenated."""
    rows: list[PolysemyRow] = []
    for label, model in models:
        rows.extend(word_similarities(model, sentences, word, label))
    return rows


def format_polysemy(rows: list[PolysemyRow], word: str, n_sentences: int) -> str:
    """A plain-text table: model, layer, one cosine column per sentence pair (and their mean if > 1)."""
    pairs = list(itertools.combinations(range(n_sentences), 2))
    cols = [f"cos({i + 1},{j + 1})" for i, j in pairs] + (["mean"] if len(pairs) > 1 else [])
    mw = max([len("model")] + [len(r.model) for r in rows])
    lw = max([len("layer")] + [len(r.layer) for r in rows])
    head = f"{'model':<{mw}}  {'layer':<{lw}}  " + "  ".join(f"{c:>9}" for c in cols)
    lines = [f"similarity of '{word}' across the sentences", head, "-" * len(head)]
    for r in rows:
        vals = [r.pairs[p] for p in pairs] + ([r.mean] if len(pairs) > 1 else [])
        lines.append(f"{r.model:<{mw}}  {r.layer:<{lw}}  " + "  ".join(f"{v:9.4f}" for v in vals))
    return "\n".join(lines)
