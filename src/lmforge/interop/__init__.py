"""HF ``transformers`` <-> lmforge weight maps.  ``FAMILIES`` maps a model_type to its module.

Each module exposes ``export_hf(model, out_dir)`` (writes an HF folder with the tokenizer) and
``import_hf(hf_dir) -> model`` (reads ``config.json`` + ``model.safetensors`` of an HF folder).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..config import load_json
from ..errors import CheckpointError

FAMILIES = {"bert": "lmforge.interop.bert", "gpt": "lmforge.interop.gpt2"}
# HF config model_type -> lmforge family
HF_TYPES = {"bert": "bert", "gpt2": "gpt"}


def export_hf(model_dir: str | Path, out_dir: str | Path) -> Path:
    """Write an HF ``transformers`` folder for the lmforge BERT or GPT model at ``model_dir``."""
    from .. import load

    model = load(model_dir)
    if model.model_type not in FAMILIES:
        raise CheckpointError(f"export-hf supports {', '.join(FAMILIES)} models, not '{model.model_type}'")
    importlib.import_module(FAMILIES[model.model_type]).export_hf(model, Path(out_dir))
    return Path(out_dir)


def import_hf(hf_dir: str | Path, out_dir: str | Path | None = None):
    """Load an HF BERT or GPT-2 folder as an lmforge model; save it as a model folder if ``out_dir``."""
    p = Path(hf_dir)
    data = load_json(p / "config.json")
    hf_type = data.get("model_type")
    if hf_type not in HF_TYPES:
        raise CheckpointError(f"{p} holds an HF '{hf_type}' model; import-hf reads {', '.join(HF_TYPES)}")
    model = importlib.import_module(FAMILIES[HF_TYPES[hf_type]]).import_hf(p)
    if out_dir is not None:
        model.save_pretrained(out_dir)
    return model
