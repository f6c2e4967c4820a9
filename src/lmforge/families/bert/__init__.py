"""The BERT family (Devlin et al. 2018): masked-LM and next-sentence pretraining on WordPiece shards.

The folder holds the architecture (``model.py``), the pretraining rows and their recipe (``data.py``), the
presets (``presets.py``), the model and sampler built from shards (``pretraining.py``), the HF weight map
(``hf.py``) and the export of transfer runs to HF task classes (``runs.py``).  :data:`FAMILY` is what every other
module asks; its methods import those modules when called (they import torch), so the registry stays light.
"""

from __future__ import annotations

from ...storage.cards import FamilyCard
from ..base import Family, InputRules

# [CLS] A [SEP] B [SEP] with segment ids; a sentence is read at [CLS] (or through the NSP-trained pooler)
BERT_INPUTS = InputRules("cls_sep", 3, ("cls", "pooler"), ("cls_id", "sep_id"), summary_needs_nsp=True,
                         default_pool="cls")


class BertFamily(Family):
    name = "bert"
    label = "BERT"
    tokenizer_kind = "wordpiece"
    hf_model_type = "bert"
    fills_mask = True
    transfer_modes = ("frozen", "features", "finetune")
    input_rules = BERT_INPUTS
    pooler = True
    hf_pool = "pooler"
    sentence_transformers = True
    card = FamilyCard(
        "BERT", "fill-mask",
        "filling in masked words (`lmforge fill-mask`), contextual word vectors (`lmforge embed`), and a body to "
        "fine-tune on classification, pair, tagging, QA and multiple-choice tasks (`lmforge finetune`)",
        hf_architecture="BertForPreTraining")
    max_epochs = 32.0  # BERT draws new masks on every pass; 32 passes beat 16 on two small corpora (docs/training.md)
    grows_when_capped = True  # measured on one small corpus only (the tweets, docs/training.md "Budgets")

    @property
    def model_class(self) -> type:
        from .model import BertForPreTraining  # lazy: the model imports torch

        return BertForPreTraining

    @property
    def config_class(self) -> type:
        from .model import BertConfig  # lazy: the model imports torch

        return BertConfig

    @property
    def recipe_class(self) -> type:
        from .data import MaskedLMRecipe  # lazy: the sampler imports torch

        return MaskedLMRecipe

    def preset_module(self):
        from . import presets  # lazy: read when a model is configured

        return presets

    def pretraining_setup(self, config, shards, tokenizer, recipe=None):
        from .pretraining import setup_bert  # lazy: the model and its sampler import torch

        return setup_bert(config, shards, tokenizer, recipe)

    def hf_interop(self):
        from . import hf  # lazy: the weight map imports torch

        return hf

    def run_export(self):
        from . import runs  # lazy: the run export imports torch

        return runs


FAMILY = BertFamily()
