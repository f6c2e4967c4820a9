"""How each family is pretrained: its model and sampler built from token shards, or gensim in one pass.

The model side (config classes, presets, training defaults) is the registry's
(:data:`lmforge.models.FAMILIES`); the data side (samplers and the BERT pretraining-data recipe) is
:mod:`lmforge.data`'s.  This module joins them: :data:`SETUPS` builds, for each Trainer-based family,
a fresh model fitted to the shards' tokenizer and the sampler its objective reads, and
:func:`pretrain_hooks` gives :mod:`lmforge.train.pretrain` one object per family with everything it needs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from ..data.samplers import BiLMWindowSampler, CausalWindowSampler
from ..errors import ConfigError, DataError, LmforgeError
from . import Family, get_family
from .bert.data import BertPretrainingSampler, MaskedLMRecipe
from .bert.model import BertConfig, BertForPreTraining
from .electra.data import ElectraPretrainingSampler
from .electra.model import ElectraConfig, ElectraForPreTraining
from .elmo.model import ElmoBiLM, ElmoConfig
from .gpt.model import GPTConfig, GPTLMHeadModel
from .word2vec import train as word2vec

logger = logging.getLogger(__name__)


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


def _check_wordpiece(tokenizer, label: str) -> None:
    if getattr(tokenizer, "kind", None) != "wordpiece":
        raise DataError(
            f"{label} needs shards made with a WordPiece tokenizer, but these were made with a "
            f"'{getattr(tokenizer, 'kind', '?')}' tokenizer; train one with kind=wordpiece and prepare the data again"
        )


def _masked_sampler(cls, config, shards, tokenizer, recipe: MaskedLMRecipe | None, **extra):
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


def _recipe_words(recipe: MaskedLMRecipe | None) -> str:
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
    _check_wordpiece(tokenizer, "BERT")
    if recipe is not None and recipe.pack_documents and config.next_sentence:
        raise ConfigError("pack_documents fills MLM-only rows; set next_sentence=false with it")
    config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    model = BertForPreTraining(config)
    model.tokenizer = tokenizer
    sampler = _masked_sampler(BertPretrainingSampler, config, shards, tokenizer, recipe,
                              next_sentence=config.next_sentence)
    logger.info(
        "BERT %d layers, hidden %d, %d heads, vocab %d: %.2fM parameters (%s)",
        config.num_hidden_layers,
        config.hidden_size,
        config.num_attention_heads,
        config.vocab_size,
        model.num_parameters() / 1e6,
        ("MLM + NSP" if config.next_sentence else "MLM only") + _recipe_words(recipe),
    )
    return model, sampler


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
    _check_wordpiece(tokenizer, "ELECTRA")
    config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    model = ElectraForPreTraining(config)
    model.tokenizer = tokenizer
    sampler = _masked_sampler(ElectraPretrainingSampler, config, shards, tokenizer, recipe)
    width, _, _ = config.generator_shape
    logger.info(
        "ELECTRA %d layers, hidden %d, embedding %d, %d heads, generator width %d, vocab %d: %.2fM parameters%s",
        config.num_hidden_layers, config.hidden_size, config.embedding_size, config.num_attention_heads, width,
        config.vocab_size, model.num_parameters() / 1e6, _recipe_words(recipe),
    )
    return model, sampler


# family -> (config, shards, tokenizer) -> (model, sampler), for every family the Trainer pretrains
SETUPS: dict[str, Callable[[Any, Any, Any], tuple[Any, Any]]] = {
    "bert": setup_bert,
    "electra": setup_electra,
    "gpt": setup_gpt,
    "elmo": setup_elmo,
}


class PretrainHooks:
    """What pretraining needs of one Trainer-based family: its presets, defaults and setup.

    Attribute names are upper-case like module constants (``PRESETS``...) so that code written
    against the family modules reads the same.
    """

    def __init__(self, family: Family):
        self.family = family
        self.__name__ = family.name

    @property
    def CONFIG_CLASS(self) -> type:  # noqa: N802 - reads like the module constant it stands for
        return self.family.config_class

    @property
    def PRESETS(self) -> dict[str, dict]:  # noqa: N802
        return self.family.presets

    @property
    def DEFAULT_PRESET(self) -> str | None:  # noqa: N802
        return self.family.default_preset

    @property
    def TRAIN_DEFAULTS(self) -> dict[str, Any]:  # noqa: N802
        return self.family.train_defaults

    def pretraining_setup(self, config, shards, tokenizer, recipe=None):
        """``(model, sampler)`` for ``config`` on ``shards`` (see :data:`SETUPS`); ``recipe``: the family's
        pretraining-data recipe, for a family that has one."""
        setup = SETUPS[self.family.name]
        if self.family.recipe_class is None:
            return setup(config, shards, tokenizer)
        return setup(config, shards, tokenizer, recipe)


class GensimHooks(PretrainHooks):
    """A family trained by gensim in one pass (word2vec): ``run_pretraining`` instead of a setup."""

    def pretraining_setup(self, config, shards, tokenizer, recipe=None):
        raise LmforgeError(f"{self.family.name} is trained by gensim in one pass; it has no Trainer setup")

    def run_pretraining(self, shards, tokenizer, config, out_dir):
        return word2vec.run_pretraining(shards, tokenizer, config, out_dir)


def pretrain_hooks(name: str) -> PretrainHooks:
    """The pretraining hooks of family ``name`` (an unknown name is a ConfigError)."""
    family = get_family(name)
    return PretrainHooks(family) if family.trainer else GensimHooks(family)
