"""BERT's presets (model shapes by name) and training defaults; ``vocab_size`` comes from the tokenizer when a
model is built.  Each value is a set of config fields; the doc named beside it measured or explains it."""

from __future__ import annotations

from typing import Any


def bert_shape(layers: int, hidden: int, dropout: float = 0.1) -> dict[str, Any]:
    """Google's small BERTs (Turc et al. 2019): heads H/64, FFN 4H."""
    return {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": max(1, hidden // 64),
            "intermediate_size": 4 * hidden, "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": bert_shape(2, 128, dropout=0.0),  # docs/bert.md "Training recipe" (no dropout at CPU budgets)
    "mini": bert_shape(4, 256, dropout=0.0),  # docs/bert.md "Training recipe"
    "small": bert_shape(4, 512),  # Turc et al. 2019
    "medium": bert_shape(8, 512),  # Turc et al. 2019
    "base": bert_shape(12, 768),  # Devlin et al. 2018
}
DEFAULT_PRESET = "mini"
TRAIN_DEFAULTS: dict[str, Any] = {"lr": 1e-3, "weight_decay": 0.01}  # docs/bert.md "Training recipe"; base: 1e-4
