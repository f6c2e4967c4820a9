"""Find a model in the local Hugging Face hub cache: ``import-hf bert-base-uncased`` without a download.

lmforge downloads nothing; but a model that ``transformers`` or ``huggingface-cli download`` fetched
before sits in the hub cache, laid out as ``models--{org}--{name}/snapshots/{revision}/`` (the files are
links into ``blobs/``), with ``refs/main`` naming the revision of the main branch.  The cache folder is
found as ``huggingface_hub`` finds it: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import CheckpointError


def hub_cache_dir() -> Path:
    """The local HF hub cache folder (it need not exist)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def cached_snapshot(repo_id: str, cache: Path | None = None) -> Path | None:
    """The snapshot folder of ``repo_id`` (``org/name`` or ``name``) in the hub cache, or None.

    The revision ``refs/main`` names when it is there; else the most recently written snapshot holding a
    ``config.json``.
    """
    repo = (cache or hub_cache_dir()) / ("models--" + repo_id.strip("/").replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        chosen = snapshots / ref.read_text(encoding="utf-8").strip()
        if (chosen / "config.json").is_file():
            return chosen
    found = [s for s in snapshots.iterdir() if (s / "config.json").is_file()]
    return max(found, key=lambda s: (s / "config.json").lstat().st_mtime, default=None)


def resolve_hf_dir(name_or_dir: str | Path) -> Path:
    """A local folder as it is; else the hub cache's snapshot of the model id; else a CheckpointError saying so."""
    p = Path(name_or_dir)
    if p.is_dir():
        return p
    cache = hub_cache_dir()
    snapshot = cached_snapshot(str(name_or_dir), cache)
    if snapshot is not None:
        return snapshot
    raise CheckpointError(
        f"'{name_or_dir}' is not a folder, and import-hf reads local folders only (it downloads nothing); "
        f"no snapshot of it is in the HF cache {cache} either: download it first (huggingface-cli download "
        f"{name_or_dir}) or give the folder holding config.json and model.safetensors"
    )
