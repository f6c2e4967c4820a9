"""Presets (model shapes by name) and training defaults of every family, in one place; the model files hold the
architecture only.  ``vocab_size`` (and GPT's end-of-text ids) come from the tokenizer when a model is built.

Each value is a set of config fields; the doc named beside it measured or explains it.  The registry
(:mod:`lmforge.families.registry`) reads :data:`PRESETS`, :data:`DEFAULT_PRESET` and :data:`TRAIN_DEFAULTS`.
"""

from __future__ import annotations

from typing import Any

from .elmo.model import ORIGINAL_FILTERS, SMALL_FILTERS


def _bert(layers: int, hidden: int, dropout: float = 0.1) -> dict[str, Any]:
    """Google's small BERTs (Turc et al. 2019): heads H/64, FFN 4H."""
    return {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": max(1, hidden // 64),
            "intermediate_size": 4 * hidden, "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}


def _electra(layers: int, hidden: int, embedding: int, divisor: int, dropout: float = 0.1) -> dict[str, Any]:
    """BERT's shape with ELECTRA's embedding width and generator divisor (the paper's Table 6)."""
    return {**_bert(layers, hidden, dropout), "embedding_size": embedding, "generator_size_divisor": divisor}


PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "bert": {
        "tiny": _bert(2, 128, dropout=0.0),  # docs/bert.md "Training recipe" (no dropout at CPU budgets)
        "mini": _bert(4, 256, dropout=0.0),  # docs/bert.md "Training recipe"
        "small": _bert(4, 512),  # Turc et al. 2019
        "medium": _bert(8, 512),  # Turc et al. 2019
        "base": _bert(12, 768),  # Devlin et al. 2018
    },
    "electra": {
        "tiny": _electra(2, 128, 128, 4, dropout=0.0),  # BERT's tiny, docs/electra.md
        "mini": _electra(4, 256, 256, 4, dropout=0.0),  # BERT's mini, docs/electra.md
        "small": _electra(12, 256, 128, 4),  # ELECTRA-Small, Clark et al. 2020
        "base": _electra(12, 768, 768, 3),  # ELECTRA-Base, Clark et al. 2020
    },
    "gpt": {
        "tiny": dict(n_positions=128, n_embd=64, n_layer=2, n_head=2),  # tests and smoke runs, docs/gpt.md
        "mini": dict(n_positions=256, n_embd=128, n_layer=4, n_head=4),  # docs/gpt.md
        "small": dict(n_positions=256, n_embd=256, n_layer=4, n_head=4),  # docs/gpt.md (the bench shape)
        "base": dict(n_positions=512, n_embd=512, n_layer=8, n_head=8),  # docs/gpt.md
        "gpt2-small": dict(n_positions=1024, n_embd=768, n_layer=12, n_head=12),  # GPT-2 124M's shape
    },
    "elmo": {
        "tiny": dict(projection_dim=32, cell_size=64, char_embed_dim=8,  # tests and smoke runs
                     char_filters=[[1, 16], [2, 16], [3, 32], [4, 32]], max_chars_per_token=20),
        "mini": dict(projection_dim=128, cell_size=128, char_embed_dim=16,  # docs/elmo_word2vec.md
                     char_filters=[[1, 32], [2, 32], [3, 64], [4, 128], [5, 128]], max_chars_per_token=20,
                     num_highway=1, dropout=0.0, seq_len=48),
        "small": dict(projection_dim=256, cell_size=1024,  # the original at a quarter width, docs/elmo_word2vec.md
                      char_filters=[list(f) for f in SMALL_FILTERS]),
        "small-word": dict(token_encoder="word", projection_dim=256, cell_size=1024),  # docs/elmo_word2vec.md
        "original": dict(projection_dim=512, cell_size=4096,  # Peters et al. 2018
                         char_filters=[list(f) for f in ORIGINAL_FILTERS]),
    },
    "word2vec": {
        "small": dict(vector_size=100, architecture="skipgram"),  # docs/elmo_word2vec.md
        "cbow": dict(vector_size=100, architecture="cbow"),  # docs/elmo_word2vec.md
        "large": dict(vector_size=300, architecture="skipgram", epochs=10),  # docs/elmo_word2vec.md
    },
}

DEFAULT_PRESET: dict[str, str] = {"bert": "mini", "electra": "mini", "gpt": "mini", "elmo": "small",
                                  "word2vec": "small"}

TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "bert": {"lr": 1e-3, "weight_decay": 0.01},  # docs/bert.md "Training recipe"; BERT-base: lr=1e-4
    "electra": {"lr": 5e-4, "eps": 1e-6, "weight_decay": 0.01, "schedule": "linear",  # ELECTRA-Small's
                "min_lr_ratio": 0.0},  # docs/electra.md
    "gpt": dict(lr=1e-3, weight_decay=0.1, beta2=0.99, warmup_steps=100, schedule="cosine",  # docs/gpt.md
                batch_size=16),
    "elmo": {"lr": 1e-3, "weight_decay": 0.0, "warmup_steps": 100, "grad_clip": 1.0},  # docs/elmo_word2vec.md
}
