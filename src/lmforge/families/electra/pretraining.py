"""How ELECTRA is pretrained: discriminator + generator fitted to the shards' WordPiece tokenizer, on BERT's
masked rows without next-sentence pairs."""

from __future__ import annotations

import dataclasses
import logging

from ..bert.data import MaskedLMRecipe
from ..bert.pretraining import check_wordpiece, masked_sampler, recipe_words
from .data import ElectraPretrainingSampler
from .model import ElectraConfig, ElectraForPreTraining

logger = logging.getLogger(__name__)


def setup_electra(config: ElectraConfig, shards, tokenizer,
                  recipe: MaskedLMRecipe | None = None) -> tuple[ElectraForPreTraining, ElectraPretrainingSampler]:
    """Build the discriminator + generator and their sampler for ``lmforge pretrain electra``.

    Args:
        config: the chosen preset / config file; ``vocab_size`` and ``pad_token_id`` come from the tokenizer.
        shards: an opened :class:`lmforge.data.shards.Shards` made with a WordPiece tokenizer.
        tokenizer: that tokenizer.
        recipe: the pretraining-data recipe (default: :class:`MaskedLMRecipe`'s defaults).
    Returns:
        ``(model, sampler)``: BERT's masked rows without next-sentence pairs, plus the sampling noise.
    """
    check_wordpiece(tokenizer, "ELECTRA")
    config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    model = ElectraForPreTraining(config)
    model.tokenizer = tokenizer
    sampler = masked_sampler(ElectraPretrainingSampler, config, shards, tokenizer, recipe)
    width, _, _ = config.generator_shape
    logger.info(
        "ELECTRA %d layers, hidden %d, embedding %d, %d heads, generator width %d, vocab %d: %.2fM parameters%s",
        config.num_hidden_layers, config.hidden_size, config.embedding_size, config.num_attention_heads, width,
        config.vocab_size, model.num_parameters() / 1e6, recipe_words(recipe),
    )
    return model, sampler
