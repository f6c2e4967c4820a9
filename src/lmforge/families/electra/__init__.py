"""The ELECTRA family (Clark et al. 2020): replaced-token detection, a small generator filling BERT's masks and a
discriminator telling the replaced tokens apart.

The folder holds the architecture (``model.py``), its sampler (``data.py``, BERT's rows plus the sampling noise),
the presets (``presets.py``), the model and sampler built from shards (``pretraining.py``), the HF weight map
(``hf.py``) and the export of transfer runs (``runs.py``).  :data:`FAMILY` is what every other module asks.
"""

from __future__ import annotations

from ...storage.cards import FamilyCard
from ..base import Family
from ..bert import BERT_INPUTS


class ElectraFamily(Family):
    name = "electra"
    label = "ELECTRA"
    tokenizer_kind = "wordpiece"
    hf_model_type = "electra"
    fills_mask = True  # with its small generator
    transfer_modes = ("frozen", "features", "finetune")
    inputs_like = "bert"  # the discriminator reads BERT's [CLS] A [SEP] B [SEP]
    input_rules = BERT_INPUTS
    hf_pool = "cls"
    sentence_transformers = True
    card = FamilyCard(  # the discriminator is the body; its generator fills masks besides
        "ELECTRA", "feature-extraction",
        "contextual word vectors from the discriminator (`lmforge embed`), a body to fine-tune on the same tasks "
        "as BERT (`lmforge finetune`), and filling in masked words with its small generator (`lmforge fill-mask`)",
        hf_architecture="ElectraForPreTraining")
    max_epochs = 32.0  # ELECTRA's rows are BERT's (docs/training.md "Budgets")
    grows_when_capped = True  # as BERT's

    @property
    def model_class(self) -> type:
        from .model import ElectraForPreTraining  # lazy: the model imports torch

        return ElectraForPreTraining

    @property
    def config_class(self) -> type:
        from .model import ElectraConfig  # lazy: the model imports torch

        return ElectraConfig

    @property
    def recipe_class(self) -> type:
        from ..bert.data import MaskedLMRecipe  # lazy: the sampler imports torch; BERT's recipe

        return MaskedLMRecipe

    def preset_module(self):
        from . import presets  # lazy: read when a model is configured

        return presets

    def pretraining_setup(self, config, shards, tokenizer, recipe=None):
        from .pretraining import setup_electra  # lazy: the model and its sampler import torch

        return setup_electra(config, shards, tokenizer, recipe)

    def hf_interop(self):
        from . import hf  # lazy: the weight map imports torch

        return hf

    def run_export(self):
        from . import runs  # lazy: the run export imports torch

        return runs


FAMILY = ElectraFamily()
