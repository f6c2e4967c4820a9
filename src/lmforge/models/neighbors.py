"""A word's nearest words by cosine similarity: :func:`neighbors` (``lmforge neighbors``).

- **word2vec** (static vectors): gensim's ``KeyedVectors.most_similar`` on the model's vectors: the cosine
  between the word's vector and every token that has a trained vector (the tokens ``vectors.txt`` holds),
  the word itself left out.  The word is looked up as a vocabulary token first, else as the mean of its
  pieces (as ``embed`` gives a split word), with a warning naming the word and its pieces.
- **contextual families** (BERT, GPT, ELMo): a word has no vector of its own, only one per occurrence.
  Every word of a corpus gets the mean of its vectors over its occurrences there (a word split into
  pieces: the mean of its pieces at each occurrence), at one layer (default the top); the neighbours are
  the corpus words whose mean vectors are closest in cosine.  Words are whole words as
  :func:`lmforge.families.word2vec.model.word_index` groups pieces, compared lower-cased when the tokenizer
  lower-cases; tokens without a letter or digit (punctuation) are no candidates.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import LmforgeError
from ..families.word2vec.model import word_index
from . import onnx_backend
from .onnx_backend import BACKENDS
from .sentence import Forward, padded
from .vectors import Progress, progress_updates, read_texts, resolve_layer

logger = logging.getLogger(__name__)

_WORDLIKE = re.compile(r"\w")


def neighbors(
    model,
    word: str,
    top_k: int = 10,
    corpus: Sequence[str] | str | Path | None = None,
    *,
    layer: int | None = None,
    min_count: int = 1,
    batch_size: int = 32,
    progress: Progress = False,
    backend: str = "torch",
) -> list[tuple[str, float]]:
    """The ``top_k`` words nearest to ``word`` by cosine similarity, best first (see the module docstring).

    Args:
        model: an lmforge model with its tokenizer (``lmforge.load(MODEL_DIR)``).
        word: the query word.
        top_k: how many neighbours.
        corpus: texts (a list of strings, or a file as :func:`lmforge.models.vectors.read_texts` reads it, blank
            texts left out) whose words give the contextual families their word vectors; required for them, not
            used by word2vec.
        layer: the layer of a contextual model (0 = token embedding, -1 or None = the top).
        min_count: contextual families: candidate words must occur at least this often in the corpus.
        batch_size: texts per ``embed`` call over the corpus.
        progress: as for :func:`lmforge.models.vectors.encode` (counts corpus texts).
        backend: contextual families: what runs the model over the corpus: ``torch``, ``onnx`` (ONNX Runtime, the
            top layer's graph) or ``auto`` (the faster, measured once per model and machine); word2vec reads its
            vectors and runs nothing.
    Returns:
        ``[(word, cosine), ...]``, at most ``top_k`` of them.
    """
    word = word.strip()
    if not word:
        raise LmforgeError("the word is empty; give the word whose neighbours you want")
    if top_k < 1:
        raise LmforgeError(f"top_k must be >= 1, got {top_k}")
    if model.tokenizer is None:
        raise LmforgeError("the model has no tokenizer attached; load it with lmforge.load(MODEL_DIR)")
    if backend not in BACKENDS:
        raise LmforgeError(f"unknown backend '{backend}'; choose one of {', '.join(BACKENDS)}")
    if not model.contextual:
        if corpus is not None:
            logger.info("%s vectors do not depend on context: the corpus is not read", model.model_type)
        return _static_neighbors(model, word, top_k)
    if corpus is None:
        raise LmforgeError(f"{model.model_type} vectors depend on the sentence: neighbours need a corpus whose "
                           "occurrences give each word its mean vector (--corpus FILE)")
    texts = _corpus_texts(corpus)
    forward = None
    if backend != "torch":
        forward = top_forward(model, texts, layer, backend, batch_size)
        layer = None  # the forward gives the top layer alone
    words, vectors, counts = corpus_word_vectors(model, texts, layer=layer, batch_size=batch_size, progress=progress,
                                                 forward=forward)
    key = word.lower() if model.tokenizer.lowercase else word
    if key not in words:
        raise LmforgeError(f"'{word}' does not occur in the corpus ({len(texts)} texts, {len(words)} words); "
                           "give a corpus that uses it")
    query = words.index(key)
    keep = [i for i, c in enumerate(counts) if c >= min_count and i != query]
    return [(words[keep[i]], s) for i, s in cosine_top_k(vectors[query], vectors[keep], top_k)]


def _static_neighbors(model, word: str, top_k: int) -> list[tuple[str, float]]:
    """word2vec: gensim's most_similar over the tokens with a trained (non-zero) vector."""
    tok = model.tokenizer
    weight = model.embeddings.weight.detach().float().cpu().numpy()  # (V, C)
    vocab = np.flatnonzero(np.any(weight != 0, axis=1))
    token_id = tok.token_to_id(word)
    ids = [token_id] if token_id is not None and np.any(weight[token_id]) else tok.encode(word)
    if not ids or any(not np.any(weight[i]) for i in ids):
        raise LmforgeError(f"'{word}' is not in the model's vocabulary (no trained vector for "
                           f"{' '.join(tok.id_to_token(i) for i in ids) or 'it'}); check the spelling")
    if len(ids) > 1:  # a user asking for a word expects that word's vector, not a blend: say it is one
        logger.warning("'%s' is not one token of the model's vocabulary: its vector is the mean of its pieces %s",
                       word, " ".join(tok.id_to_token(i) for i in ids))
    query = weight[ids].mean(axis=0)
    keep = [int(i) for i in vocab if int(i) not in set(ids)]
    return [(tok.id_to_token(keep[i]), s) for i, s in cosine_top_k(query, weight[keep], top_k)]


def cosine_top_k(query: np.ndarray, matrix: np.ndarray, top_k: int) -> list[tuple[int, float]]:
    """The ``top_k`` rows of ``matrix`` (V, C) nearest to ``query`` (C,) in cosine, best first: ``[(row, cos)]``.

    Computed as gensim's ``most_similar`` does (float32: the unit query against each row over its norm);
    a zero row scores 0.
    """
    matrix = np.asarray(matrix, dtype=np.float32)
    q = np.asarray(query, dtype=np.float32)
    q = q / max(float(np.linalg.norm(q)), 1e-30)
    norms = np.linalg.norm(matrix, axis=1)
    scores = (matrix @ q) / np.where(norms > 0, norms, 1).astype(np.float32)
    order = np.argsort(-scores, kind="stable")[:top_k]
    return [(int(i), float(scores[i])) for i in order]


def _corpus_texts(corpus) -> list[str]:
    if isinstance(corpus, (str, Path)):  # lines, or the `text` of JSON Lines, CSV, Parquet ... records
        return read_texts(corpus, skip_blank=True)
    texts = [t for t in corpus if t.strip()]
    if not texts:
        raise LmforgeError("the corpus holds no text")
    return texts


def top_forward(model, texts: Sequence[str], layer: int | None, backend: str, batch_size: int) -> Forward | None:
    """The top-layer forward ``backend`` names for ``model`` (:func:`lmforge.models.onnx_backend.select`; None =
    torch); ``auto`` times both on a batch of ``texts`` as ``embed`` reads them.  The graph holds the top layer
    only, so another ``layer`` is refused."""
    n_layers = len(model.layer_names())
    if resolve_layer(layer, n_layers) != n_layers - 1:
        raise LmforgeError(f"--backend {backend} reads the top layer: leave --layer out (or give -1), or use "
                           f"--backend torch for layer {layer}")
    before, after = model.embed_specials()
    window = model.embed_window()
    rows = [before + ids[:window] + after for ids in model.tokenizer.encode_batch(list(texts[:batch_size]))]
    pad = model.tokenizer.pad_id if model.tokenizer.pad_id is not None else 0
    forward, _ = onnx_backend.select(model, backend, "none", padded([r or [pad] for r in rows], pad))
    return forward


def corpus_word_vectors(
    model, texts: Sequence[str], *, layer: int | None = None, batch_size: int = 32, progress: Progress = False,
    forward: Forward | None = None,
) -> tuple[list[str], np.ndarray, list[int]]:
    """Each word of ``texts``: its mean vector over its occurrences at ``layer`` (see the module docstring), from
    the model, or from ``forward`` (a top-layer forward pass, :func:`top_forward`: ``layer`` must then be None).

    Returns:
        ``(words, vectors (n_words, C) float32, counts)`` in order of first occurrence.
    """
    index: dict[str, int] = {}
    sums: list[torch.Tensor] = []
    counts: list[int] = []
    lower = model.tokenizer.lowercase
    with progress_updates(progress, len(texts)) as update:
        for start in range(0, len(texts), batch_size):
            chunk = list(texts[start : start + batch_size])
            for text, tl in zip(chunk, model.embed(chunk) if forward is None else model.embed(chunk, forward=forward)):
                vecs = tl.layers[resolve_layer(layer, tl.layers.shape[0])]  # (n, C)
                for key, rows in _words(text, tl.offsets, lower):
                    i = index.setdefault(key, len(index))
                    if i == len(sums):
                        sums.append(torch.zeros(vecs.shape[1], dtype=torch.float64))
                        counts.append(0)
                    sums[i] += vecs[rows].double().mean(dim=0)
                    counts[i] += 1
            update(len(chunk))
    if not sums:
        raise LmforgeError("the corpus has no words the model knows")
    vectors = (torch.stack(sums) / torch.tensor(counts, dtype=torch.float64).unsqueeze(1)).float().numpy()
    return list(index), vectors, counts


def _words(text: str, offsets: list[tuple[int, int]], lower: bool) -> list[tuple[str, list[int]]]:
    """``(word, piece rows)`` of every word-like word of ``text`` (pieces grouped by :func:`word_index`)."""
    groups: dict[int, list[int]] = {}
    for row, g in enumerate(word_index(text, offsets)):
        groups.setdefault(g, []).append(row)
    out = []
    for rows in groups.values():
        surface = text[offsets[rows[0]][0] : offsets[rows[-1]][1]]
        if _WORDLIKE.search(surface):
            out.append((surface.lower() if lower else surface, rows))
    return out
