"""The model families: one entry per family, the one place every other module asks about them.

A family's name is the ``model_type`` in its folders' ``config.json``.  Each :class:`Family` says
where its code lives (config class, model class, presets), which tokenizer it pretrains on, how it
is pretrained, and what it supports (HF interop, generation, fill-mask, transfer modes).  The
family modules are imported only when a class is asked for, so ``import lmforge`` stays cheap.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from ..config import load_json
from ..errors import CheckpointError, ConfigError, LmforgeError


@dataclasses.dataclass(frozen=True)
class Family:
    """What lmforge knows about one model family.

    Attributes:
        name: the family's ``model_type`` (``"bert"``...).
        label: how reports name it (``"BERT"``).
        module: import path of the module holding the config class and the model class.
        model_class_name, config_class_name: the classes in ``module``.
        tokenizer_kind: the tokenizer kind its pretraining needs (``"wordpiece"``, ``"bpe"``), None = any.
        trainer: pretrained step by step by :class:`lmforge.train.Trainer`; False = trained by gensim in one
            pass (word2vec).
        hf_module: the :mod:`lmforge.interop` module mapping it to and from ``transformers`` (None = no HF
            interop); ``hf_model_type`` the HF ``model_type`` that module reads and writes.
        generates: has ``generate`` (``lmforge generate``).
        fills_mask: has ``fill_mask`` (``lmforge fill-mask``).
        transfer_modes: the transfer modes its body supports (``frozen``, ``features``, ``finetune``).
        inputs_like: the family whose input format transfer builds for this body (special tokens, segments,
            the position a sentence is read at); None = its own.  ELECTRA's discriminator reads BERT's.
        task_tokens: transfer adds the GPT paper's start, delimiter and extract tokens to its inputs.
        aux_lm: fine-tuning adds the LM loss on the task's text (GPT-1's auxiliary objective).
        mixes_layers: transfer reads a learned scalar mix of its layers by default (ELMo).
        pooler: its body has BERT's NSP-trained tanh pooler on ``[CLS]`` (``--pool pooler``).
        recipes: the module holding ``PRESETS``, ``DEFAULT_PRESET`` and ``TRAIN_DEFAULTS`` (keyed by family).
        data_recipe: ``module:Class`` of the config of its pretraining-data recipe (None = the sampler needs
            nothing beyond the model config).
        run_export: the :mod:`lmforge.interop` module writing its transfer runs as HF task models
            (``lmforge export-hf RUN``; see :class:`lmforge.interop.runs.RunExport`); None = its runs do not export.
        hf_pool: the sentence read-out (``--pool``) its HF sequence-classification class reads: fine-tuning
            defaults to it, so that a default run exports (None: no such class).
        sentence_transformers: sentence-transformers' Transformer module reads its HF export (BERT's input
            format: ``[CLS] ... [SEP]`` under an attention mask), so ``export-hf`` also writes that library's
            pooling files and ``--pool mean+specials`` gives its mean.
    """

    name: str
    label: str
    module: str
    model_class_name: str
    config_class_name: str
    tokenizer_kind: str | None
    trainer: bool
    hf_module: str | None = None
    hf_model_type: str | None = None
    generates: bool = False
    fills_mask: bool = False
    transfer_modes: tuple[str, ...] = ()
    inputs_like: str | None = None
    data_recipe: str | None = None
    task_tokens: bool = False
    aux_lm: bool = False
    mixes_layers: bool = False
    pooler: bool = False
    recipes: str = "lmforge.families.recipes"
    run_export: str | None = None
    hf_pool: str | None = None
    sentence_transformers: bool = False

    @property
    def input_format(self) -> str:
        """The family name transfer's input format is keyed by (:attr:`inputs_like`, else this family's)."""
        return self.inputs_like or self.name

    def import_module(self) -> ModuleType:
        return importlib.import_module(self.module)

    @property
    def model_class(self) -> type:
        return getattr(self.import_module(), self.model_class_name)

    @property
    def config_class(self) -> type:
        return getattr(self.import_module(), self.config_class_name)

    @property
    def recipe_class(self) -> type | None:
        """The config class of the family's pretraining-data recipe (``module:Class``), None when it has none."""
        if self.data_recipe is None:
            return None
        module, name = self.data_recipe.split(":")
        return getattr(importlib.import_module(module), name)

    @property
    def presets(self) -> dict[str, dict[str, Any]]:
        return dict(importlib.import_module(self.recipes).PRESETS.get(self.name, {}))

    @property
    def default_preset(self) -> str | None:
        return importlib.import_module(self.recipes).DEFAULT_PRESET.get(self.name)

    @property
    def train_defaults(self) -> dict[str, Any]:
        """``TrainConfig`` overrides of the family (empty for families trained without the Trainer)."""
        return dict(importlib.import_module(self.recipes).TRAIN_DEFAULTS.get(self.name, {}))


