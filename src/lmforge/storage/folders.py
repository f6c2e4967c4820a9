"""What an output folder is, and whether a command may write there.

Every folder lmforge writes is of one *kind*: ``model`` (``lmforge pretrain``, ``import-hf``), ``run``
(``lmforge finetune --out``), ``shards`` (``prepare``), ``tokenizer`` (``tokenizer train``), ``export``
(``export-hf``) or ``demo``.  The kind is recorded in a small marker file (:data:`MARKER`) and, for folders
written before the marker existed, inferred from the files they hold (:func:`folder_kind`).

One policy holds for every output (docs/cli.md, "Existing outputs"): :func:`check_output_dir` and
:func:`check_output_file` refuse, in one line naming ``--overwrite``, an output that already exists.  With
``overwrite`` a folder is replaced by a new one built beside it and swapped in only when complete
(:func:`lmforge.storage.writing.staged_folder`), and the files lmforge did not write there
(:func:`user_files`: notes, your own subfolders) are carried into the new folder; a file is replaced
atomically.  A folder that is one of the command's own inputs (``finetune M --out M``) is refused even with
``overwrite``.

Taking a folder for the length of a command (the writer lock, the leftovers of killed runs, a replacement
staged beside it) is :mod:`lmforge.storage.writing`'s; whether the model in a folder can be read is
:mod:`lmforge.storage.checks`'.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path

from ..errors import LmforgeError
from .files import TOGETHER, atomic_write_text

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
        "README.md", "plan.json", "events.out.tfevents.*", "sentence_pipeline.json",
    ),
    "run": ("config.json", "metrics.json", "predictions.jsonl", "head.safetensors", "body.safetensors",
            "task_tokens.safetensors", "README.md", "events.out.tfevents.*"),
    "shards": ("meta.json", "*.bin", "tokenizer"),
    "tokenizer": _TOKENIZER_FILES,
    "export": ("config.json", "model.safetensors", *_TOKENIZER_FILES, "generation_config.json", "vocab.json",
               "merges.txt", "README.md", "generator",  # generator/: ELECTRA's second HF model
               # what makes it a sentence-transformers folder too (lmforge.models.sentence)
               "modules.json", "1_Pooling", "2_Normalize", "sentence_bert_config.json",
               "config_sentence_transformers.json"),
    "demo": ("*",),
}
# lmforge's own bookkeeping and the leftovers of interrupted writes: never "foreign"
_OWN = (MARKER, LOCK, ".*.tmp", ".*.tmp-*", ".*.old-*", TOGETHER)


def describe(kind: str) -> str:
    """``"a model folder"`` for ``"model"`` and so on."""
    return _WORDS.get(kind, f"a {kind} folder")


def folder_entries(path: Path) -> list[str]:
    """The sorted names in folder ``path`` other than lmforge's own lock and marker files ([] when absent)."""
    try:
        return sorted(e.name for e in os.scandir(path) if not any(fnmatch(e.name, pat) for pat in _OWN))
    except FileNotFoundError:
        return []


