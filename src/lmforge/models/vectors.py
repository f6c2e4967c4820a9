"""Vectors out of any model: one vector per text (:func:`encode`) and a word's nearest words (:func:`neighbors`).

Both are built on the body interface's ``embed(texts)`` (:class:`lmforge.models.base.TokenLayers`: the
tokens of each text, their character offsets and every layer's vector of every token), so they work for
every family and for any stand-in body that offers ``embed``.

Pooling (``pool``) turns a text's token vectors at one layer into one vector:

- ``mean``: the mean over the text's tokens (what sentence-transformers calls mean pooling);
- ``max``: the largest value of each dimension over the tokens;
- ``cls``: the vector of the model's ``[CLS]`` token (BERT: the first position of the text's first
  window). GPT, ELMo and word2vec have no such token, and ``cls`` is refused for them: their first
  position is simply the first word's vector (GPT's first position sees nothing but itself).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..errors import LmforgeError

POOLS = ("mean", "cls", "max")

Progress = bool | Callable[[int], None]


def encode(
    body,
    texts: Sequence[str],
    *,
    layer: int | None = None,
    pool: str = "mean",
    normalize: bool = False,
    batch_size: int = 32,
    progress: Progress = False,
) -> np.ndarray:
    """One vector per text, from one layer of the model, pooled over the text's tokens.

    Args:
        body: any model with ``embed(texts) -> list[TokenLayers]`` and ``hidden_size`` (every lmforge family).
        texts: the texts; each needs at least one token (an empty or blank text is an error naming it).
        layer: which layer of ``embed``'s ``(L, n, C)``: 0 is the token embedding, ``L - 1`` the top; negative
            counts from the top (-1 = the top); None = the top layer.
        pool: ``mean``, ``max`` or ``cls`` (see the module docstring).
        normalize: scale each vector to unit L2 norm (an all-zero vector stays zero).
        batch_size: texts per ``embed`` call.
        progress: True shows a tqdm bar on stderr; a callable is called with the number of texts done after
            each batch (the CLI's plain progress lines).
    Returns:
        float32 array of shape (len(texts), C); row i is text i's vector.
    """
    texts = _check_texts(texts)
    if pool not in POOLS:
        raise LmforgeError(f"unknown pool '{pool}'; choose one of {', '.join(POOLS)}")
    if batch_size < 1:
        raise LmforgeError(f"batch size must be >= 1, got {batch_size}")
    out = np.zeros((len(texts), body.hidden_size), dtype=np.float32)
    with _progress_updates(progress, len(texts)) as update:
        for start in range(0, len(texts), batch_size):
            chunk = texts[start : start + batch_size]
            for i, token_layers in enumerate(body.embed(chunk)):
                out[start + i] = _pool_one(token_layers, layer, pool, start + i, body)
            update(len(chunk))
    if normalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = out / np.where(norms > 0, norms, 1).astype(np.float32)
    return out


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise LmforgeError("texts must be a list of strings, not one string; wrap it: [text]")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise LmforgeError(f"text {i} is a {type(t).__name__}, not a string")
        if not t.strip():
            raise LmforgeError(f"text {i} is empty; every text needs at least one word (drop blank texts first)")
    return texts


def resolve_layer(layer: int | None, n_layers: int) -> int:
    """The index in ``0..n_layers-1`` that ``layer`` names (None = the top; negative counts from the top)."""
    if layer is None:
        return n_layers - 1
    index = layer + n_layers if layer < 0 else layer
    if not 0 <= index < n_layers:
        raise LmforgeError(
            f"layer {layer} does not exist: this model has layers 0..{n_layers - 1} (0 = the token embedding, "
            f"{n_layers - 1} = the top; -1 also means the top)"
        )
    return index


def _pool_one(token_layers, layer: int | None, pool: str, index: int, body) -> np.ndarray:
    """Pool one text's :class:`TokenLayers` at ``layer`` into a (C,) vector."""
    layers = token_layers.layers  # (L, n, C)
    at = resolve_layer(layer, layers.shape[0])
    if pool == "cls":
        cls = getattr(token_layers, "cls", None)
        if cls is None:
            family = getattr(body, "model_type", "this")
            raise LmforgeError(
                f"pool 'cls' needs a [CLS] token, which {family} models do not have; use pool 'mean' or 'max'"
            )
        return cls[at].float().numpy()
    vecs = layers[at]  # (n, C)
    if vecs.shape[0] == 0:
        raise LmforgeError(f"text {index} has no tokens the model knows; every text needs at least one token")
    pooled = vecs.mean(dim=0) if pool == "mean" else vecs.max(dim=0).values
    return pooled.float().numpy()


class _progress_updates:
    """A context giving ``update(n_done_now)``: a tqdm bar (``progress=True``), the caller's callable, or nothing."""

    def __init__(self, progress: Progress, total: int):
        self.progress, self.total, self.bar = progress, total, None

    def __enter__(self) -> Callable[[int], None]:
        if callable(self.progress):
            return self.progress
        if self.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, unit="text", desc="encode", file=sys.stderr, dynamic_ncols=True,
                            leave=False)
            return self.bar.update
        return lambda n: None

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


def cosine_top_k(
    query: torch.Tensor, matrix: torch.Tensor, top_k: int, exclude: Sequence[int] = ()
) -> list[tuple[int, float]]:
    """The ``top_k`` rows of ``matrix`` (V, C) most cosine-similar to ``query`` (C,), best first.

    Rows in ``exclude`` are skipped; all-zero rows score 0.  Returns ``[(row, cosine), ...]``.
    """
    m = matrix.double()
    q = query.double()
    norms = m.norm(dim=1)
    scores = (m @ q) / (norms * q.norm()).clamp_min(1e-300)
    scores[norms == 0] = 0.0
    if len(exclude):
        scores[list(exclude)] = -float("inf")
    k = min(top_k, int(torch.isfinite(scores).sum()))
    best = torch.topk(scores, k)
    return [(int(i), float(s)) for s, i in zip(best.values, best.indices)]
