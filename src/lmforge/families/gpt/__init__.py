"""The GPT family (Radford et al. 2018/2019): a causal LM on byte-level BPE shards.

The folder holds the architecture (``model.py``), the presets (``presets.py``), the model and sampler built from
shards (``pretraining.py``), the HF GPT-2 weight map (``hf.py``), the export of transfer runs (``runs.py``) and
GPT-1's task input transformations (``inputs.py``).  :data:`FAMILY` is what every other module asks.
"""

from __future__ import annotations

from ...storage.cards import FamilyCard
from ..base import Family, InputRules


class GptFamily(Family):
    name = "gpt"
    label = "GPT"
    tokenizer_kind = "bpe"
    hf_model_type = "gpt2"
    generates = True
    transfer_modes = ("frozen", "features", "finetune")
    # GPT-1's start, delimiter and extract tokens; a sentence is read at the extract token
    input_rules = InputRules("task_tokens", 3, ("last",), default_pool="last")
    task_tokens = True
    aux_lm = True
    hf_pool = "last"
    card = FamilyCard(
        "GPT", "text-generation",
        "continuing text (`lmforge generate`), contextual word vectors, and a body to fine-tune with GPT-1's input "
        "transformations (`lmforge finetune`)",
        hf_architecture="GPT2LMHeadModel")

    @property
    def model_class(self) -> type:
        from .model import GPTLMHeadModel  # lazy: the model imports torch

        return GPTLMHeadModel

    @property
    def config_class(self) -> type:
        from .model import GPTConfig  # lazy: the model imports torch

        return GPTConfig

    def preset_module(self):
        from . import presets  # lazy: read when a model is configured

        return presets

    def pretraining_setup(self, config, shards, tokenizer, recipe=None):
        from .pretraining import setup_gpt  # lazy: the model imports torch

        return setup_gpt(config, shards, tokenizer)

    def task_format(self, body):
        from .inputs import transfer_format  # lazy: the input transformations import torch

        return transfer_format(body)

    def hf_interop(self):
        from . import hf  # lazy: the weight map imports torch

        return hf

    def run_export(self):
        from . import runs  # lazy: the run export imports torch

        return runs


FAMILY = GptFamily()
