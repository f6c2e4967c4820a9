"""GPT's presets and training defaults; ``vocab_size`` and the end-of-text ids come from the tokenizer when a
model is built.  Each value is a set of config fields; the doc named beside it measured or explains it."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(n_positions=128, n_embd=64, n_layer=2, n_head=2),  # tests and smoke runs, docs/gpt.md
    "mini": dict(n_positions=256, n_embd=128, n_layer=4, n_head=4),  # docs/gpt.md
    "small": dict(n_positions=256, n_embd=256, n_layer=4, n_head=4),  # docs/gpt.md (the bench shape)
    "base": dict(n_positions=512, n_embd=512, n_layer=8, n_head=8),  # docs/gpt.md
    "gpt2-small": dict(n_positions=1024, n_embd=768, n_layer=12, n_head=12),  # GPT-2 124M's shape
}
DEFAULT_PRESET = "mini"
TRAIN_DEFAULTS: dict[str, Any] = dict(lr=1e-3, weight_decay=0.1, beta2=0.99, warmup_steps=100,  # docs/gpt.md
                                      schedule="cosine", batch_size=16)
