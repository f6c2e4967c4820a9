"""The model families and their registry: :data:`FAMILIES`, the one list every other module asks.

Each family is a folder, ``lmforge/families/<name>/``, holding its architecture, pretraining data and presets,
HF weight map, run export, card facts and transfer input rules, and exporting one :class:`Family` object,
``FAMILY``.  A family's name is the ``model_type`` in its folders' ``config.json``.  Adding a family is one
folder and one line below; a plugin (or a test) adds one at run time with :func:`register`.
"""

from __future__ import annotations

from pathlib import Path

from ..config import load_json
from ..errors import CheckpointError, ConfigError, LmforgeError
from ..models import family_hook
from ..storage import cards
from .base import PLAIN, Family, InputRules
from .bert import FAMILY as BERT
from .electra import FAMILY as ELECTRA
from .elmo import FAMILY as ELMO
from .gpt import FAMILY as GPT
from .word2vec import FAMILY as WORD2VEC

# name -> family; the CLI lists the families in this order
FAMILIES: dict[str, Family] = {}


class Registration:
    """A family added by :func:`register`; :meth:`undo` (or leaving its ``with`` block) takes it out again and puts
    back the family it replaced."""

    def __init__(self, family: Family, replaced: Family | None):
        self.family, self.replaced = family, replaced

    def undo(self) -> None:
        if FAMILIES.get(self.family.name) is not self.family:
            return  # already undone, or replaced since
        if self.replaced is None:
            del FAMILIES[self.family.name]
        else:
            FAMILIES[self.family.name] = self.replaced

    def __enter__(self) -> Family:
        return self.family

    def __exit__(self, *exc) -> None:
        self.undo()


def register(family: Family, replace: bool = False) -> Registration:
    """Add ``family`` to :data:`FAMILIES` (``with register(MyFamily()): ...`` for the length of a block).

    Args:
        family: a :class:`Family` instance; its ``name`` is the ``model_type`` its folders record.
        replace: put it in place of a registered family of the same name (a ConfigError otherwise).
    Returns:
        A :class:`Registration` whose ``undo()`` restores the registry as it was.
    """
    if not isinstance(family, Family) or not family.name:
        raise ConfigError(f"register() takes a Family with a name, not {family!r}")
    replaced = FAMILIES.get(family.name)
    if replaced is not None and not replace:
        raise ConfigError(f"a model family named '{family.name}' is already registered; pass replace=True")
    FAMILIES[family.name] = family
    return Registration(family, replaced)


register(BERT)
register(GPT)
register(ELMO)
register(WORD2VEC)
register(ELECTRA)


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


def _card(name: str):
    family = FAMILIES.get(name)
    return family.card if family is not None else None


# model cards and the shared model code sit below the registry: it tells them each family's facts
cards.use_family_cards(_card)
family_hook.use_family_lookup(FAMILIES.get)

__all__ = ["FAMILIES", "PLAIN", "Family", "InputRules", "Registration", "folder_family", "get_family", "load",
           "model_class", "register"]
