"""The four model families and their registry (:mod:`lmforge.families.registry`).

``FAMILIES`` maps a family name (a folder's ``model_type``) to what lmforge knows about it;
:func:`load` opens any model folder.  The family modules are imported lazily so that
``import lmforge`` stays cheap.
"""

from __future__ import annotations

from ..families.registry import FAMILIES, Family, folder_family, get_family, load, model_class

__all__ = ["FAMILIES", "Family", "folder_family", "get_family", "load", "model_class"]
