"""word2vec's presets (gensim trains it in one pass, so it has no Trainer defaults)."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "small": dict(vector_size=100, architecture="skipgram"),  # docs/elmo_word2vec.md
    "cbow": dict(vector_size=100, architecture="cbow"),  # docs/elmo_word2vec.md
    "large": dict(vector_size=300, architecture="skipgram", epochs=10),  # docs/elmo_word2vec.md
}
DEFAULT_PRESET = "small"
TRAIN_DEFAULTS: dict[str, Any] = {}
