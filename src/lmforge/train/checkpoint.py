"""Training state on disk: model, optimizer, scheduler, RNG states and counters, without pickle.

Layout of ``OUT/training_state/``::

    state.json              counters (step, tokens seen, elapsed), scheduler, optimizer hyperparameters,
                            parameter names, the sha256 of every file below, the train config
    model.safetensors       the full model state dict
    optimizer.safetensors   optimizer state flattened to ``opt.<param_idx>.<name>``
    rng.safetensors         torch RNG states as uint8 tensors: ``rng.cpu.<rank>``, ``rng.cuda.<rank>``

Tensors go to safetensors, everything else to JSON; nothing is ever unpickled.  The directory is
written as a unit: the files go into ``training_state.tmp-XXXX`` (each one fsynced), which then
replaces ``training_state`` by two renames.  A kill at any moment leaves either the old or the new
state complete on disk; if it falls between the two renames, :func:`find_state_dir` picks up the
previous state from ``training_state.old-XXXX``.  The data cursor needs no file of its own: every
batch is a function of ``(seed, step)``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from ..storage.files import atomic_write_text, file_sha256, fsync_dir, load_safetensors, save_safetensors

logger = logging.getLogger(__name__)

STATE_DIR = "training_state"
FORMAT_VERSION = 1


# -- optimizer <-> flat tensors + JSON ------------------------------------------------------------
def flatten_optimizer(opt_state: dict) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into safetensors-ready tensors and a JSON-ready dict.

    Returns:
        ``(tensors, meta)``: tensors keyed ``opt.<param_idx>.<name>``; meta holds ``param_groups``
        and any non-tensor per-parameter state.
    """
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in opt_state["state"].items():
        for name, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"opt.{idx}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[name] = value
    groups = []
    for g in opt_state["param_groups"]:
        groups.append({k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()})
    return tensors, {"param_groups": groups, "scalar_state": scalars}


def unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict:
    """Inverse of :func:`flatten_optimizer`: a dict ``optimizer.load_state_dict`` accepts."""
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        prefix, idx, name = key.split(".", 2)
        if prefix != "opt":
            raise CheckpointError(f"unexpected key {key!r} in the optimizer state")
        state.setdefault(int(idx), {})[name] = value
    for idx, st in meta.get("scalar_state", {}).items():
        state.setdefault(int(idx), {}).update(st)
    state = dict(sorted(state.items()))  # safetensors sorts keys as strings (opt.10 < opt.2)
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if "betas" in g and isinstance(g["betas"], list):
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    return {"state": state, "param_groups": groups}


# -- RNG states --------------------------------------------------------------------------------
def rng_states() -> dict[str, torch.Tensor]:
    """This process's torch RNG states (CPU, and the current CUDA device if any) as uint8 tensors."""
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def set_rng_states(states: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])


# -- the directory as a unit ---------------------------------------------------------------------
def find_state_dir(out_dir: str | Path) -> Path | None:
    """The complete training state in ``out_dir``, or ``None`` if there is none.

    Falls back to ``training_state.old-*`` when a save was killed between its two renames.
    """
    out = Path(out_dir)
    final = out / STATE_DIR
    if final.is_dir():
        return final
    olds = sorted(out.glob(f"{STATE_DIR}.old-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in olds:
        if (old / "state.json").is_file():
            logger.warning("using %s: the last checkpoint save was interrupted", old.name)
            return old
    return None


def _cleanup_leftovers(out: Path) -> None:
    """Remove half-written temp dirs, and old states once a complete current one exists."""
    for p in out.glob(f"{STATE_DIR}.tmp-*"):
        shutil.rmtree(p, ignore_errors=True)
    if (out / STATE_DIR / "state.json").is_file():
        for p in out.glob(f"{STATE_DIR}.old-*"):
            shutil.rmtree(p, ignore_errors=True)


def write_state_dir(out_dir: str | Path, files: dict[str, dict[str, torch.Tensor]], state: dict[str, Any]) -> Path:
    """Write ``training_state/`` atomically as a directory.

    Args:
        out_dir: the model folder.
        files: safetensors file name -> tensors (e.g. ``{"model.safetensors": state_dict}``).
        state: JSON-ready dict; the sha256 of every file is added under ``files``.
    Returns:
        The path of the new ``training_state`` directory.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _cleanup_leftovers(out)
    tmp = Path(tempfile.mkdtemp(prefix=f"{STATE_DIR}.tmp-", dir=out))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700 folders; give the state the mode mkdir would
        hashes = {}
        for name, tensors in files.items():
            save_safetensors(tensors, tmp / name)  # temp file + fsync + rename inside tmp
            hashes[name] = file_sha256(tmp / name)
        state = {**state, "format_version": FORMAT_VERSION, "files": hashes}
        atomic_write_text(tmp / "state.json", json.dumps(state, indent=1) + "\n")
        fsync_dir(tmp)
        final = out / STATE_DIR
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f"{STATE_DIR}.old-", dir=out))
            os.rmdir(old)
            os.rename(final, old)
        os.rename(tmp, final)
        fsync_dir(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _cleanup_leftovers(out)  # the old state, and any left by an earlier interrupted save
    return final


def read_state_dir(out_dir: str | Path) -> tuple[Path, dict[str, Any], dict[str, dict[str, torch.Tensor]]]:
    """Read and verify the training state written by :func:`write_state_dir`.

    Returns:
        ``(path, state, files)`` with ``files`` mapping each safetensors file name to its tensors.
    Raises:
        CheckpointError: missing, truncated, tampered or unreadable state, in one line.
    """
    path = find_state_dir(out_dir)
    if path is None:
        raise CheckpointError(f"no {STATE_DIR}/ in {out_dir} to resume from; run without --resume to start afresh")
    sj = path / "state.json"
    try:
        state = json.loads(sj.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{sj} is missing; the checkpoint in {path} is incomplete") from None
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise CheckpointError(f"{sj} is corrupt ({type(e).__name__}); delete {path} to start afresh") from None
    if not isinstance(state, dict) or not isinstance(state.get("files"), dict) or "step" not in state:
        raise CheckpointError(f"{sj} is not an lmforge training state; delete {path} to start afresh")
    if state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{sj} has format version {state.get('format_version')}, expected {FORMAT_VERSION}")
    files = {}
    for name, digest in state["files"].items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{f} is missing; the checkpoint in {path} is incomplete")
        if file_sha256(f) != digest:
            raise CheckpointError(f"{f} is corrupt (checksum mismatch); delete {path} to start afresh")
        files[name] = load_safetensors(f)
    return path, state, files


def restore_model_config(out_dir: str | Path) -> bool:
    """Write ``OUT/config.json`` from the training state when a kill left the state but not the config.

    The first checkpoint writes ``training_state/`` before the model folder's files; a kill between
    the two leaves a folder whose state (with the model config in ``state.json``) is complete.
    Returns:
        True when ``config.json`` was written.
    """
    out = Path(out_dir)
    if (out / "config.json").is_file():
        return False
    path = find_state_dir(out)
    if path is None:
        return False
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    config = state.get("model_config") if isinstance(state, dict) else None
    if not isinstance(config, dict) or "model_type" not in config:
        return False
    atomic_write_text(out / "config.json", json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    logger.warning("%s: restored config.json from the training state (the last save was interrupted)", out)
    return True
