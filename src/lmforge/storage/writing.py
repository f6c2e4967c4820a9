"""Writing an output folder: one writer at a time, and nothing lost when a writer is killed.

A writing command calls :func:`output_folder` before any long work.  Besides the refusals of
:func:`lmforge.storage.folders.check_output_dir`, it refuses, in one line:

- a folder it cannot create or write into (the check writes the marker, so permissions, a read-only
  or full filesystem are found before training starts, not after);
- a folder another lmforge process is writing: the writer holds :data:`lmforge.storage.folders.LOCK` (its pid and
  host).  A lock whose process is gone (same host, pid not running) is taken over with a warning.

It also clears what killed runs leave behind: ``.NAME.XXXX.tmp`` files of interrupted atomic
writes inside the folder and ``.NAME.tmp-*`` siblings of folders that are written beside their final
place and renamed in (shards, exports, runs; :func:`staged_folder`).  A ``.NAME.old-*`` sibling is the
previous copy of a folder whose replacement was cut short: :func:`recover_folder` puts it back where it
belongs (writers and readers both call it), and deletes it, saying so, only once the new folder is in place.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import LmforgeError
from .files import TOGETHER, file_sha256, fsync_dir, moved_aside, save_safetensors, swap_into_place
from .folders import (
    LOCK,
    MARKER,
    OVERWRITE_HINT,
    check_output_dir,
    first_names,
    folder_entries,
    folder_kind,
    os_error_line,
    probe_writable,
    read_json_object,
    record_weights,
    recorded_weights,
    user_files,
    write_marker,
)

logger = logging.getLogger(__name__)


def _main_process() -> bool:
    """False on the non-zero ranks of a torchrun job (only rank 0 takes locks and writes markers)."""
    return os.environ.get("RANK", "0") == "0"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


def lock_path(folder: str | Path, beside: bool = False) -> Path:
    """Where the lock of ``folder`` lives: inside it, or (for folders renamed into place) beside it."""
    p = Path(folder)
    return p.parent / f".{p.name}.lock" if beside else p / LOCK


def acquire_lock(folder: str | Path, beside: bool = False) -> Path:
    """Take the writer lock of ``folder``; refuse (one line) when a live process holds it.

    The lock file holds ``{"pid", "host", "since", "command"}`` and appears whole (it is written
    beside and hard-linked into place), so a reader never sees half of it.
    """
    lock = lock_path(folder, beside)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(["lmforge", *sys.argv[1:3]]),
        }
        fd, tmp = tempfile.mkstemp(prefix=f"{lock.name}.", suffix=".tmp", dir=lock.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:  # a full disk fails here: the temp goes too
                f.write(json.dumps(info) + "\n")
            for _ in range(3):
                try:
                    os.link(tmp, lock)
                    return lock
                except FileExistsError:
                    holder = read_json_object(lock)
                    pid, host = holder.get("pid"), holder.get("host")
                    if not isinstance(pid, int) or not isinstance(host, str):
                        raise LmforgeError(
                            f"the lock file {lock} of {folder} is unreadable (not an lmforge lock, or damaged); if no "
                            f"lmforge run is writing {folder}, delete it (rm {lock}) and run again"
                        ) from None
                    stale = host == info["host"] and not pid_alive(pid)
                    if not stale:
                        who = f"pid {pid} on {host}"
                        since = f" since {holder['since']}" if holder.get("since") else ""
                        raise LmforgeError(
                            f"{folder} is being written by another lmforge run ({who}{since}); wait for it to end, "
                            f"or delete {lock} if that process is gone"
                        ) from None
                    logger.warning("%s: taking over the lock of pid %d, which is no longer running", folder, pid)
                    with contextlib.suppress(FileNotFoundError):
                        lock.unlink()
            raise LmforgeError(f"could not take the lock {lock}; try again")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    except OSError as e:
        raise LmforgeError(os_error_line(e, path=folder)) from None


def release_lock(lock: Path) -> None:
    """Remove ``lock`` if this process still holds it."""
    if read_json_object(lock).get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            lock.unlink()


def _live_writer(path: Path) -> dict | None:
    """The lock record of a live lmforge process writing ``path`` (beside it), else None."""
    holder = read_json_object(lock_path(path, beside=True))
    pid = holder.get("pid")
    if isinstance(pid, int) and pid != os.getpid() and (holder.get("host") != socket.gethostname() or pid_alive(pid)):
        return holder
    return None


def recover_folder(path: str | Path, writer: bool = False) -> Path | None:
    """Put back a folder whose replacement was cut short between its two renames; say what was done.

    A replacement moves the old folder to ``.NAME.old-*`` and then renames the new one in (where the system
    cannot swap them in one step).  When ``path`` is missing and such a copy exists, the copy is renamed
    back to ``path`` (a warning says so; a writer deletes, saying so, a copy that holds no folder lmforge
    wrote, as there is nothing to put back).  When ``path`` exists, the copy is an old version left by a
    kill after the swap: a ``writer`` deletes it, a reader says where it is; both log it.  Nothing is
    touched while a live lmforge process holds the folder's lock (a writer is then refused by the lock).

    Returns:
        The copy put back, if any.
    Raises:
        LmforgeError: a reader cannot have the copy put back (a live writer stays between its renames, or
            the rename fails); the message names the copy and the command that restores it.
    """
    p = Path(path)
    olds = moved_aside(p)
    if not olds:
        return None
    holder = _live_writer(p)
    for _ in range(0 if writer else 40):  # a live writer is between its two renames for a moment: wait
        if holder is None or os.path.lexists(p):
            break
        time.sleep(0.05)
        holder = _live_writer(p)
    if os.path.lexists(p):
        if holder is None:
            for old in olds:
                if writer:
                    shutil.rmtree(old, ignore_errors=True)
                logger.warning("%s %s: the previous copy of %s, left by a replacement that was cut short after the "
                               "new one was complete%s", "removed" if writer else "found", old, p,
                               "" if writer else "; delete it once you no longer need it")
        return None
    old = olds[0]
    how = f"put it back with: mv '{old}' '{p}'"
    if holder is not None:
        if writer:
            return None
        raise LmforgeError(f"{p} is being replaced by a running lmforge (pid {holder.get('pid')}); its old copy is "
                           f"{old}: wait for that run to end, or if it is gone, {how}")
    if writer and folder_kind(old) in (None, "other"):  # not a whole folder lmforge wrote: nothing to put back
        shutil.rmtree(old, ignore_errors=True)
        logger.warning("removed %s: it holds no folder lmforge wrote, so there was nothing of %s to put back", old, p)
        return None
    try:
        os.rename(old, p)
    except FileNotFoundError:
        return None  # another process put it back first
    except OSError as e:
        raise LmforgeError(f"{p} is missing: a replacement of it was cut short, and its old copy is {old} "
                           f"({os_error_line(e, 'restore')}); {how}") from None
    logger.warning("restored %s from %s, where a replacement that was cut short had moved it", p, old.name)
    return old


def remove_leftovers(folder: str | Path, beside: bool = False) -> list[Path]:
    """Delete what interrupted writes left: ``.NAME.XXXX.tmp`` files (and uncommitted staging folders) in
    ``folder`` and, with ``beside``, the ``.NAME.tmp-*`` sibling folders (never a complete folder: those
    are either unfinished or, after a replacement, the old copy already replaced).  Call it only while
    holding the lock; ``.NAME.old-*`` copies are :func:`recover_folder`'s."""
    p = Path(folder)
    gone: list[Path] = []
    candidates: list[Path] = []
    if p.is_dir():
        candidates += [c for c in p.glob(".*.tmp") if c.name != MARKER and (c.is_file() or c.name.startswith(TOGETHER))]
    if beside and p.parent.is_dir():
        prefix = f".{p.name}.tmp-"
        candidates += [p.parent / e.name for e in os.scandir(p.parent) if e.name.startswith(prefix)]
    for c in candidates:
        try:
            shutil.rmtree(c) if c.is_dir() and not c.is_symlink() else c.unlink()
            gone.append(c)
        except OSError:
            continue
    if gone:
        logger.info("removed %d leftover(s) of an interrupted run: %s", len(gone), first_names([g.name for g in gone]))
    return gone


