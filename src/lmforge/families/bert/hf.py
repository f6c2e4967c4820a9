"""HF ``transformers`` BERT <-> lmforge BERT.

lmforge's module names are HF's except inside an encoder layer, where the shared
:class:`~lmforge.nn.transformer.TransformerBlock` uses generic names and one fused Q/K/V matrix.
:data:`LAYER_MAP` is the whole difference; ``qkv`` is HF's ``query``, ``key`` and ``value``
stacked along the output dimension (in that order).  Neither direction needs ``transformers``:
weights go through safetensors, the config through JSON.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ...config import load_json
from ...errors import CheckpointError
from ...storage.files import load_safetensors, save_json, save_safetensors
from ...tokenization import Tokenizer
from .model import SUPPORTED_ACTS, BertConfig, BertForPreTraining

logger = logging.getLogger(__name__)

#: lmforge name inside ``bert.encoder.layer.{i}.`` -> HF name inside ``bert.encoder.layer.{i}.``
LAYER_MAP = {
    "attn.proj.weight": "attention.output.dense.weight",
    "attn.proj.bias": "attention.output.dense.bias",
    "ln_attn.weight": "attention.output.LayerNorm.weight",
    "ln_attn.bias": "attention.output.LayerNorm.bias",
    "mlp.fc.weight": "intermediate.dense.weight",
    "mlp.fc.bias": "intermediate.dense.bias",
    "mlp.proj.weight": "output.dense.weight",
    "mlp.proj.bias": "output.dense.bias",
    "ln_mlp.weight": "output.LayerNorm.weight",
    "ln_mlp.bias": "output.LayerNorm.bias",
}
QKV = ("query", "key", "value")
#: HF keys that carry nothing lmforge needs (buffers, tied copies) -> dropped on import
DROP_SUFFIXES = ("position_ids", "token_type_ids", "cls.predictions.decoder.weight")
#: HF config fields copied one-to-one into BertConfig
HF_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "initializer_range",
    "pad_token_id",
)


def _layer_prefix(i: int) -> str:
    return f"bert.encoder.layer.{i}."


def to_hf_state_dict(model: BertForPreTraining) -> dict[str, torch.Tensor]:
    """lmforge state dict -> HF ``BertForPreTraining`` state dict (the tied decoder is not written)."""
    if model.config.norm_first:
        raise CheckpointError("this BERT is pre-LN (norm_first=true), which HF's BertForPreTraining cannot express")
    C = model.config.hidden_size
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        t = t.detach().cpu()
        if name.startswith("bert.encoder.layer."):
            i, rest = name[len("bert.encoder.layer.") :].split(".", 1)
            prefix = _layer_prefix(int(i))
            if rest in ("attn.qkv.weight", "attn.qkv.bias"):
                kind = rest.rsplit(".", 1)[1]
                for part, piece in zip(QKV, t.split(C, dim=0)):
                    out[f"{prefix}attention.self.{part}.{kind}"] = piece.clone()
            elif rest in LAYER_MAP:
                out[prefix + LAYER_MAP[rest]] = t
            else:  # pragma: no cover - a new parameter without a mapping is a bug
                raise KeyError(f"no HF name for {name}")
        else:
            out[name] = t  # embeddings, pooler and heads already carry HF names
    return out


def _normalise_hf_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename old TF-era names (gamma/beta) and add the ``bert.`` prefix of a bare ``BertModel``."""
    bare = not any(k.startswith("bert.") for k in state)
    out = {}
    for k, v in state.items():
        if k.endswith(".gamma"):
            k = k[: -len(".gamma")] + ".weight"
        elif k.endswith(".beta"):
            k = k[: -len(".beta")] + ".bias"
        if bare and not k.startswith("cls."):
            k = "bert." + k
        if k == "cls.predictions.decoder.bias":
            k = "cls.predictions.bias"  # HF ties the two; older files store only one of them
        out[k] = v
    return out


def from_hf_state_dict(
    state: dict[str, torch.Tensor], config: BertConfig
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """HF BERT state dict -> (lmforge state dict, HF keys that were expected but absent).

    Accepts ``BertForPreTraining``, ``BertForMaskedLM`` and bare ``BertModel`` files.
    """
    state = _normalise_hf_keys(state)
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    missing: list[str] = []
    for i in range(config.num_hidden_layers):
        prefix = _layer_prefix(i)
        for kind in ("weight", "bias"):
            keys = [f"{prefix}attention.self.{p}.{kind}" for p in QKV]
            if all(k in state for k in keys):
                out[f"{prefix}attn.qkv.{kind}"] = torch.cat([state[k] for k in keys], dim=0)
                used.update(keys)
            else:
                missing.extend(k for k in keys if k not in state)
        for ours, theirs in LAYER_MAP.items():
            if prefix + theirs in state:
                out[prefix + ours] = state[prefix + theirs]
                used.add(prefix + theirs)
            else:
                missing.append(prefix + theirs)
    top = [
        "bert.embeddings.word_embeddings.weight",
        "bert.embeddings.position_embeddings.weight",
        "bert.embeddings.token_type_embeddings.weight",
        "bert.embeddings.LayerNorm.weight",
        "bert.embeddings.LayerNorm.bias",
        "bert.pooler.dense.weight",
        "bert.pooler.dense.bias",
        "cls.predictions.bias",
        "cls.predictions.transform.dense.weight",
        "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.LayerNorm.weight",
        "cls.predictions.transform.LayerNorm.bias",
        "cls.seq_relationship.weight",
        "cls.seq_relationship.bias",
    ]
    for k in top:
        if k in state:
            out[k] = state[k]
            used.add(k)
        else:
            missing.append(k)
    extra = [k for k in state if k not in used and not k.endswith(DROP_SUFFIXES)]
    if extra:
        logger.warning("ignored %d HF weights lmforge BERT has no place for, e.g. %s", len(extra), extra[:3])
    return out, missing


def _config_from_hf(data: dict) -> BertConfig:
    if data.get("position_embedding_type", "absolute") != "absolute":
        kind = data["position_embedding_type"]
        raise CheckpointError(f"only absolute position embeddings are supported, not '{kind}'")
    if data.get("is_decoder") or data.get("add_cross_attention"):
        raise CheckpointError("this HF BERT is a decoder / has cross-attention; lmforge reads encoders only")
    if data.get("hidden_act", "gelu") not in SUPPORTED_ACTS:
        raise CheckpointError(
            f"hidden_act '{data['hidden_act']}' is not supported; lmforge BERT knows {', '.join(SUPPORTED_ACTS)}"
        )
    kwargs = {k: data[k] for k in HF_FIELDS if data.get(k) is not None}
    kwargs.setdefault("pad_token_id", 0)
    try:
        return BertConfig(**kwargs)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"HF config cannot be read as a BERT config: {e}") from None


