"""Files written whole or not at all: atomic writes and folder swaps, safetensors I/O, file hashes."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..config import to_dict
from ..errors import CheckpointError, LmforgeError

logger = logging.getLogger("lmforge")


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries to disk, so a rename into it survives a power cut (a no-op where unsupported)."""
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
        fsync_dir(path.parent)
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


def atomic_write_lines(path: str | Path, lines: Iterable[str]) -> None:
    """Write ``lines`` (each without its newline) as UTF-8 text to ``path`` atomically, one at a time: a large
    file is never held whole in memory."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")


# -- files that change together ------------------------------------------------------------------------
#: the folder of files staged by :func:`write_together`; its rename to this name is the commit point
TOGETHER = ".lmforge-commit"
_REMOVE = ".remove.json"


def write_together(folder: str | Path, files: dict[str, bytes], remove: tuple[str, ...] = ()) -> None:
    """Write ``files`` (name -> bytes) into ``folder`` and delete the names in ``remove``, as one change.

    The files are written and fsynced in a hidden staging folder, which is renamed to :data:`TOGETHER`
    (the commit point); then each file is renamed into place and the stale ones are deleted.  A kill
    before the commit leaves the old files; a kill after it is completed by :func:`finish_together`,
    which every reader of such a folder calls first, so nobody sees a mix of old and new files.
    """
    p = Path(folder)
    p.mkdir(parents=True, exist_ok=True)
    finish_together(p)  # an earlier change that was cut short goes in first
    stage = Path(tempfile.mkdtemp(prefix=f"{TOGETHER}.", suffix=".tmp", dir=p))
    try:
        for name, data in {**files, _REMOVE: json.dumps(sorted(set(remove) - set(files))).encode()}.items():
            with open(stage / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        fsync_dir(stage)
        os.rename(stage, p / TOGETHER)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    fsync_dir(p)
    finish_together(p)


def finish_together(folder: str | Path) -> bool:
    """Complete a :func:`write_together` change that was committed but cut short; True if there was one."""
    p = Path(folder)
    stage = p / TOGETHER
    if not stage.is_dir():
        return False
    try:
        remove = json.loads((stage / _REMOVE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        remove = []
    try:
        names = sorted(os.listdir(stage))
    except FileNotFoundError:  # the writer (or another reader) completed it meanwhile
        return False
    for name in names:
        if name != _REMOVE:
            try:
                os.replace(stage / name, p / name)
            except FileNotFoundError:  # moved by the writer, or another reader, completing the same change
                continue
    for name in remove:
        with contextlib.suppress(FileNotFoundError):
            (p / name).unlink()
    fsync_dir(p)
    shutil.rmtree(stage, ignore_errors=True)
    return True


# -- folders renamed into place ------------------------------------------------------------------------
_RENAME_EXCHANGE = 2  # renameat2 flag (Linux 3.15+): swap two paths in one step
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where that is not
    available (another OS, an old kernel or C library, a filesystem without it)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(b))


def moved_aside(path: str | Path) -> list[Path]:
    """The ``.NAME.old-*`` folders beside ``path`` (copies a replacement moved aside), newest first."""
    p = Path(path)
    prefix = f".{p.name}.old-"
    try:
        found = [p.parent / e.name for e in os.scandir(p.parent) if e.name.startswith(prefix) and e.is_dir()]
    except OSError:
        return []

    def mtime(q: Path) -> float:
        try:
            return q.stat().st_mtime
        except OSError:
            return 0.0

    return sorted(found, key=mtime, reverse=True)


def link_tree(src: Path, dst: Path) -> None:
    """Give the file or folder ``src`` a second name ``dst`` (hard links, so no data is copied; a copy where
    the filesystem has no hard links).  ``src`` stays as it was."""
    def link(a, b):
        try:
            os.link(a, b, follow_symlinks=False)
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            shutil.copy2(a, b, follow_symlinks=False)

    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True, copy_function=link)
    else:
        link(src, dst)


def swap_into_place(new: str | Path, path: str | Path, keep: tuple[str, ...] | list[str] = ()) -> None:
    """Put the complete folder ``new`` at ``path``, replacing what is there, so a kill never leaves ``path`` empty.

    The entries of the old folder named in ``keep`` (what the user put there) go into the new one first, as
    hard links: they are in ``path`` at every instant, before the swap and after it.  Where the system can
    swap two paths in one step, it does (the old copy ends up at ``new``, then deleted).  Elsewhere the old
    folder is renamed to ``.NAME.old-*`` first; a kill before the second rename leaves that copy, which
    ``lmforge.storage.writing.recover_folder`` puts back on the next open.

    Raises:
        LmforgeError: a name in ``keep`` is also in ``new`` (nothing at ``path`` has changed).
    """
    new, p = Path(new), Path(path)
    clash = [name for name in keep if os.path.lexists(new / name)]
    if clash:
        raise LmforgeError(f"{p / clash[0]} was not written by lmforge, and the new output has a file of that name; "
                           f"nothing was replaced: move or rename it, then run again")
    for name in keep:
        link_tree(p / name, new / name)
    if not os.path.lexists(p):
        os.rename(new, p)
    elif _exchange(new, p):
        fsync_dir(p.parent)
        shutil.rmtree(new, ignore_errors=True)
        return
    else:
        old = p.parent / f".{p.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(p, old)
        os.replace(new, p)
        fsync_dir(p.parent)
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(p.parent)


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


def save_json(cfg_or_dict, path: str | Path, **extra: Any) -> None:
    """Write a config (dataclass or dict) as pretty JSON, atomically; ``extra`` keys go first."""
    data = cfg_or_dict if isinstance(cfg_or_dict, dict) else to_dict(cfg_or_dict)
    data = {**extra, **data}
    atomic_write_text(Path(path), json.dumps(data, indent=2, ensure_ascii=False) + "\n")
