"""The arrays of a shard folder checked in full before anything trains on them or evaluates them.

A damaged or hand-made shard file would otherwise fail deep inside a run: a token id at or above the vocabulary
is an ``IndexError`` in the embedding (``evaluate lm`` on a val split nobody read before), random bytes in an
offsets file a ``ValueError`` in the BERT sampler.  Every file is read once, in chunks of a memory map (a
maximum, and for offsets a difference, per chunk), so the check costs one pass over the files at disk speed
and no memory; a folder already checked in this process, unchanged since, is not read again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import DataError
from .shard_meta import SPLITS

#: elements read at a time (64 MiB of uint32 tokens, 128 MiB of int64 offsets)
CHUNK = 1 << 24

#: (file, size, mtime_ns) of the files already checked in this process
_CHECKED: set[tuple[str, int, int]] = set()


def check_shard_arrays(folder: Path, meta: dict, dtype: np.dtype) -> None:
    """Refuse (DataError, naming the file) tokens at or above ``meta["vocab_size"]`` and offsets that do not
    run from 0 up to the next array's length without going back, in both splits.

    The files' sizes are :meth:`lmforge.data.shards.Shards.open`'s to check, before this.
    """
    vocab = int(meta["vocab_size"])
    again = "the file is damaged or comes from another run; run lmforge prepare again"
    for split in SPLITS:
        counts = meta["splits"][split]
        tokens = folder / f"{split}.tokens.bin"
        if _fresh(tokens):
            top = _max(tokens, dtype, counts["tokens"])
            if top >= vocab:
                raise DataError(f"{tokens} holds token id {top}, but meta.json says vocab_size {vocab} (ids 0.."
                                f"{vocab - 1}): {again}")
            _done(tokens)
        for name, end in (("sentences", counts["tokens"]), ("documents", counts["sentences"])):
            f = folder / f"{split}.{name}.bin"
            if _fresh(f):
                problem = _offsets_problem(f, end)
                if problem:
                    raise DataError(f"{f} {problem}: {again}")
                _done(f)


def _stamp(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


def _fresh(path: Path) -> bool:
    return _stamp(path) not in _CHECKED


def _done(path: Path) -> None:
    _CHECKED.add(_stamp(path))


def _max(path: Path, dtype: np.dtype, n: int) -> int:
    """The largest of the ``n`` values of ``dtype`` in ``path`` (-1 when there are none)."""
    if n == 0:
        return -1
    arr = np.memmap(path, dtype=dtype, mode="r", shape=(n,))
    return max(int(arr[i:i + CHUNK].max()) for i in range(0, n, CHUNK))


def _offsets_problem(path: Path, end: int) -> str | None:
    """What is wrong with the int64 offsets in ``path`` (0 first, never decreasing, ``end`` last), or None."""
    n = path.stat().st_size // 8
    if n == 0:
        return "holds no offsets"
    arr = np.memmap(path, dtype=np.int64, mode="r", shape=(n,))
    if int(arr[0]) != 0 or int(arr[-1]) != end:
        return f"runs from {int(arr[0])} to {int(arr[-1])}, not from 0 to {end}"
    for i in range(0, n - 1, CHUNK):
        step = np.diff(arr[i:i + CHUNK + 1])  # one past the chunk: the step across its end too
        if step.size and int(step.min()) < 0:
            at = i + int(np.argmin(step >= 0))
            return f"goes back at entry {at + 1} ({int(arr[at])} then {int(arr[at + 1])})"
    return None