@contextlib.contextmanager
def output_folder(
    path: str | Path,
    kind: str,
    overwrite: bool = False,
    *,
    inputs: Iterable[str | Path] = (),
    existing: str = "refuse",
    beside: bool = False,
    option: str = "--out",
    hint: str | None = OVERWRITE_HINT,
) -> Iterator[Path]:
    """Check, lock and claim an output folder for the duration of a command.

    Runs :func:`check_output_dir`, takes the writer lock, removes leftovers of interrupted runs and
    proves the folder writable before the caller does any long work: for in-place folders by writing
    the marker, for folders renamed into place (``beside=True``: shards, exports) by writing a scratch
    file in the parent (the caller marks the new folder itself).  The lock is released on exit.
    Under torchrun only rank 0 locks and writes.
    """
    if _main_process():
        recover_folder(path, writer=True)
    p = check_output_dir(path, kind, overwrite, inputs=inputs, existing=existing, option=option, hint=hint)
    if not _main_process():
        yield p
        return
    created = not p.exists()
    if beside:
        probe_writable(p.parent)
    else:
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LmforgeError(os_error_line(e, "create", p)) from None
    try:
        lock = acquire_lock(p, beside)
    except LmforgeError:
        if created and not beside:  # e.g. a full disk: the folder made above is not left behind empty
            with contextlib.suppress(OSError):
                p.rmdir()
        raise
    failed = False
    try:
        remove_leftovers(p, beside)
        if not beside:
            write_marker(p, kind)
        yield p
    except BaseException:
        failed = True
        raise
    finally:
        release_lock(lock)
        if failed and created and not beside and not folder_entries(p):  # a failed command leaves no empty folder
            with contextlib.suppress(OSError):
                (p / MARKER).unlink()
                p.rmdir()


