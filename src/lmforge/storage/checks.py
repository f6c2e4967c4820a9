"""Whether the model in a folder can be read: finite weights, and the tokenizer it was built for."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..config import load_json
from ..errors import CheckpointError, LmforgeError
from ..tokenization import Tokenizer
from .cards import read_card_meta
from .files import file_sha256, load_safetensors
from .folders import MARKER, recorded_weights


def nonfinite_tensor(tensors: dict) -> str | None:
    """The name of the first floating-point tensor of ``tensors`` (name -> tensor) holding NaN or infinity,
    else ``None``.  Every check that keeps diverged weights from being saved or loaded asks this."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t.detach()).all()):
            return name
    return None


def nonfinite_number(record, where: str = "") -> str | None:
    """The key path (``train_loss``, ``choices.lr_trials.0.val_score``) of the first float in a JSON-like
    ``record`` that is NaN or infinity, else ``None``: such a record is not valid JSON."""
    if isinstance(record, float) and not math.isfinite(record):
        return where or "the value"
    items = record.items() if isinstance(record, dict) else enumerate(record) if isinstance(record, list) else ()
    for key, value in items:
        found = nonfinite_number(value, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def check_finite(tensors: dict, where: str | Path) -> None:
    """Refuse weights holding NaN or infinity, naming the first such tensor."""
    name = nonfinite_tensor(tensors)
    if name is not None:
        raise LmforgeError(
            f"{where} holds non-finite weights ({name} has NaN or infinity): the training diverged; resume "
            f"from an earlier checkpoint with a lower learning rate, or retrain"
        )


def check_dtypes(state: dict, own: dict, where: str | Path) -> None:
    """Refuse a stored tensor whose dtype the model's own tensor of that name cannot take without loss.

    ``load_state_dict`` casts silently: float weights rewritten as int64 would load as whole numbers, float64
    would be rounded.  Accepted: the same dtype, or one the model's dtype holds exactly (float16 or bfloat16 into
    float32, int32 into int64); a float never goes into an integer tensor or the other way round.

    Args:
        state: the stored tensors (name -> tensor); names the model lacks are someone else's concern.
        own: the model's ``state_dict()``.
    """
    for name, t in state.items():
        held = own.get(name)
        if held is None or t.dtype == held.dtype:
            continue
        if t.is_floating_point() == held.is_floating_point() and torch.promote_types(t.dtype, held.dtype) == held.dtype:
            continue
        stored, wants = str(t.dtype).removeprefix("torch."), str(held.dtype).removeprefix("torch.")
        raise CheckpointError(
            f"weight '{name}' is {stored} but the model holds {wants} there, which cannot take {stored} without "
            f"loss: {where} was rewritten; put back the file lmforge saved"
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


def check_recorded_tokenizer(folder: str | Path, tokenizer) -> None:
    """Refuse a tokenizer other than the one the model was pretrained with, by the hash its card records.

    A tokenizer of the same kind and size passes :func:`check_tokenizer_fits` but maps text to other ids, so the
    model reads garbage; the card's ``lmforge.corpus.tokenizer_hash`` (the shards' tokenizer, which pretraining
    checked against the model's) tells them apart.  A folder with no card, or a card without the hash, is not
    checked (an imported HF model, a model written before cards recorded it).
    """
    meta = read_card_meta(folder).get("lmforge")
    corpus = meta.get("corpus") if isinstance(meta, dict) and meta.get("kind") == "model" else None
    recorded = corpus.get("tokenizer_hash") if isinstance(corpus, dict) else None
    if isinstance(recorded, str) and recorded and recorded != tokenizer.hash:
        raise LmforgeError(
            f"the tokenizer in {folder} (hash {tokenizer.hash[:12]}) is not the one the model was pretrained with "
            f"(its README.md records {recorded[:12]}): the model would read other ids; put the model's own "
            f"tokenizer files back"
        )


def check_recorded_weights(path: str | Path) -> None:
    """Refuse a weights file other than the one lmforge wrote there, by the sha256 its folder's marker records.

    A file of the same shapes and dtypes copied in from another model, or rewritten by another tool, loads
    without complaint otherwise and gives another model's answers.  The file is hashed once, streamed.  A file
    the marker does not record (a folder written before lmforge recorded hashes, or by another tool) is not
    checked.
    """
    p = Path(path)
    recorded = recorded_weights(p.parent).get(p.name)
    if not recorded or not p.is_file():
        return
    try:
        found = file_sha256(p)
    except OSError:
        return  # unreadable: the load that follows says so
    # a writer replacing the file meanwhile (a pretraining's checkpoint) updates the record before and after its
    # rename: whichever file was hashed, the record read before or the one read after names it
    if found not in recorded and found not in recorded_weights(p.parent).get(p.name, []):
        raise CheckpointError(
            f"{p} is not the file lmforge wrote there (sha256 {found[:12]}, recorded {recorded[0][:12]}): its "
            f"weights were replaced or rewritten; put back the original or re-run the command that wrote "
            f"{p.parent} (if you replaced it on purpose, delete {p.parent / MARKER} to stop this check)"
        )


def read_weights(path: str | Path) -> dict:
    """The tensors of a weights file lmforge wrote: checked against its recorded hash, then for NaN and infinity."""
    check_recorded_weights(path)
    state = load_safetensors(path)
    check_finite(state, path)
    return state


def check_model_folder(path: str | Path, families: Mapping[str, Any]) -> None:
    """Refuse a model folder whose weights are not finite or whose tokenizer does not fit its config.

    For commands that read weights without :func:`lmforge.load` (which checks the same).  A folder
    with no ``config.json`` or weights is left to the caller's own message.  ``families`` maps a ``model_type``
    to its family (the registry's ``FAMILIES``, which sits above this module): the tokenizer kind it reads.
    """
    p = Path(path)
    weights = p / "model.safetensors"
    if not (p / "config.json").is_file() or not weights.is_file():
        return
    read_weights(weights)
    if (p / "tokenizer.json").is_file():
        class _Config:  # the fields check_tokenizer_fits reads
            def __init__(self, data: dict):
                self.__dict__.update({k: v for k, v in data.items() if k.endswith("_id") or k == "vocab_size"})

        data = load_json(p / "config.json")
        tokenizer = Tokenizer.load(p)
        check_tokenizer_fits(_Config(data), tokenizer, p, families.get(data.get("model_type")))
        check_recorded_tokenizer(p, tokenizer)
