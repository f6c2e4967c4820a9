"""The model families' registry, re-exported from :mod:`lmforge.families` (one folder per family there).

``FAMILIES`` maps a family name (a folder's ``model_type``) to its :class:`Family` object;
:func:`load` opens any model folder.  The family modules are imported lazily so that
``import lmforge`` stays cheap.
"""

from __future__ import annotations

from ..families import FAMILIES, Family, folder_family, get_family, load, model_class

__all__ = ["FAMILIES", "Family", "folder_family", "get_family", "load", "model_class"]