# the CLI lists the families in this order
FAMILIES: dict[str, Family] = {
    "bert": Family(
        "bert", "BERT", "lmforge.families.bert.model", "BertForPreTraining", "BertConfig", "wordpiece", trainer=True,
        hf_module="lmforge.families.bert.hf", hf_model_type="bert", fills_mask=True,
        transfer_modes=("frozen", "features", "finetune"), data_recipe="lmforge.families.bert.data:MaskedLMRecipe",
        run_export="lmforge.families.bert.runs", pooler=True, hf_pool="pooler", sentence_transformers=True,
    ),
    "gpt": Family(
        "gpt", "GPT", "lmforge.families.gpt.model", "GPTLMHeadModel", "GPTConfig", "bpe", trainer=True,
        hf_module="lmforge.families.gpt.hf", hf_model_type="gpt2", generates=True,
        transfer_modes=("frozen", "features", "finetune"), task_tokens=True, aux_lm=True,
        run_export="lmforge.families.gpt.runs", hf_pool="last",
    ),
    "elmo": Family(
        "elmo", "ELMo", "lmforge.families.elmo.model", "ElmoBiLM", "ElmoConfig", None, trainer=True,
        transfer_modes=("frozen", "features"), mixes_layers=True,
    ),
    "word2vec": Family(
        "word2vec", "word2vec", "lmforge.families.word2vec.model", "Word2Vec", "Word2VecConfig", None, trainer=False,
        transfer_modes=("frozen", "features", "finetune"),
    ),
    "electra": Family(
        "electra", "ELECTRA", "lmforge.families.electra.model", "ElectraForPreTraining", "ElectraConfig", "wordpiece",
        trainer=True, hf_module="lmforge.families.electra.hf", hf_model_type="electra", fills_mask=True,
        transfer_modes=("frozen", "features", "finetune"), inputs_like="bert",
        data_recipe="lmforge.families.bert.data:MaskedLMRecipe",
        run_export="lmforge.families.electra.runs", hf_pool="cls", sentence_transformers=True,
    ),
}


def get_family(name: str | None, error: type[LmforgeError] = ConfigError) -> Family:
    """The :class:`Family` called ``name``; an unknown name is ``error`` naming the known ones."""
    if name not in FAMILIES:
        raise error(f"unknown model family '{name}'; choose one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def model_class(model_type: str) -> type:
    """The model class of ``model_type`` (e.g. ``"bert"``); unknown -> CheckpointError."""
    if model_type not in FAMILIES:
        raise CheckpointError(f"unknown model_type '{model_type}'; known: {', '.join(FAMILIES)}")
    return FAMILIES[model_type].model_class


def folder_family(path: str | Path) -> Family:
    """The family of the model folder at ``path``, from its ``config.json`` (CheckpointError when it has none)."""
    p = Path(path)
    if not p.is_dir():
        raise CheckpointError(f"model folder not found: {p}")
    data = load_json(p / "config.json")
    if "model_type" not in data:
        raise CheckpointError(f"{p / 'config.json'} has no model_type; is this an lmforge model folder?")
    if data["model_type"] not in FAMILIES:
        raise CheckpointError(f"unknown model_type '{data['model_type']}'; known: {', '.join(FAMILIES)}")
    return FAMILIES[data["model_type"]]


def load(path: str | Path):
    """Open any lmforge model folder; the family comes from ``config.json``'s ``model_type``.

    Returns:
        The model in eval mode, with its tokenizer attached as ``model.tokenizer``.
    """
    return folder_family(path).model_class.from_pretrained(Path(path))
