"""How BERT is pretrained: the model fitted to the shards' WordPiece tokenizer and its MLM (+ NSP) sampler.

:func:`check_wordpiece`, :func:`masked_sampler` and :func:`recipe_words` serve ELECTRA too, whose rows are BERT's.
"""

from __future__ import annotations

import dataclasses
import logging

from ...errors import ConfigError, DataError
from .data import BertPretrainingSampler, MaskedLMRecipe
from .model import BertConfig, BertForPreTraining

logger = logging.getLogger(__name__)


def check_wordpiece(tokenizer, label: str) -> None:
    """DataError unless ``tokenizer`` is WordPiece (``label`` names the family in the message)."""
    if getattr(tokenizer, "kind", None) != "wordpiece":
        raise DataError(
            f"{label} needs shards made with a WordPiece tokenizer, but these were made with a "
            f"'{getattr(tokenizer, 'kind', '?')}' tokenizer; train one with kind=wordpiece and prepare the data again"
        )


def masked_sampler(cls, config, shards, tokenizer, recipe: MaskedLMRecipe | None, **extra):
    """The masked-LM rows of ``recipe`` (default: the recipe's defaults) for a model of ``config``."""
    recipe = recipe or MaskedLMRecipe()
    return cls(
        shards,
        max_seq_length=recipe.seq_length(config.max_position_embeddings),
        short_seq_prob=recipe.short_seq_prob,
        masked_lm_prob=recipe.masked_lm_prob,
        max_predictions_per_seq=recipe.max_predictions_per_seq,
        whole_word_mask=recipe.whole_word_mask,
        pack_documents=recipe.pack_documents,
        tokenizer=tokenizer,
        **extra,
    )


def recipe_words(recipe: MaskedLMRecipe | None) -> str:
    """What the log line says of the recipe's masking and packing."""
    recipe = recipe or MaskedLMRecipe()
    return (", whole-word masking" if recipe.whole_word_mask else "") + (
        ", documents packed" if recipe.pack_documents else "")


def setup_bert(config: BertConfig, shards, tokenizer,
               recipe: MaskedLMRecipe | None = None) -> tuple[BertForPreTraining, BertPretrainingSampler]:
    """Build the model and its MLM+NSP sampler for ``lmforge pretrain bert``.

    Args:
        config: the chosen preset / config file; ``vocab_size`` and ``pad_token_id`` are taken from
            the tokenizer.
        shards: an opened :class:`lmforge.data.shards.Shards` made with a WordPiece tokenizer.
        tokenizer: that tokenizer.
        recipe: the pretraining-data recipe (default: :class:`MaskedLMRecipe`'s defaults).
    Returns:
        ``(model, sampler)``.
    """
    check_wordpiece(tokenizer, "BERT")
    if recipe is not None and recipe.pack_documents and config.next_sentence:
        raise ConfigError("pack_documents fills MLM-only rows; set next_sentence=false with it")
    config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    model = BertForPreTraining(config)
    model.tokenizer = tokenizer
    sampler = masked_sampler(BertPretrainingSampler, config, shards, tokenizer, recipe,
                             next_sentence=config.next_sentence)
    logger.info(
        "BERT %d layers, hidden %d, %d heads, vocab %d: %.2fM parameters (%s)",
        config.num_hidden_layers,
        config.hidden_size,
        config.num_attention_heads,
        config.vocab_size,
        model.num_parameters() / 1e6,
        ("MLM + NSP" if config.next_sentence else "MLM only") + recipe_words(recipe),
    )
    return model, sampler
