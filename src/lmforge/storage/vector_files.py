"""The two files ``lmforge encode`` writes: ``.npy`` (the float32 array, never pickled) and ``.parquet``
(``text`` and ``vector`` columns), each written whole or not at all."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import LmforgeError, require
from .files import atomic_path

VECTOR_SUFFIXES = (".npy", ".parquet")


def save_vectors(path: str | Path, texts: Sequence[str], vectors: np.ndarray) -> Path:
    """Write vectors atomically: ``.npy`` (the float32 array, never pickled) or ``.parquet`` (columns ``text``
    string and ``vector`` list<float32>, one row per text)."""
    p = Path(path)
    if p.suffix not in VECTOR_SUFFIXES:
        raise LmforgeError(f"cannot write '{p.name}': the output must end in {' or '.join(VECTOR_SUFFIXES)}")
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    with atomic_path(p) as tmp:
        if p.suffix == ".npy":
            with open(tmp, "wb") as f:
                np.save(f, vectors, allow_pickle=False)
        else:
            pa, pq = pyarrow_modules()
            n, width = vectors.shape
            column = pa.ListArray.from_arrays(pa.array(np.arange(0, n * width + 1, width, dtype=np.int32)),
                                              pa.array(vectors.reshape(-1)))
            pq.write_table(pa.table({"text": pa.array(list(texts), pa.string()), "vector": column}), tmp)
    return p


def load_vectors(path: str | Path) -> np.ndarray:
    """The (n, C) float32 array of a file :func:`save_vectors` wrote (``.npy`` read with ``allow_pickle=False``)."""
    p = Path(path)
    if p.suffix == ".npy":
        return np.load(p, allow_pickle=False)
    if p.suffix != ".parquet":
        raise LmforgeError(f"cannot read '{p.name}': vectors are .npy or .parquet files")
    _, pq = pyarrow_modules()
    column = pq.read_table(p, columns=["vector"]).column("vector").combine_chunks()
    width = len(column[0]) if len(column) else 0
    return column.flatten().to_numpy().astype(np.float32, copy=False).reshape(len(column), width)


def pyarrow_modules():
    """``(pyarrow, pyarrow.parquet)``, or the one-line advice to install the ``data`` extra."""
    require("pyarrow", "data")  # optional dependency, imported only for parquet files
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


__all__ = ["VECTOR_SUFFIXES", "save_vectors", "load_vectors", "pyarrow_modules"]
