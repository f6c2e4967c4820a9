"""lmforge: pretrain word2vec, ELMo, GPT, BERT and ELECTRA on your own corpus and transfer them to your tasks."""

from __future__ import annotations

from .families import load

__version__ = "0.1.0"

__all__ = ["load", "__version__"]
