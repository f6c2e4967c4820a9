"""What an output folder is, who is writing it, and whether a command may write there.

Every folder lmforge writes is of one *kind*: ``model`` (``lmforge pretrain``, ``import-hf``), ``run``
(``lmforge finetune --out``), ``shards`` (``prepare``), ``tokenizer`` (``tokenizer train``), ``export``
(``export-hf``) or ``demo``.  The kind is recorded in a small marker file (:data:`MARKER`) and, for folders
written before the marker existed, inferred from the files they hold (:func:`folder_kind`).

A writing command calls :func:`output_folder` before any long work.  It refuses, in one line:

- a path that is a file, or a folder of another kind, or a folder holding files lmforge did not write
  (unless ``overwrite``);
- a folder that is one of the command's own inputs (``finetune M --out M``), even with ``overwrite``;
- a folder it cannot create or write into (the check writes the marker, so permissions, a read-only
  or full filesystem are found before training starts, not after);
- a folder another lmforge process is writing: the writer holds :data:`LOCK` (its pid and host).
  A lock whose process is gone (same host, pid not running) is taken over with a warning.

It also clears what killed runs leave behind: ``.NAME.XXXX.tmp`` files of interrupted atomic
writes inside the folder and ``.NAME.tmp-*`` siblings of folders that are written beside their final
place and renamed in (shards, exports, runs).  A ``.NAME.old-*`` sibling is the previous copy of a folder
whose replacement was cut short: :func:`recover_folder` puts it back where it belongs (writers and
readers both call it), and deletes it, saying so, only once the new folder is in place.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from fnmatch import fnmatch
from pathlib import Path

from .errors import LmforgeError
from .utils import TOGETHER, moved_aside, swap_into_place

logger = logging.getLogger(__name__)

MARKER = ".lmforge-folder.json"
LOCK = ".lmforge.lock"

KINDS = ("model", "run", "shards", "tokenizer", "export", "demo")
_WORDS = {
    "model": "a model folder",
    "run": "a transfer run folder",
    "shards": "a shard folder",
    "tokenizer": "a tokenizer folder",
    "export": "an HF export folder",
    "demo": "a demo folder",
}

_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
# file-name patterns each kind may hold (anything else is a file lmforge did not write)
_KNOWN: dict[str, tuple[str, ...]] = {
    "model": (
        "config.json", "model.safetensors", *_TOKENIZER_FILES, "train_config.json", "metrics.jsonl",
        "training_curves.png", "vectors.txt", "training_summary.json", "training_state", "training_state.*",
        "README.md", "plan.json", "events.out.tfevents.*",
    ),
    "run": ("config.json", "metrics.json", "predictions.jsonl", "*.safetensors", "*.png", "*.json", "*.jsonl",
            "README.md", "events.out.tfevents.*"),
    "shards": ("meta.json", "*.bin", "tokenizer"),
    "tokenizer": _TOKENIZER_FILES,
    "export": ("config.json", "model.safetensors", *_TOKENIZER_FILES, "generation_config.json", "vocab.json",
               "merges.txt", "README.md", "generator"),  # generator/: ELECTRA's second HF model
    "demo": ("*",),
}
# lmforge's own bookkeeping and the leftovers of interrupted writes: never "foreign"
_OWN = (MARKER, LOCK, ".*.tmp", ".*.tmp-*", ".*.old-*", TOGETHER)


def describe(kind: str) -> str:
    """``"a model folder"`` for ``"model"`` and so on."""
    return _WORDS.get(kind, f"a {kind} folder")


def _entries(path: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(path) if not any(fnmatch(e.name, pat) for pat in _OWN))
    except FileNotFoundError:
        return []


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _marked_kind(path: Path) -> str | None:
    kind = _read_json(path / MARKER).get("kind")
    return kind if kind in KINDS else None


def folder_kind(path: str | Path) -> str | None:
    """The kind of folder at ``path``: one of :data:`KINDS`, ``None`` (absent or empty) or ``"other"``.

    The marker decides when there is one; otherwise the files do: ``meta.json`` of shards, a
    ``config.json`` with ``transfer`` (a run), ``architectures`` (an HF export) or an lmforge
    ``model_type`` (a model), ``training_state/`` (a model whose first save was cut short), tokenizer
    files alone (a tokenizer), ``demo_state.json`` (a demo).  ``"other"`` is a folder lmforge did not write.
    """
    p = Path(path)
    if not p.is_dir():
        return None
    marked = _marked_kind(p)
    if marked is not None:
        return marked
    names = set(_entries(p))
    if not names:
        return None
    if _read_json(p / "meta.json").get("format") == "lmforge-shards":
        return "shards"
    if "demo_state.json" in names:
        return "demo"
    if "config.json" in names:
        config = _read_json(p / "config.json")
        from .models import FAMILIES

        if "transfer" in config:
            return "run"
        if "architectures" in config:
            return "export"
        if config.get("model_type") in FAMILIES:
            return "model"
        return "other"
    if "training_state" in names or "train_config.json" in names:
        return "model"
    if names <= set(_TOKENIZER_FILES) and names & {"tokenizer.json", "vocab.txt"}:
        return "tokenizer"
    return "other"


def foreign_files(path: str | Path, kind: str) -> list[str]:
    """Names in ``path`` that a folder of ``kind`` does not hold (files lmforge did not write there)."""
    known = _KNOWN.get(kind, ())
    return [n for n in _entries(Path(path)) if not any(fnmatch(n, pat) for pat in known)]


def _names(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def os_error_line(e: OSError, action: str = "write") -> str:
    """One line for an OSError: what failed, on which path, why."""
    where = e.filename if e.filename is not None else "?"
    if e.errno == errno.ENOSPC:
        return f"no space left on the device holding {where}; free some space or choose another folder"
    if e.errno == errno.EDQUOT:
        return f"disk quota exceeded writing {where}; free some space or choose another folder"
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied: cannot {action} {where}; choose a folder you can write to"
    if e.errno == errno.EROFS:
        return f"read-only file system: cannot {action} {where}; choose a folder on a writable disk"
    if e.errno == errno.ENOTDIR:
        return f"cannot {action} {where}: a part of that path is a file, not a folder"
    if e.errno == errno.ENOENT:
        return f"no such file or folder: {where}"
    reason = e.strerror or type(e).__name__
    return f"cannot {action} {where}: {reason}"


def check_output_dir(
    path: str | Path,
    kind: str,
    overwrite: bool = False,
    *,
    inputs: Iterable[str | Path] = (),
    existing: str = "replace",
    option: str = "--out",
    hint: str | None = "pass --overwrite to write there anyway",
) -> Path:
    """Refuse to write a folder of ``kind`` at ``path`` when that would lose something; one-line errors.

    Args:
        path: the output folder.
        kind: one of :data:`KINDS`.
        overwrite: write even into a folder of another kind or holding other files.
        inputs: folders the command reads; writing into one of them is refused whatever ``overwrite`` says.
        existing: what a folder of the same kind means: ``"replace"`` (it is replaced, e.g. shards) or
            ``"refuse"`` (it needs ``overwrite``, e.g. a model holding a training run).
        option: how the folder was given, for the messages.
        hint: what ``overwrite`` is called and does, for the messages (``None``: the command has none).
    Returns:
        ``path`` as a Path.  Nothing is created here; see :func:`output_folder`.
    Raises:
        LmforgeError: the refusal, saying what to do instead.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown folder kind {kind!r}")
    p = Path(path)
    for src in inputs:
        if src is not None and _same(p, Path(src)):
            raise LmforgeError(
                f"{option} {p} is the folder this command reads; writing there would destroy it: "
                f"choose another {option}"
            )
    if p.exists() and not p.is_dir():
        raise LmforgeError(f"{option} {p} is a file, not a folder; choose a folder name")
    found = folder_kind(p)
    if found is None or overwrite:
        return p
    tail = f", or {hint}" if hint else ""
    if found == "other":
        raise LmforgeError(
            f"{option} {p} holds files lmforge did not write ({_names(_entries(p))}); choose a new or empty "
            f"folder{tail}"
        )
    if found != kind:
        raise LmforgeError(f"{option} {p} is {describe(found)}, not {describe(kind)}; choose another folder{tail}")
    foreign = foreign_files(p, kind)
    if foreign:
        raise LmforgeError(
            f"{option} {p} holds files lmforge did not write ({_names(foreign)}); choose a new or empty folder{tail}"
        )
    if existing == "refuse":
        raise LmforgeError(f"{option} {p} already holds {describe(kind)}; choose another folder{tail}")
    return p