def read_json_object(path: Path) -> dict:
    """The JSON object in ``path``, or {} when it is missing, unreadable or not an object (for guessing a kind)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _marked_kind(path: Path) -> str | None:
    kind = read_json_object(path / MARKER).get("kind")
    return kind if kind in KINDS else None


def folder_kind(path: str | Path) -> str | None:
    """The kind of folder at ``path``: one of :data:`KINDS`, ``None`` (absent or empty) or ``"other"``.

    The marker decides when there is one; otherwise the files do: ``meta.json`` of shards, a ``config.json``
    with ``transfer`` (a run), ``architectures`` (an HF export) or a ``model_type`` (a model: whether lmforge has
    that family is the registry's to say, which loading asks), ``training_state/`` (a model whose first save was
    cut short), tokenizer files alone (a tokenizer), ``demo_state.json`` (a demo).  ``"other"`` is a folder
    lmforge did not write.
    """
    p = Path(path)
    if not p.is_dir():
        return None
    marked = _marked_kind(p)
    if marked is not None:
        return marked
    names = set(folder_entries(p))
    if not names:
        return None
    if read_json_object(p / "meta.json").get("format") == "lmforge-shards":
        return "shards"
    if "demo_state.json" in names:
        return "demo"
    if "config.json" in names:
        config = read_json_object(p / "config.json")
        if "transfer" in config:
            return "run"
        if "architectures" in config:
            return "export"
        if isinstance(config.get("model_type"), str):
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
    return [n for n in folder_entries(Path(path)) if not any(fnmatch(n, pat) for pat in known)]


def user_files(path: str | Path) -> list[str]:
    """Names in the folder ``path`` that lmforge did not write: all of a folder lmforge did not write, else
    those its kind does not hold.  Replacing the folder (``--overwrite``) carries them into the new one."""
    p = Path(path)
    kind = folder_kind(p)
    if kind is None:
        return []
    return folder_entries(p) if kind == "other" else foreign_files(p, kind)


def first_names(items: list[str], n: int = 3) -> str:
    """``a, b, c and 4 more``: the first ``n`` names of a list, for a message."""
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def os_error_line(e: OSError, action: str = "write", path: str | Path | None = None) -> str:
    """One line for an OSError: what failed, on which path (``path`` when the error names none), why."""
    where = e.filename if e.filename is not None else (path if path is not None else "this command's output")
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


#: how every writing command names its way to replace an existing output
OVERWRITE_HINT = "pass --overwrite to replace it (files lmforge did not write there are kept)"


def check_output_dir(
    path: str | Path,
    kind: str,
    overwrite: bool = False,
    *,
    inputs: Iterable[str | Path] = (),
    existing: str = "refuse",
    option: str = "--out",
    hint: str | None = OVERWRITE_HINT,
) -> Path:
    """Refuse to write a folder of ``kind`` at ``path`` when that would lose something; one-line errors.

    Args:
        path: the output folder.
        kind: one of :data:`KINDS`.
        overwrite: replace what is there (a folder of any kind; :func:`user_files` are kept).  Refused still:
            a folder holding a file lmforge did not write under a name the new folder may use.
        inputs: folders the command reads; writing into one of them is refused whatever ``overwrite`` says.
        existing: what a folder of the same kind means without ``overwrite``: ``"refuse"`` (every command
            that writes a new output) or ``"continue"`` (the command carries on the folder's work:
            ``pretrain --resume``, ``demo``).
        option: how the folder was given, for the messages.
        hint: how to replace it, for the messages (``None``: the command has no ``--overwrite``).
    Returns:
        ``path`` as a Path.  Nothing is created here; see :func:`lmforge.storage.writing.output_folder`.
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
    if found is None:
        return p
    if overwrite:
        clash = [n for n in user_files(p) if any(fnmatch(n, pat) for pat in _KNOWN.get(kind, ()))]
        if clash and kind != "demo":
            raise LmforgeError(
                f"{option} {p} holds {first_names(clash)}, which lmforge did not write but {describe(kind)} may hold; "
                f"move or rename it, then run again"
            )
        return p
    tail = f", or {hint}" if hint else ""
    if found == "other":
        raise LmforgeError(
            f"{option} {p} holds files lmforge did not write ({first_names(folder_entries(p))}); choose a new or empty "
            f"folder{tail}"
        )
    if found != kind:
        raise LmforgeError(f"{option} {p} is {describe(found)}, not {describe(kind)}; choose another folder{tail}")
    foreign = foreign_files(p, kind)
    if foreign and existing == "continue":
        raise LmforgeError(
            f"{option} {p} holds files lmforge did not write ({first_names(foreign)}); choose a new or empty "
            f"folder{tail}"
        )
    if existing != "continue":
        raise LmforgeError(f"{option} {p} already holds {describe(kind)}; choose another folder{tail}")
    return p


def check_output_file(path: str | Path, overwrite: bool = False, *, option: str = "--out",
                      hint: str = "pass --overwrite to replace it") -> Path:
    """Refuse, in one line, a file output that exists (unless ``overwrite``) or is a folder.

    The file itself is then written with :func:`lmforge.storage.files.atomic_path`, so it is either complete or, after
    a failure or a kill, the old one.  That it is none of the command's inputs is
    :func:`lmforge.storage.guards.check_paths`'s (refused even with ``overwrite``).
    """
    p = Path(path)
    if p.is_dir():
        raise LmforgeError(f"{option} {p} is a folder, not a file; give a file name")
    if os.path.lexists(p) and not overwrite:
        raise LmforgeError(f"{option} {p} already exists; choose another file name, or {hint}")
    return p


def write_marker(path: str | Path, kind: str) -> None:
    """Record ``kind`` in ``path`` (created if need be); a failure is a one-line LmforgeError."""
    from .. import __version__  # the package root imports the models, which import this module

    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        if _marked_kind(p) != kind:
            atomic_write_text(p / MARKER, json.dumps({"kind": kind, "lmforge": __version__}) + "\n")
    except OSError as e:
        raise LmforgeError(os_error_line(e, path=p)) from None


#: the marker's field recording the sha256 of each weights file lmforge wrote in the folder (name -> hash)
WEIGHTS_FIELD = "sha256"


def recorded_weights(folder: str | Path) -> dict[str, list[str]]:
    """The hashes the marker of ``folder`` accepts for each weights file it records (name -> hashes).

    One hash, or two while a file is being replaced in place (the old and the new: a kill between the rename
    of the file and the update of the record leaves either).  A file with no entry is not checked."""
    found = read_json_object(Path(folder) / MARKER).get(WEIGHTS_FIELD)
    if not isinstance(found, dict):
        return {}
    out = {}
    for name, value in found.items():
        hashes = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        out[name] = [h for h in hashes if isinstance(h, str)]
    return out


def record_weights(folder: str | Path, name: str, hashes: list[str] | None, kind: str) -> None:
    """Record (``hashes``) or forget (None) the sha256 of the weights file ``folder/name`` in the folder's marker,
    which is created as a folder of ``kind`` if it has none.  The marker is replaced atomically."""
    from .. import __version__  # the package root imports the models, which import this module

    p = Path(folder)
    data = read_json_object(p / MARKER) or {"kind": kind, "lmforge": __version__}
    table = data.get(WEIGHTS_FIELD) if isinstance(data.get(WEIGHTS_FIELD), dict) else {}
    if hashes:
        table[name] = hashes[0] if len(hashes) == 1 else hashes
    else:
        table.pop(name, None)
    data[WEIGHTS_FIELD] = table
    atomic_write_text(p / MARKER, json.dumps(data) + "\n")


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
        raise LmforgeError(os_error_line(e, path=p)) from None
