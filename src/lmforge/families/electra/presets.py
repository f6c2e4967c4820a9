"""ELECTRA's presets and training defaults: BERT's shapes with ELECTRA's embedding width and generator divisor
(the paper's Table 6); ``vocab_size`` comes from the tokenizer when a model is built."""

from __future__ import annotations

from typing import Any

from ..bert.presets import bert_shape


def electra_shape(layers: int, hidden: int, embedding: int, divisor: int, dropout: float = 0.1) -> dict[str, Any]:
    """BERT's shape with ELECTRA's embedding width and generator divisor."""
    return {**bert_shape(layers, hidden, dropout), "embedding_size": embedding, "generator_size_divisor": divisor}


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": electra_shape(2, 128, 128, 4, dropout=0.0),  # BERT's tiny, docs/electra.md
    "mini": electra_shape(4, 256, 256, 4, dropout=0.0),  # BERT's mini, docs/electra.md
    "small": electra_shape(12, 256, 128, 4),  # ELECTRA-Small, Clark et al. 2020
    "base": electra_shape(12, 768, 768, 3),  # ELECTRA-Base, Clark et al. 2020
}
DEFAULT_PRESET = "mini"
# ELECTRA-Small's optimizer and schedule, docs/electra.md
TRAIN_DEFAULTS: dict[str, Any] = {"lr": 5e-4, "eps": 1e-6, "weight_decay": 0.01, "schedule": "linear",
                                  "min_lr_ratio": 0.0}
