"""How ELMo is pretrained: the biLM fitted to the shards' tokenizer and its two-direction window sampler."""

from __future__ import annotations

import dataclasses

from ...data.samplers import BiLMWindowSampler
from .model import ElmoBiLM, ElmoConfig


def setup_elmo(config: ElmoConfig, shards, tokenizer) -> tuple[ElmoBiLM, BiLMWindowSampler]:
    """Build the biLM and its sampler for ``lmforge pretrain elmo``.

    Args:
        config: the ELMo config; its ``vocab_size`` is replaced by the tokenizer's.
        shards: an opened :class:`lmforge.data.shards.Shards`.
        tokenizer: the shards' tokenizer (its vocabulary is spelled into the char table).
    Returns:
        (model, sampler) with ``sampler.batch(rngs, split)`` giving ``input_ids`` and ``labels`` windows
        of ``config.seq_len`` tokens.
    """
    shards.check_tokenizer(tokenizer)
    config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size)
    model = ElmoBiLM(config)
    model.set_tokenizer(tokenizer)
    return model, BiLMWindowSampler(shards, config.seq_len)
