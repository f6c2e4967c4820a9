"""The four model families.  ``MODEL_TYPES`` maps a config's ``model_type`` to its class.

The map is a plain dict of import paths (no registry decorators) so it can be grepped, and the
families are imported lazily so that ``import lmforge`` stays cheap.
"""

from __future__ import annotations

import importlib

# model_type -> (module, class name of the pretraining model)
MODEL_TYPES: dict[str, tuple[str, str]] = {
    "word2vec": ("lmforge.models.word2vec", "Word2Vec"),
    "elmo": ("lmforge.models.elmo", "ElmoBiLM"),
    "gpt": ("lmforge.models.gpt", "GPTLMHeadModel"),
    "bert": ("lmforge.models.bert", "BertForPreTraining"),
}


def model_class(model_type: str):
    """Return the model class for ``model_type`` (e.g. ``"bert"``)."""
    from ..errors import CheckpointError

    if model_type not in MODEL_TYPES:
        raise CheckpointError(f"unknown model_type '{model_type}'; known: {', '.join(MODEL_TYPES)}")
    module, name = MODEL_TYPES[model_type]
    return getattr(importlib.import_module(module), name)
