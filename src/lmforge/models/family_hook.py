"""The one fact the shared model code asks of the family registry, handed in from above.

The registry (:mod:`lmforge.families`) imports every family's model code, which builds on this package; so this
package never imports the registry.  The registry hands its lookup in when it loads (:func:`use_family_lookup`),
and importing any family module loads the registry first (it is their package), so a model class never runs
without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _none(model_type: str | None) -> Any:
    return None


_lookup: Callable[[str | None], Any] = _none


def use_family_lookup(lookup: Callable[[str | None], Any]) -> None:
    """Answer :func:`family_of` with ``lookup`` (called once by :mod:`lmforge.families`)."""
    global _lookup
    _lookup = lookup


def family_of(model_type: str | None) -> Any:
    """The registered :class:`lmforge.families.Family` called ``model_type``, or None (unknown, or a stand-in body)."""
    return _lookup(model_type)


__all__ = ["family_of", "use_family_lookup"]
