"""What ``lmforge serve`` holds: the model folders, fine-tuned runs and training folders it was given.

Each folder becomes an :class:`Entry` named after the folder (``name-2`` etc. when two folders share a
name).  A model folder (``config.json`` with ``model_type``) is opened with :func:`lmforge.load`, a run
folder (``config.json`` with ``transfer``) with :func:`lmforge.transfer.load_run`; a folder that holds
only ``metrics.jsonl`` / ``train_config.json`` (a pretraining that has not saved a checkpoint yet)
serves its training curves.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import load_json
from ..errors import CheckpointError
from ..families import get_family, load
from ..train.precision import autocast, inference_precision, resolve_device
from ..transfer import load_run

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


@dataclasses.dataclass
class Entry:
    """One served folder.

    Attributes:
        name: how requests name it (``"model": name``).
        path: the folder.
        kind: ``model`` (a pretrained model folder), ``run`` (a fine-tuned run) or ``training``
            (curves only: a pretraining that has not written its model yet).
        family: ``bert``, ``gpt``, ``elmo``, ``word2vec`` (a run: its body's family), or None.
        obj: the loaded model or :class:`~lmforge.transfer.TransferRun` (None for ``training``).
        supports: the operations it serves: ``embed``, ``fill-mask``, ``generate``, ``predict``, ``curves``.
        stamp: :func:`folder_stamp` of the folder when it was opened (a different stamp: it changed on disk).
        loaded_at: when it was opened (seconds since the epoch).
        reloads: how often the server has reopened it since it started.
        stale: why the folder on disk is not what is served (it changed but could not be reopened), or None.
        device: the ``--device`` it was opened with (a reload opens it there again); None = a model on the CPU,
            a run where its own config says.
        precision: the ``--precision`` it was opened with (likewise); None = a model in fp32, a run in the
            precision it was fine-tuned in.
        computes_in: the precision it computes in (``fp32``, ``bf16`` or ``fp16``), ``auto`` resolved.
    """

    name: str
    path: Path
    kind: str
    family: str | None
    obj: Any
    supports: tuple[str, ...]
    stamp: tuple | None = None
    loaded_at: float = dataclasses.field(default_factory=time.time)
    reloads: int = 0
    stale: str | None = None
    device: str | None = None
    precision: str | None = None
    computes_in: str = "fp32"

    def compute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in the entry's precision: a model's calls run under autocast (a run's
        ``predict`` applies its own).  Call it in the thread that computes: autocast is per thread."""
        if self.kind != "model" or self.computes_in == "fp32":
            return fn(*args, **kwargs)
        with autocast(next(self.obj.parameters()).device, self.computes_in):
            return fn(*args, **kwargs)

    def changed_on_disk(self) -> bool:
        return folder_stamp(self.path) != self.stamp

    def describe(self) -> dict[str, Any]:
        """The entry as ``/v1/models`` lists it."""
        d: dict[str, Any] = {
            "name": self.name,
            "path": str(self.path),
            "kind": self.kind,
            "family": self.family,
            "supports": list(self.supports),
            "loaded_at": round(self.loaded_at, 3),
            "reloads": self.reloads,
            "stale": self.stale,
        }
        if self.obj is not None:
            d["device"] = str(self.obj.device if self.kind == "run" else next(self.obj.parameters()).device)
            d["precision"] = self.computes_in
        if self.kind == "model":
            d["parameters"] = int(self.obj.num_parameters())
            d["contextual"] = get_family(self.family).contextual  # the playground projects a contextual model
        if self.kind == "run":
            run = self.obj
            d["parameters"] = int(sum(q.numel() for q in run.model.parameters()))
            d.update(task=run.cfg.task, mode=run.cfg.mode, labels=list(run.labels), model_dir=run.model_dir)
        return d


def family_operations(family: str) -> tuple[str, ...]:
    """What a model folder of ``family`` serves: every family embeds; the registry says who fills masks and
    who generates."""
    fam = get_family(family)
    return ("embed",) + (("fill-mask",) if fam.fills_mask else ()) + (("generate",) if fam.generates else ())


#: the files whose replacement means the served folder is another model now (metrics.jsonl grows all the time)
STAMPED_FILES = ("config.json", "model.safetensors", "head.safetensors", "tokenizer.json", "vocab.txt")


def folder_stamp(path: Path) -> tuple | None:
    """Identity and modification times of a folder and its model files (None if the folder is missing).

    A staged replace (``finetune --overwrite``, ``import-hf --overwrite``) renames another folder into the
    path, which changes its inode; an atomic re-save (a pretraining's checkpoint) replaces the files.
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    parts: list[tuple] = [(st.st_dev, st.st_ino)]
    for name in STAMPED_FILES:
        try:
            f = os.stat(path / name)
            parts.append((name, f.st_ino, f.st_mtime_ns, f.st_size))
        except OSError:
            parts.append((name,))
    return tuple(parts)


def _has_curves(p: Path) -> bool:
    return (p / METRICS_FILE).is_file()


def open_entry(path: str | Path, name: str, device: str | None = None, precision: str | None = None) -> Entry:
    """Open one folder as an :class:`Entry` (a CheckpointError with one line when it is none of the kinds), its
    model on ``device`` (``cpu``, ``cuda``, ``cuda:N``, ``auto``; None: see :attr:`Entry.device`) computing in
    ``precision`` (``fp32``, ``bf16``, ``fp16``, ``auto``; None: see :attr:`Entry.precision`)."""
    p = Path(path)
    stamp = folder_stamp(p)  # taken first: a change while loading shows up on the next check
    entry = _open(p, name, device, precision)
    entry.stamp, entry.device, entry.precision = stamp, device, precision
    return entry


def _open(p: Path, name: str, device: str | None, precision: str | None) -> Entry:
    if not p.is_dir():
        raise CheckpointError(
            f"{p} is not a folder; give model folders, runs from `lmforge finetune`, or model folders being pretrained"
        )
    curves = ("curves",) if _has_curves(p) or (p / "train_config.json").is_file() else ()
    cfg_path = p / "config.json"
    if cfg_path.is_file() and (p / "head.safetensors").is_file():
        run = load_run(p, device=device, precision=precision)
        return Entry(name, p, "run", run.family, run, ("predict",) + curves, computes_in=run.cfg.precision)
    if cfg_path.is_file() and (p / "model.safetensors").is_file():
        data = load_json(cfg_path)
        if "model_type" in data:
            model = load(p)
            if device is not None:
                model.to(resolve_device(device))
            computes_in = inference_precision(precision or "fp32", next(model.parameters()).device, model)
            ops = family_operations(model.model_type) if model.tokenizer is not None else ()
            if model.tokenizer is None:
                logger.warning("%s has no tokenizer files: it serves no text operation", p)
            return Entry(name, p, "model", model.model_type, model, tuple(ops) + curves, computes_in=computes_in)
    if curves:
        family = None
        if cfg_path.is_file():
            family = load_json(cfg_path).get("model_type")
        return Entry(name, p, "training", family, None, curves)
    raise CheckpointError(
        f"{p} is not a model folder, a run from `lmforge finetune`, or a folder being pretrained "
        f"(it has no config.json with model.safetensors or head.safetensors, and no {METRICS_FILE})"
    )


def open_entries(paths: list[str | Path], device: str | None = None,
                 precision: str | None = None) -> dict[str, Entry]:
    """Open every folder on ``device`` in ``precision`` (see :func:`open_entry`); names are the folder names, made
    unique with ``-2``, ``-3``, ..."""
    if not paths:
        raise CheckpointError("give at least one model folder or run to serve")
    entries: dict[str, Entry] = {}
    for path in paths:
        base = Path(path).resolve().name or "model"
        name, k = base, 2
        while name in entries:
            name, k = f"{base}-{k}", k + 1
        entry = open_entry(path, name, device, precision)
        entries[name] = entry
        logger.info("serving %s as '%s' (%s%s%s)", path, name, entry.kind, f", {entry.family}" if entry.family else "",
                    f", {entry.computes_in}" if entry.obj is not None and entry.computes_in != "fp32" else "")
    return entries


def read_curves(path: Path, after: int = 0) -> dict[str, Any]:
    """The events of ``path/metrics.jsonl`` as the playground draws them.

    Args:
        path: the model folder.
        after: skip the first ``after`` lines (a poller passes the ``lines`` it already has).
    Returns:
        ``{"lines": lines read so far, "events": [{"step", "split", "loss", "metrics"}...]}``; a last line
        still being written is left for the next poll.
    """
    f = path / METRICS_FILE
    if not f.is_file():
        return {"lines": 0, "events": []}
    text = f.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    complete = lines[:-1]  # the part after the last newline may be half written
    events = []
    for line in complete[after:]:
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(ev, dict) or "step" not in ev:
            continue
        events.append(
            {
                "step": ev.get("step"),
                "split": ev.get("split", "train"),
                "loss": ev.get("loss"),
                "metrics": ev.get("metrics") or {},
            }
        )
    return {"lines": len(complete), "events": events}
