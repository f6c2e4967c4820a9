"""Small helpers shared across lmforge: atomic writes, safetensors I/O, logging, seeding, hashing."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import re
import tempfile
from pathlib import Path

logger = logging.getLogger("lmforge")


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside ``path``; on success fsync it and rename it over ``path``.

    A crash or an exception leaves whatever was at ``path`` untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    try:
        yield tmp_path
        # mkstemp makes 0600 files (and a writer may have replaced the file: safetensors does); give the
        # result the mode a plain open() would have.
        os.chmod(tmp_path, 0o666 & ~umask)
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
        _fsync_dir(path.parent)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        if e.filename is None or e.filename == str(tmp_path):  # name the file the user knows, not the temp
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def save_safetensors(tensors: dict, path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Save a dict of tensors to safetensors atomically (shared storage is cloned first)."""
    from safetensors.torch import save_file

    flat = {k: v.detach().contiguous().clone() if not v.is_contiguous() else v.detach() for k, v in tensors.items()}
    # safetensors refuses tensors that share memory (tied weights): give each its own copy.
    seen: dict[int, str] = {}
    for k, v in list(flat.items()):
        ptr = v.untyped_storage().data_ptr() if v.numel() else -1
        if ptr in seen and ptr != -1:
            flat[k] = v.clone()
        else:
            seen[ptr] = k
    from safetensors import SafetensorError

    with atomic_path(path) as tmp:
        try:
            save_file({k: v.cpu() for k, v in flat.items()}, str(tmp), metadata=metadata)
        except SafetensorError as e:  # an I/O error inside safetensors (disk full...): make it the OSError it is
            m = re.search(r"os error (\d+)", str(e))
            if m is None:
                raise
            code = int(m.group(1))
            raise OSError(code, os.strerror(code), str(path)) from None
        if metadata and len(metadata) > 1:
            _sort_metadata(tmp)


def _sort_metadata(path: Path) -> None:
    """Rewrite a safetensors header with its metadata keys sorted, in place.

    safetensors writes ``__metadata__`` from a hash map, so its key order (and the file's sha256) changes
    from one process to the next; sorted keys make equal weights give byte-equal files.  Reordering keeps
    the header's length, so only the header bytes are rewritten.
    """
    import json

    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if len(text) > n:  # pragma: no cover - the same keys and values cannot grow
            return
        f.seek(8)
        f.write(text + b" " * (n - len(text)))


def load_safetensors(path: str | Path) -> dict:
    """Load a safetensors file to CPU tensors with a one-line error if missing or corrupt."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .errors import CheckpointError

    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"weights file not found: {p}")
    try:
        return load_file(str(p), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{p} is not a readable safetensors file ({e}); re-save or re-download it") from None


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch RNGs."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def setup_logging(level: int = logging.INFO) -> None:
    """Route lmforge's library logs to stderr (called by the CLI, never by library code)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("lmforge")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
