"""HF ``transformers`` <-> lmforge weight maps.  Each family with HF interop says which module maps it
(:meth:`lmforge.families.Family.hf_interop`) and which HF ``model_type`` that module reads and writes
(``hf_model_type``).

Each module exposes ``export_hf(model, out_dir)`` (writes an HF folder with the tokenizer) and
``import_hf(hf_dir) -> model`` (reads ``config.json`` + ``model.safetensors`` of an HF folder).
"""

from __future__ import annotations

from pathlib import Path

from ..config import load_json
from ..errors import CheckpointError
from ..families import FAMILIES, load
from ..models.sentence import lmforge_pipeline, read_sentence_transformers, write_sentence_transformers
from ..storage.cards import update_card
from .hub_cache import resolve_hf_dir
from .runs import export_run, is_run_folder


def hf_types() -> dict[str, str]:
    """HF config ``model_type`` -> the lmforge family that reads it, for every family with HF interop."""
    return {f.hf_model_type: f.name for f in FAMILIES.values() if f.hf_model_type is not None}


def export_hf(model_dir: str | Path, out_dir: str | Path) -> Path:
    """Write an HF ``transformers`` folder for the lmforge model at ``model_dir`` (of a family with HF interop:
    BERT, GPT, ELECTRA), or for the transfer run folder at ``model_dir`` (its task's HF class:
    :mod:`lmforge.interop.runs`).

    A BERT or ELECTRA folder is also a sentence-transformers one (``SentenceTransformer(out_dir)``): with the
    pipeline the model was imported with, or else sentence-transformers' mean over every position, which
    lmforge gives as ``encode(pool="mean+specials")`` (:mod:`lmforge.models.sentence`)."""
    if is_run_folder(model_dir):
        return export_run(model_dir, out_dir)
    model = load(model_dir)
    family = FAMILIES[model.model_type]
    interop = family.hf_interop()
    if interop is None:
        exporters = list(hf_types().values())
        raise CheckpointError(f"export-hf supports {', '.join(exporters)} models, not '{model.model_type}'")
    interop.export_hf(model, Path(out_dir))
    if family.sentence_transformers and model.tokenizer is not None:
        # also a sentence-transformers folder: the model's recorded pipeline, else the mean over every position
        pipeline = model.sentence_pipeline or lmforge_pipeline(model)
        write_sentence_transformers(pipeline, model.hidden_size, out_dir)
    update_card(out_dir, source=model_dir)  # README.md: an HF model card from the model folder's facts
    return Path(out_dir)


def import_hf(hf_dir: str | Path, out_dir: str | Path | None = None):
    """Load an HF BERT, GPT-2 or ELECTRA folder (or a model id found in the local HF cache: :mod:`.hub_cache`) as an
    lmforge model; save it as a model folder if ``out_dir``.  A sentence-transformers folder's pipeline
    (:mod:`lmforge.models.sentence`) is kept as the model's ``sentence_pipeline``."""
    p = resolve_hf_dir(hf_dir)
    data = load_json(p / "config.json")
    hf_type = data.get("model_type")
    readers = hf_types()
    if hf_type not in readers:
        raise CheckpointError(f"{p} holds an HF '{hf_type}' model; import-hf reads {', '.join(readers)}")
    # a sentence-transformers folder: its pooling, normalisation, length and prompts come along (read first: a
    # pipeline lmforge cannot reproduce is refused before any weight is read)
    pipeline = read_sentence_transformers(p)
    # a sentence-transformers BERT is read for its vectors: the MLM/NSP heads it never had are no news
    model = FAMILIES[readers[hf_type]].hf_interop().import_hf(p, warn_fresh_heads=pipeline is None)
    model.sentence_pipeline = pipeline
    if out_dir is not None:
        model.save_pretrained(out_dir)
    return model
