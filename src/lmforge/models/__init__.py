"""What every model family shares: the base class and body interface (:mod:`.base`), word and sentence vectors
(:mod:`.vectors`, :mod:`.sentence`), windows over long texts, nearest neighbours and the ONNX Runtime backend.

The families themselves, and their registry, are :mod:`lmforge.families` (one folder per family), which sits above
this package.
"""
