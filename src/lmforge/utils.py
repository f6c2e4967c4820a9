"""Small checks shared across lmforge: valid Unicode, memory before an allocation, seeds, logging."""

from __future__ import annotations

import logging
import random
from pathlib import Path

from .errors import DataError, LmforgeError

logger = logging.getLogger("lmforge")


def check_unicode(text: str, where: str = "the text") -> str:
    """``text`` itself if it is valid Unicode, else a DataError saying where it is not.

    Every text enters the tokenizer through :class:`lmforge.tokenization.Tokenizer`'s encode methods, and every
    record's text through the corpus and task readers, which call this: a lone surrogate (``"\\ud800"`` in JSON)
    or a byte that is not UTF-8 (a command-line argument, which Python decodes with ``surrogateescape``) would
    otherwise fail inside ``tokenizers`` with a traceback.

    Args:
        where: how the message names the text (a record's place, e.g. ``"data.jsonl:3: 'text'"``).
    """
    if not isinstance(text, str):
        raise DataError(f"{where}: expected text, got {type(text).__name__} {str(text)[:40]!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        if 0xDC80 <= code <= 0xDCFF:
            what = f"the byte 0x{code - 0xDC00:02x} (not UTF-8)"
            fix = "give text encoded as UTF-8 (e.g. iconv -t utf-8)"
        else:
            what = f"a lone surrogate U+{code:04X}"
            fix = "write the character whole (both halves of a pair) or drop it"
        shown = f" {text[:e.start][-20:]!r}..." if where == "the text" else ""
        raise DataError(f"{where}{shown} holds {what} at character {e.start}; {fix}") from None
    return text


def available_memory() -> int | None:
    """Bytes this process can still allocate: the system's ``MemAvailable``, within a cgroup's (a container's)
    limit; None where neither can be read."""
    avail = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            avail = next((int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:")), None)
    except (OSError, ValueError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            room = int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text())
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


def check_memory(nbytes: int, what: str, fix: str, available: int | None = None) -> None:
    """Refuse (one line) a size a user gave that cannot fit, before anything of it is allocated.

    Args:
        nbytes: a lower bound of what ``what`` allocates (so that a run which could fit is never refused).
        what: what needs it, e.g. "--batch-size 100000000 (of 128-token rows)".
        fix: what to do instead.
        available: the bytes free where it is allocated (default: this machine's memory,
            :func:`available_memory`).
    """
    free = available_memory() if available is None else available
    if free is not None and nbytes > free:
        raise LmforgeError(f"{what} needs at least {nbytes / 2**30:,.1f} GiB of memory, but {free / 2**30:,.1f} GiB "
                           f"is free; {fix}")


#: the largest seed lmforge takes: every generator (Python, NumPy after ``% 2**32``, torch) accepts it
#: the whole numbers torch and NumPy compute with (64 bits): every integer a user gives must lie here
INT64 = (-(2**63), 2**63 - 1)
SEED_MAX = INT64[1]


def check_seed(seed, name: str = "seed") -> int | None:
    """``seed`` if it is None or a whole number in [0, :data:`SEED_MAX`]; otherwise a one-line LmforgeError.

    For every seed that comes from a user (the CLI, a request), before it reaches torch or NumPy.
    """
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise LmforgeError(f"{name} must be a whole number from 0 to {SEED_MAX}, got {seed!r}")
    return seed


def seed32(seed: int) -> int:
    """``seed`` folded into 0..2**32-1, the range of NumPy's legacy ``RandomState`` (scikit-learn's
    ``random_state``), which refuses the rest of lmforge's seed range."""
    return int(seed) % (2**32)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch RNGs."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed32(seed))
    torch.manual_seed(seed)


def setup_logging(level: int = logging.INFO) -> None:
    """Route lmforge's library logs to stderr (called by the CLI, never by library code)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("lmforge")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