def write_marker(path: str | Path, kind: str) -> None:
    """Record ``kind`` in ``path`` (created if need be); a failure is a one-line LmforgeError."""
    from . import __version__
    from .utils import atomic_write_text

    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        if _marked_kind(p) != kind:
            atomic_write_text(p / MARKER, json.dumps({"kind": kind, "lmforge": __version__}) + "\n")
    except OSError as e:
        raise LmforgeError(os_error_line(e)) from None


def probe_writable(folder: str | Path) -> None:
    """Create (parents included) and write a scratch file in ``folder``, or raise a one-line LmforgeError."""
    p = Path(folder)
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".lmforge-probe.", suffix=".tmp", dir=p)
        try:
            os.write(fd, b"lmforge")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(tmp)
    except OSError as e:
        raise LmforgeError(os_error_line(e)) from None


# -- one writer per folder ----------------------------------------------------------------------------
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
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(info) + "\n")
        try:
            for _ in range(3):
                try:
                    os.link(tmp, lock)
                    return lock
                except FileExistsError:
                    holder = _read_json(lock)
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
        raise LmforgeError(os_error_line(e)) from None


def release_lock(lock: Path) -> None:
    """Remove ``lock`` if this process still holds it."""
    if _read_json(lock).get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            lock.unlink()