def import_hf(hf_dir: str | Path, warn_fresh_heads: bool = True) -> BertForPreTraining:
    """Load an HF BERT folder (``config.json`` + ``model.safetensors``) as a :class:`BertForPreTraining`.

    Heads or a pooler that the folder lacks (e.g. a bare ``BertModel`` such as all-MiniLM-L6-v2) are
    reported with a warning and keep their fresh initialisation.  Missing encoder weights are an error.
    The folder's tokenizer is attached when lmforge's :class:`~lmforge.tokenization.Tokenizer` reads it.

    Args:
        hf_dir: the HF folder.
        warn_fresh_heads: warn about the freshly initialised heads; a caller that reads only the body
            (hidden states: ``embed``, the word-in-context table, features) passes False.
    Returns:
        The model in eval mode.
    """
    p = Path(hf_dir)
    data = load_json(p / "config.json")
    if data.get("model_type") != "bert":
        raise CheckpointError(f"{p} holds an HF '{data.get('model_type')}' model, not 'bert'")
    config = _config_from_hf(data)
    weights = p / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{weights} not found; lmforge reads HF weights from safetensors only (not .bin)")
    state, missing = from_hf_state_dict(load_safetensors(weights), config)
    body_missing = [k for k in missing if k.startswith("bert.") and not k.startswith("bert.pooler.")]
    if body_missing:
        raise CheckpointError(f"{weights} lacks BERT body weights, e.g. {body_missing[:3]}; is it a complete BERT?")
    model = BertForPreTraining(config)
    if missing:
        names = {"cls.predictions": "MLM head", "cls.seq_relationship": "NSP head", "bert.pooler": "pooler"}
        parts = sorted({f"{v} ({k})" for k, v in names.items() for m in missing if m.startswith(k + ".")})
        (logger.warning if warn_fresh_heads else logger.debug)(
            "%s has no weights for %s: freshly initialised (train or fine-tune before trusting their outputs)",
            p.name,
            ", ".join(parts),
        )
    model.load_weights(state, strict=False)
    model.eval()
    model.tokenizer = load_tokenizer_beside(p)
    return model


def load_tokenizer_beside(p: Path):
    """The tokenizer in HF folder ``p``, or None (with a warning) when it has none or it cannot be read."""
    if not (p / "tokenizer.json").is_file() and not (p / "vocab.txt").is_file():
        logger.warning("%s has no tokenizer files; attach one before using embed/fill_mask", p)
        return None
    try:
        return Tokenizer.load(p)
    except Exception as e:  # the tokenizer is optional here; the weights are what import-hf promises
        logger.warning("could not read the tokenizer in %s (%s); the model has none attached", p, e)
        return None


def hf_config_dict(config: BertConfig) -> dict:
    """The ``config.json`` HF's ``BertForPreTraining.from_pretrained`` reads."""
    data = {k: getattr(config, k) for k in HF_FIELDS}
    data.update(
        architectures=["BertForPreTraining"],
        model_type="bert",
        position_embedding_type="absolute",
        tie_word_embeddings=True,
        use_cache=True,
        classifier_dropout=None,
    )
    return data


def export_hf(model: BertForPreTraining, out_dir: str | Path) -> Path:
    """Write ``model`` as an HF folder: ``config.json``, ``model.safetensors`` (HF names), tokenizer files.

    ``transformers.BertForPreTraining.from_pretrained(out_dir)`` then gives the same MLM and NSP logits,
    and ``AutoTokenizer.from_pretrained(out_dir)`` the same tokenizer.

    Args:
        model: an lmforge BERT (post-LN).
        out_dir: folder to create or overwrite files in.
    Returns:
        ``out_dir`` as a Path.
    """
    out = Path(out_dir)
    state = to_hf_state_dict(model)
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(state, out / "model.safetensors", metadata={"format": "pt"})
    save_json(hf_config_dict(model.config), out / "config.json")
    if model.tokenizer is not None:
        model.tokenizer.save(out)
    else:
        logger.warning("model has no tokenizer attached: %s holds weights and config only", out)
    return out

