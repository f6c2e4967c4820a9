"""The word2vec family (Mikolov et al. 2013): static word vectors, trained by gensim in one pass.

The folder holds the vectors as a body (``model.py``), the presets (``presets.py``) and the gensim run
(``train.py``).  :data:`FAMILY` is what every other module asks.
"""

from __future__ import annotations

from ...storage.cards import FamilyCard
from ..base import Family


class Word2VecFamily(Family):
    name = "word2vec"
    label = "word2vec"
    trainer = False  # gensim trains it in one pass
    transfer_modes = ("frozen", "features", "finetune")
    contextual = False  # one vector per token, the same in every context
    unsupported_tasks = ("qa",)  # a static word vector cannot locate an answer span
    # a bag of word vectors trained from zero, or fine-tuned from pretrained ones (Kim 2014's "non-static"), learns
    # at an embedding-bag rate (fastText uses 0.1-1.0): (lr, epochs, warmup, layer_lr_decay, patience)
    transfer_recipes = {"scratch": (1e-2, 20, 0.1, None, 5), "finetune": (1e-2, 20, 0.1, None, 5)}
    card = FamilyCard("word2vec", "feature-extraction",
                      "static word vectors (one per token, the same in every context) for feature-based transfer",
                      " Static vectors cannot tell the senses of a word apart.")

    @property
    def model_class(self) -> type:
        from .model import Word2Vec  # lazy: the model imports torch

        return Word2Vec

    @property
    def config_class(self) -> type:
        from .model import Word2VecConfig  # lazy: the model imports torch

        return Word2VecConfig

    def preset_module(self):
        from . import presets  # lazy: read when a model is configured

        return presets

    def run_pretraining(self, shards, tokenizer, config, out_dir):
        from .train import run_pretraining  # lazy: gensim is an optional, heavy dependency

        return run_pretraining(shards, tokenizer, config, out_dir)


FAMILY = Word2VecFamily()
