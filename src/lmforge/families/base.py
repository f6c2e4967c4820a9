"""What every model family is: a :class:`Family` object whose facts are attributes and whose behaviour is methods.

Each family's folder (``lmforge/families/<name>/``) defines a subclass and exports one instance, ``FAMILY``; the
registry (:mod:`lmforge.families`) lists them.  Train, transfer, serve, the model cards and HF interop ask that
object, never a table keyed by family name.  The methods import the family's own heavy modules (the model, its
sampler, its HF weight map) when they are called, so that ``import lmforge`` stays light.

A family overrides what differs from the defaults here: a family without HF interop keeps :meth:`hf_interop`'s
``None``, a family the Trainer does not drive (word2vec) sets ``trainer = False`` and overrides
:meth:`run_pretraining` instead of :meth:`pretraining_setup`.  docs/architecture.md ("How to add a family") walks
through a new one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import LmforgeError
from ..storage.cards import FamilyCard


@dataclasses.dataclass(frozen=True)
class InputRules:
    """How transfer builds a body's input from a text (or pair), and where it reads a whole sentence.

    Attributes:
        layout: how the pieces are assembled: ``"cls_sep"`` (BERT's ``[CLS] A [SEP] B [SEP]`` with segments),
            ``"task_tokens"`` (GPT-1's start, delimiter and extract tokens) or ``"plain"`` (the word pieces alone).
        n_special: special tokens the layout adds around a pair.
        pools: the sentence read-outs (``--pool``) it has a position for, beyond ``mean`` and ``tokens``.
        needs_ids: the tokenizer ids the layout needs (``cls_id``...).
        summary_needs_nsp: its summary position is trained only by next-sentence prediction (BERT's ``[CLS]``).
        default_pool: how a sentence is read when ``--pool`` is not given.
    """

    layout: str = "plain"
    n_special: int = 0
    pools: tuple[str, ...] = ()
    needs_ids: tuple[str, ...] = ()
    summary_needs_nsp: bool = False
    default_pool: str = "mean"


PLAIN = InputRules()


class Family:
    """What lmforge knows about one model family; subclasses set the attributes and override the methods.

    Attributes:
        name: the family's ``model_type`` (``"bert"``...), the name the CLI and the folders use.
        label: how reports name it (``"BERT"``).
        tokenizer_kind: the tokenizer kind its pretraining needs (``"wordpiece"``, ``"bpe"``), None = any.
        trainer: pretrained step by step by :class:`lmforge.train.Trainer` (:meth:`pretraining_setup`); False =
            trained in one pass by :meth:`run_pretraining` (word2vec's gensim).
        hf_model_type: the HF ``model_type`` :meth:`hf_interop` reads and writes (None = no HF interop).
        generates: has ``generate`` (``lmforge generate``).
        fills_mask: has ``fill_mask`` (``lmforge fill-mask``).
        transfer_modes: the transfer modes its body supports (``frozen``, ``features``, ``finetune``).
        contextual: a token's vectors depend on its context (False: one static vector per token, word2vec).
        unsupported_tasks: transfer tasks its body cannot serve (a static word vector cannot locate an answer span).
        inputs_like: the family whose input format transfer builds for this body (None = its own); ELECTRA's
            discriminator reads BERT's.
        input_rules: the :class:`InputRules` of that format.
        task_tokens: transfer adds the GPT paper's start, delimiter and extract tokens to its inputs.
        aux_lm: fine-tuning adds the LM loss on the task's text (GPT-1's auxiliary objective).
        mixes_layers: transfer reads a learned scalar mix of its layers by default (ELMo).
        pooler: its body has BERT's NSP-trained tanh pooler on ``[CLS]`` (``--pool pooler``).
        hf_pool: the sentence read-out (``--pool``) its HF sequence-classification class reads: fine-tuning
            defaults to it, so that a default run exports (None: no such class).
        sentence_transformers: sentence-transformers' Transformer module reads its HF export (BERT's input
            format), so ``export-hf`` also writes that library's pooling files.
        transfer_recipes: transfer mode (``scratch``, ``finetune``...) -> ``(lr, epochs, warmup, layer_lr_decay,
            patience)`` where the family departs from transfer's defaults.
        card: what its model cards say of it (None: the card names the ``model_type`` only).
        max_epochs: the most passes a budget plan makes over the training split (None: the planner's default).
        grows_when_capped: a timed budget plan moves to a larger shape when the small one would repeat the
            data past :attr:`max_epochs` (measured for BERT).
    """

    name: str = ""
    label: str = ""
    tokenizer_kind: str | None = None
    trainer: bool = True
    hf_model_type: str | None = None
    generates: bool = False
    fills_mask: bool = False
    transfer_modes: tuple[str, ...] = ()
    contextual: bool = True
    unsupported_tasks: tuple[str, ...] = ()
    inputs_like: str | None = None
    input_rules: InputRules = PLAIN
    task_tokens: bool = False
    aux_lm: bool = False
    mixes_layers: bool = False
    pooler: bool = False
    hf_pool: str | None = None
    sentence_transformers: bool = False
    transfer_recipes: dict[str, tuple] = {}
    card: FamilyCard | None = None
    max_epochs: float | None = None
    grows_when_capped: bool = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    @property
    def input_format(self) -> str:
        """The family name transfer's input format is keyed by (:attr:`inputs_like`, else this family's)."""
        return self.inputs_like or self.name

    # -- the architecture -------------------------------------------------------------------------------------
    @property
    def model_class(self) -> type:
        """The model class (a :class:`lmforge.models.base.PretrainedModel`)."""
        raise NotImplementedError(f"the {self.name} family names no model class")

    @property
    def config_class(self) -> type:
        """The dataclass of the model's ``config.json``."""
        raise NotImplementedError(f"the {self.name} family names no config class")

    # -- pretraining ------------------------------------------------------------------------------------------
    @property
    def recipe_class(self) -> type | None:
        """The config class of the family's pretraining-data recipe; None when its sampler needs nothing beyond
        the model config."""
        return None

    def preset_module(self) -> ModuleType | Any:
        """The object holding the family's ``PRESETS`` (name -> config fields), ``DEFAULT_PRESET`` (a name or
        None) and ``TRAIN_DEFAULTS`` (``TrainConfig`` overrides): its folder's ``presets.py``."""
        raise NotImplementedError(f"the {self.name} family has no presets")

    @property
    def presets(self) -> dict[str, dict[str, Any]]:
        return dict(self.preset_module().PRESETS)

    @property
    def default_preset(self) -> str | None:
        return self.preset_module().DEFAULT_PRESET

    @property
    def train_defaults(self) -> dict[str, Any]:
        """``TrainConfig`` overrides of the family (empty for families trained without the Trainer)."""
        return dict(self.preset_module().TRAIN_DEFAULTS)

    def pretraining_setup(self, config, shards, tokenizer, recipe=None) -> tuple[Any, Any]:
        """``(model, sampler)``: a fresh model of ``config`` fitted to the shards' ``tokenizer`` and the sampler
        its objective reads (``recipe``: the pretraining-data recipe, for a family that has one)."""
        raise LmforgeError(f"{self.name} is trained in one pass; it has no Trainer setup")

    def run_pretraining(self, shards, tokenizer, config, out_dir: str | Path):
        """Train a family that the Trainer does not drive, in one pass, into ``out_dir``."""
        raise LmforgeError(f"{self.name} is pretrained by the Trainer; use its pretraining_setup")

    # -- transfer ---------------------------------------------------------------------------------------------
    def task_format(self, body) -> Any:
        """The object that adds the family's task tokens to ``body``'s inputs (``start_id``, ``delim_id``,
        ``extract_id``, as GPT-1's input transformations), for a family with :attr:`task_tokens`."""
        raise LmforgeError(f"the {self.name} family adds no task tokens to its inputs")

    # -- HF interop and run export ----------------------------------------------------------------------------
    def hf_interop(self) -> ModuleType | None:
        """The module mapping the family to and from ``transformers`` (``export_hf(model, out_dir)``,
        ``import_hf(hf_dir, warn_fresh_heads=...)``); None = no HF interop."""
        return None

    def run_export(self) -> ModuleType | None:
        """The module writing the family's transfer runs as HF task models (see
        :class:`lmforge.interop.runs.RunExport`); None = its runs do not export."""
        return None

    @property
    def exports_runs(self) -> bool:
        """Whether ``lmforge export-hf RUN`` exports the family's transfer runs (without importing the module)."""
        return type(self).run_export is not Family.run_export
