"""ELMo's presets and training defaults; ``vocab_size`` comes from the tokenizer when a model is built.
Each value is a set of config fields; the doc named beside it measured or explains it."""

from __future__ import annotations

from typing import Any

from .model import ORIGINAL_FILTERS, SMALL_FILTERS

PRESETS: dict[str, dict[str, Any]] = {
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
}
DEFAULT_PRESET = "small"
TRAIN_DEFAULTS: dict[str, Any] = {"lr": 1e-3, "weight_decay": 0.0, "warmup_steps": 100,  # docs/elmo_word2vec.md
                                  "grad_clip": 1.0}