def _live_writer(path: Path) -> dict | None:
    """The lock record of a live lmforge process writing ``path`` (beside it), else None."""
    holder = _read_json(lock_path(path, beside=True))
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
        logger.info("removed %d leftover(s) of an interrupted run: %s", len(gone), _names([g.name for g in gone]))
    return gone


@contextlib.contextmanager
def output_folder(
    path: str | Path,
    kind: str,
    overwrite: bool = False,
    *,
    inputs: Iterable[str | Path] = (),
    existing: str = "replace",
    beside: bool = False,
    option: str = "--out",
    hint: str | None = "pass --overwrite to write there anyway",
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
            raise LmforgeError(os_error_line(e, "create")) from None
    lock = acquire_lock(p, beside)
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
        if failed and created and not beside and not _entries(p):  # a failed command leaves no empty folder
            with contextlib.suppress(OSError):
                (p / MARKER).unlink()
                p.rmdir()


@contextlib.contextmanager
def staged_folder(path: str | Path, kind: str) -> Iterator[Path]:
    """Yield a fresh hidden folder beside ``path``; on success mark it and rename it into place.

    Whatever was at ``path`` is replaced only once the new folder is complete, by
    :func:`lmforge.utils.swap_into_place`: a failure or a kill leaves ``path`` as it was (or its old copy
    in ``.NAME.old-*``, which :func:`recover_folder` puts back), plus a ``.NAME.tmp-*`` folder that the
    next run removes.  Hold the lock (``output_folder(..., beside=True)``) around it.
    """
    p = Path(path)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{p.name}.tmp-", dir=p.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
    except OSError as e:
        raise LmforgeError(os_error_line(e)) from None
    try:
        yield tmp
        write_marker(tmp, kind)
        swap_into_place(tmp, p)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# -- reading a model -----------------------------------------------------------------------------------
def check_finite(tensors: dict, where: str | Path) -> None:
    """Refuse weights holding NaN or infinity, naming the first such tensor."""
    import torch

    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise LmforgeError(
                f"{where} holds non-finite weights ({name} has NaN or infinity): the training diverged; resume "
                f"from an earlier checkpoint with a lower learning rate, or retrain"
            )


def check_tokenizer_fits(config, tokenizer, where: str | Path, family=None) -> None:
    """The tokenizer beside a model must be the one it was built for, or the model reads the wrong ids.

    Checked: the vocabulary size; the tokenizer kind the family reads (``family.tokenizer_kind``: BERT
    WordPiece with ``[CLS] [SEP] [PAD] [MASK]``, GPT byte-level BPE with ``<|endoftext|>``); and every
    special id the config records (``pad_token_id``, ``bos_token_id``, ``eos_token_id``).

    Args:
        family: the model's :class:`lmforge.models.Family` (None: the kind is not checked).
    """
    fix = "it is not this model's tokenizer; put the model's own tokenizer files back"
    vocab = getattr(config, "vocab_size", None)
    if vocab is not None and tokenizer.vocab_size != vocab:
        raise LmforgeError(
            f"the tokenizer in {where} has {tokenizer.vocab_size} tokens but the model was built for {vocab}: "
            f"it is not this model's tokenizer (was `tokenizer train --out` pointed at this folder?); put the "
            f"model's own tokenizer back"
        )
    kind = getattr(family, "tokenizer_kind", None)
    if kind is not None and tokenizer.kind != kind:
        raise LmforgeError(f"the tokenizer in {where} is {tokenizer.kind}, but a {family.name} model reads {kind} "
                           f"tokens: {fix}")
    needed = {"wordpiece": ("cls_id", "sep_id", "pad_id", "mask_id"), "bpe": ("eot_id",)}.get(kind, ())
    names = {"cls_id": "[CLS]", "sep_id": "[SEP]", "pad_id": "[PAD]", "mask_id": "[MASK]", "eot_id": "<|endoftext|>"}
    missing = [names[a] for a in needed if getattr(tokenizer, a, None) is None]
    if missing:
        raise LmforgeError(f"the tokenizer in {where} has no {' '.join(missing)}, which a {family.name} model needs: "
                           f"{fix}")
    pairs = [
        ("eos_token_id", getattr(tokenizer, "eot_id", None)),
        ("bos_token_id", getattr(tokenizer, "eot_id", None)),
        ("pad_token_id", getattr(tokenizer, "pad_id", None)),
    ]
    for field, tok_id in pairs:
        want = getattr(config, field, None)
        if want is not None and tok_id is not None and want != tok_id:
            raise LmforgeError(
                f"the tokenizer in {where} puts its special token at id {tok_id} but the model's {field} is "
                f"{want}: {fix}"
            )


def check_model_folder(path: str | Path) -> None:
    """Refuse a model folder whose weights are not finite or whose tokenizer does not fit its config.

    For commands that read weights without :func:`lmforge.load` (which checks the same).  A folder
    with no ``config.json`` or weights is left to the caller's own message.
    """
    p = Path(path)
    weights = p / "model.safetensors"
    if not (p / "config.json").is_file() or not weights.is_file():
        return
    from .utils import load_safetensors

    check_finite(load_safetensors(weights), weights)
    if (p / "tokenizer.json").is_file():
        from .config import load_json
        from .models import FAMILIES
        from .tokenization import Tokenizer

        class _Config:  # the fields check_tokenizer_fits reads
            def __init__(self, data: dict):
                self.__dict__.update({k: v for k, v in data.items() if k.endswith("_id") or k == "vocab_size"})

        data = load_json(p / "config.json")
        check_tokenizer_fits(_Config(data), Tokenizer.load(p), p, FAMILIES.get(data.get("model_type")))
