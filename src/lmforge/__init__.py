"""lmforge: pretrain word2vec, ELMo, GPT and BERT on your own corpus and transfer them to your tasks."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def load(path: str | Path):
    """Open any lmforge model folder; the family comes from ``config.json``'s ``model_type``.

    Returns:
        The model in eval mode, with its tokenizer attached as ``model.tokenizer``.
    """
    from .config import load_json
    from .errors import CheckpointError
    from .models import model_class

    p = Path(path)
    if not p.is_dir():
        raise CheckpointError(f"model folder not found: {p}")
    data = load_json(p / "config.json")
    if "model_type" not in data:
        raise CheckpointError(f"{p / 'config.json'} has no model_type; is this an lmforge model folder?")
    return model_class(data["model_type"]).from_pretrained(p)


__all__ = ["load", "__version__"]
