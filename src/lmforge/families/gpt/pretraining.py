"""How GPT is pretrained: the model fitted to the shards' byte-level BPE tokenizer and its causal-window sampler."""

from __future__ import annotations

import dataclasses

from ...data.samplers import CausalWindowSampler
from ...errors import DataError
from .model import GPTConfig, GPTLMHeadModel


def setup_gpt(config: GPTConfig, shards, tokenizer) -> tuple[GPTLMHeadModel, CausalWindowSampler]:
    """Build the GPT and its causal-window sampler for ``lmforge pretrain gpt``.

    Args:
        config: the GPT config (``vocab_size`` and the end-of-text ids are replaced by the tokenizer's).
        shards: an open :class:`lmforge.data.shards.Shards` of byte-level BPE tokens.
        tokenizer: the shards' tokenizer (must be BPE: windows cross documents through ``<|endoftext|>``).
    Returns:
        ``(model, sampler)``: a freshly initialised :class:`GPTLMHeadModel` with the tokenizer attached, and
        a ``CausalWindowSampler`` yielding ``{input_ids, labels}`` windows of ``config.n_positions`` tokens.
    """
    if getattr(tokenizer, "kind", None) != "bpe" or getattr(tokenizer, "eot_id", None) is None:
        raise DataError(
            f"GPT pretrains on byte-level BPE shards, but these were made with a "
            f"'{getattr(tokenizer, 'kind', '?')}' tokenizer; prepare the corpus with a BPE tokenizer"
        )
    shards.check_tokenizer(tokenizer)
    config = dataclasses.replace(
        config, vocab_size=tokenizer.vocab_size, bos_token_id=tokenizer.eot_id, eos_token_id=tokenizer.eot_id
    )
    model = GPTLMHeadModel(config)
    model.tokenizer = tokenizer
    return model, CausalWindowSampler(shards, config.n_positions)
