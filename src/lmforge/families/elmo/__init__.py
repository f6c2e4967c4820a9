"""The ELMo family (Peters et al. 2018): a character-CNN biLM whose layers transfer mixes with a learned ScalarMix.

The folder holds the architecture (``model.py``), the presets (``presets.py``) and the model and sampler built from
shards (``pretraining.py``).  :data:`FAMILY` is what every other module asks.
"""

from __future__ import annotations

from ...storage.cards import FamilyCard
from ..base import Family


class ElmoFamily(Family):
    name = "elmo"
    label = "ELMo"
    transfer_modes = ("frozen", "features")
    mixes_layers = True
    card = FamilyCard("ELMo", "feature-extraction",
                      "contextual word vectors mixed by a learned ScalarMix for frozen or feature-based transfer")

    @property
    def model_class(self) -> type:
        from .model import ElmoBiLM  # lazy: the model imports torch

        return ElmoBiLM

    @property
    def config_class(self) -> type:
        from .model import ElmoConfig  # lazy: the model imports torch

        return ElmoConfig

    def preset_module(self):
        from . import presets  # lazy: the presets read the model's char filters (torch)

        return presets

    def pretraining_setup(self, config, shards, tokenizer, recipe=None):
        from .pretraining import setup_elmo  # lazy: the model imports torch

        return setup_elmo(config, shards, tokenizer)


FAMILY = ElmoFamily()