@contextlib.contextmanager
def staged_folder(path: str | Path, kind: str) -> Iterator[Path]:
    """Yield a fresh hidden folder beside ``path``; on success mark it and rename it into place.

    Whatever was at ``path`` is replaced only once the new folder is complete, by
    :func:`lmforge.storage.files.swap_into_place`: a failure or a kill leaves ``path`` as it was (or its old copy
    in ``.NAME.old-*``, which :func:`recover_folder` puts back), plus a ``.NAME.tmp-*`` folder that the
    next run removes.  The files lmforge did not write there (:func:`lmforge.storage.folders.user_files`) go
    into the new folder.  Hold the lock (``output_folder(..., beside=True)``) around it.
    """
    p = Path(path)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{p.name}.tmp-", dir=p.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
    except OSError as e:
        raise LmforgeError(os_error_line(e, path=p.parent)) from None
    try:
        yield tmp
        record_unrecorded_weights(tmp, kind)
        write_marker(tmp, kind)
        swap_into_place(tmp, p, keep=user_files(p))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def record_unrecorded_weights(folder: str | Path, kind: str) -> None:
    """Record the sha256 of each ``*.safetensors`` file in ``folder`` that its marker does not record yet (those
    another writer put there: an HF export's weights), as part of a folder written whole (:func:`staged_folder`)."""
    p = Path(folder)
    known = recorded_weights(p)
    for f in sorted(p.glob("*.safetensors")):
        if f.name not in known and f.is_file() and not f.is_symlink():
            record_weights(p, f.name, [file_sha256(f)], kind)


def save_weights(tensors: dict, path: str | Path, kind: str, metadata: dict[str, str] | None = None) -> str:
    """Write a safetensors file atomically and record its sha256 in the folder's marker; return the hash.

    A load compares the file with the record (:func:`lmforge.storage.checks.check_recorded_weights`), so weights
    copied in from another model, or rewritten by another tool, are found.  The file's bytes are what
    :func:`lmforge.storage.files.save_safetensors` writes (a hash cannot live inside the file it hashes).  The
    record is updated in two steps around the file's rename, so a kill at any instant leaves a file the record
    accepts: the new hash joins the old before the rename, the old one goes after it.  A file that had no record
    (written before lmforge recorded hashes) has none until the new one is in place.

    Args:
        kind: the folder kind its marker gets when the folder has none yet (``"model"``, ``"run"``).
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)  # a leftover the next run removes
    os.close(fd)
    staged = Path(name)
    try:
        save_safetensors(tensors, staged, metadata)
        digest = file_sha256(staged)
        old = recorded_weights(p.parent).get(p.name) if p.exists() else []
        record_weights(p.parent, p.name, [digest, *old] if old or not p.exists() else None, kind)
        os.replace(staged, p)
        fsync_dir(p.parent)
    except BaseException as e:
        with contextlib.suppress(OSError):
            staged.unlink()
        if isinstance(e, OSError) and e.filename in (None, str(staged)):  # name the file the user knows
            raise OSError(e.errno, e.strerror, str(p)) from None
        raise
    record_weights(p.parent, p.name, [digest], kind)
    return digest
