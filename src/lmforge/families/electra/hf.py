"""HF ``transformers`` ELECTRA <-> lmforge ELECTRA.

HF keeps ELECTRA's two models apart (``google/electra-small-discriminator`` and ``-generator``), each a
complete model with its own copy of the embeddings; lmforge trains them as one model that shares the
embeddings.  An export is therefore two HF folders, one inside the other:

* ``OUT/``: the discriminator, ``ElectraForPreTraining`` (``ElectraModel`` reads the same folder), with the
  tokenizer and the model card;
* ``OUT/generator/``: the generator, ``ElectraForMaskedLM`` (the ``fill-mask`` pipeline), with the
  tokenizer and a copy of the shared embeddings.

``transformers`` loads either with ``from_pretrained(OUT)`` / ``from_pretrained(OUT, subfolder="generator")``
(or the path ``OUT/generator``), and ``import-hf OUT`` reads both back.  A discriminator folder without
``generator/`` (e.g. a downloaded ``google/electra-small-discriminator``) imports with a freshly initialised
generator, with a warning; a generator folder alone is refused (the body would be untrained).

:data:`KEY_MAP` is the whole mapping; inside an encoder layer, :data:`lmforge.families.bert.hf.LAYER_MAP`
renames the block's parameters and its fused ``qkv`` is HF's ``query``, ``key``, ``value`` stacked.  Neither
direction needs ``transformers``: weights go through safetensors, configs through JSON.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ...config import load_json
from ...errors import CheckpointError
from ...storage.files import load_safetensors, save_json, save_safetensors
from ..bert.hf import LAYER_MAP, QKV, load_tokenizer_beside
from ..bert.model import SUPPORTED_ACTS
from .model import ElectraConfig, ElectraForPreTraining

logger = logging.getLogger(__name__)

DISCRIMINATOR, GENERATOR = "discriminator", "generator"
GENERATOR_DIR = "generator"  # the generator's folder inside an export

#: lmforge key prefix -> the (HF model, HF key prefix) it is written to.  The shared embeddings go to both
#: models; on import they are read from the discriminator.  Layers under ``...encoder.layer.`` are renamed inside
#: by LAYER_MAP.  The generator's output matrix is the token embeddings (tied) and is not written.
KEY_MAP: dict[str, tuple[tuple[str, str], ...]] = {
    "electra.embeddings.": ((DISCRIMINATOR, "electra.embeddings."), (GENERATOR, "electra.embeddings.")),
    "electra.embeddings_project.": ((DISCRIMINATOR, "electra.embeddings_project."),),
    "electra.encoder.layer.": ((DISCRIMINATOR, "electra.encoder.layer."),),
    "discriminator_predictions.": ((DISCRIMINATOR, "discriminator_predictions."),),
    "generator.electra.embeddings_project.": ((GENERATOR, "electra.embeddings_project."),),
    "generator.electra.encoder.layer.": ((GENERATOR, "electra.encoder.layer."),),
    "generator.generator_predictions.": ((GENERATOR, "generator_predictions."),),
    "generator.generator_lm_head.": ((GENERATOR, "generator_lm_head."),),
}
#: HF keys that carry nothing lmforge needs (buffers, the tied output matrix)
DROP_SUFFIXES = ("position_ids", "token_type_ids", "generator_lm_head.weight")
#: HF config fields copied one-to-one into ElectraConfig (the discriminator's)
HF_FIELDS = (
    "vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
    "type_vocab_size", "layer_norm_eps", "initializer_range", "pad_token_id",
)


def _prefix(name: str) -> str:
    """The :data:`KEY_MAP` prefix ``name`` starts with (the longest)."""
    hits = [p for p in KEY_MAP if name.startswith(p)]
    if not hits:  # pragma: no cover - a new parameter without a mapping is a bug
        raise KeyError(f"no HF name for {name}")
    return max(hits, key=len)


def _layer_to_hf(rest: str, t: torch.Tensor, width: int) -> dict[str, torch.Tensor]:
    """One parameter inside an encoder layer (``"{i}.attn.qkv.weight"``...) -> its HF key(s) inside the layer list."""
    i, inner = rest.split(".", 1)
    if inner in ("attn.qkv.weight", "attn.qkv.bias"):
        kind = inner.rsplit(".", 1)[1]
        return {f"{i}.attention.self.{part}.{kind}": piece.clone() for part, piece in zip(QKV, t.split(width, dim=0))}
    return {f"{i}.{LAYER_MAP[inner]}": t}


def to_hf_state_dicts(model: ElectraForPreTraining) -> dict[str, dict[str, torch.Tensor]]:
    """lmforge state dict -> ``{"discriminator": ElectraForPreTraining's, "generator": ElectraForMaskedLM's}``."""
    widths = {DISCRIMINATOR: model.config.hidden_size, GENERATOR: model.config.generator_shape[0]}
    out: dict[str, dict[str, torch.Tensor]] = {DISCRIMINATOR: {}, GENERATOR: {}}
    for name, t in model.state_dict().items():
        t = t.detach().cpu()
        prefix = _prefix(name)
        rest = name[len(prefix):]
        for which, theirs in KEY_MAP[prefix]:
            if prefix.endswith("encoder.layer."):
                out[which].update({theirs + k: v for k, v in _layer_to_hf(rest, t, widths[which]).items()})
            else:
                out[which][theirs + rest] = t
    return out


def from_hf_state_dict(state: dict[str, torch.Tensor], which: str,
                       skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """The weights of one HF model (``which``: discriminator or generator) under lmforge's names.

    Only what the file holds is mapped (the caller compares with the model's keys); the lmforge prefixes in
    ``skip`` are left out (the generator's copy of the shared embeddings).  HF weights with no place in lmforge
    (e.g. a task head) are named in a warning.
    """
    ours: dict[str, torch.Tensor] = {}
    used: list[str] = []
    for prefix, targets in KEY_MAP.items():
        for model, theirs in targets:
            if model != which:
                continue
            used.append(theirs)
            if prefix in skip:
                continue
            part = {k[len(theirs):]: v for k, v in state.items()
                    if k.startswith(theirs) and not k.endswith(DROP_SUFFIXES)}
            if prefix.endswith("encoder.layer."):
                part = _layers_from_hf(part)
            ours.update({prefix + k: v for k, v in part.items()})
    extra = [k for k in state if not k.startswith(tuple(used)) and not k.endswith(DROP_SUFFIXES)]
    if extra:
        logger.warning("ignored %d HF weights lmforge ELECTRA has no place for, e.g. %s", len(extra), extra[:3])
    return ours


_FROM_HF_LAYER = {hf: mine for mine, hf in LAYER_MAP.items()}


def _layers_from_hf(part: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF's names inside the layer list (``"0.attention.self.query.weight"``...) -> lmforge's (fused ``qkv``)."""
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for k, v in part.items():
        i, inner = k.split(".", 1)
        if inner.startswith("attention.self."):
            name, kind = inner[len("attention.self."):].split(".", 1)
            qkv.setdefault((i, kind), {})[name] = v
        elif inner in _FROM_HF_LAYER:
            out[f"{i}.{_FROM_HF_LAYER[inner]}"] = v
    for (i, kind), parts in qkv.items():
        if set(parts) == set(QKV):  # an incomplete triple stays missing: the caller names it
            out[f"{i}.attn.qkv.{kind}"] = torch.cat([parts[p] for p in QKV], dim=0)
    return out


# -- configs ---------------------------------------------------------------------------------------------------
def hf_config_dicts(config: ElectraConfig) -> dict[str, dict]:
    """The two ``config.json`` files HF's ``ElectraForPreTraining`` and ``ElectraForMaskedLM`` read."""
    disc = {k: getattr(config, k) for k in HF_FIELDS}
    disc.update(architectures=["ElectraForPreTraining"], model_type="electra", position_embedding_type="absolute",
                summary_type="first", summary_use_proj=True, summary_activation="gelu", summary_last_dropout=0.1,
                classifier_dropout=None, use_cache=True)
    width, heads, ffn = config.generator_shape
    gen = dict(disc, architectures=["ElectraForMaskedLM"], hidden_size=width, num_attention_heads=heads,
               intermediate_size=ffn, tie_word_embeddings=True)
    return {DISCRIMINATOR: disc, GENERATOR: gen}


def _check_hf_config(data: dict, where: Path) -> None:
    if data.get("model_type") != "electra":
        raise CheckpointError(f"{where} holds an HF '{data.get('model_type')}' model, not 'electra'")
    if data.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{where}: only absolute position embeddings are supported, "
                              f"not '{data['position_embedding_type']}'")
    if data.get("is_decoder") or data.get("add_cross_attention"):
        raise CheckpointError(f"{where} is a decoder / has cross-attention; lmforge reads ELECTRA encoders only")
    if data.get("hidden_act", "gelu") not in SUPPORTED_ACTS:
        raise CheckpointError(f"{where}: hidden_act '{data['hidden_act']}' is not supported; lmforge knows "
                              f"{', '.join(SUPPORTED_ACTS)}")


def _generator_divisor(disc: dict, gen: dict, where: Path) -> int:
    """The ``generator_size_divisor`` whose generator shape is the HF generator's (CheckpointError when none is)."""
    hidden, width = int(disc["hidden_size"]), int(gen.get("hidden_size", 0))
    d = round(hidden / width) if width else 0
    if d >= 1:
        probe = ElectraConfig(**{k: disc[k] for k in ("hidden_size", "num_attention_heads") if k in disc},
                              generator_size_divisor=d)
        want = (width, gen.get("num_attention_heads"), gen.get("intermediate_size"))
        same_rest = all(gen.get(k) == disc.get(k) for k in ("embedding_size", "vocab_size", "num_hidden_layers"))
        if probe.generator_shape == want and same_rest:
            return d
    raise CheckpointError(
        f"{where}: the generator (hidden {gen.get('hidden_size')}, {gen.get('num_attention_heads')} heads, FFN "
        f"{gen.get('intermediate_size')}, {gen.get('num_hidden_layers')} layers) is not 1/d of the discriminator "
        f"(hidden {hidden}) in lmforge's shape (width C/d, heads width/64, FFN 4 x width, as many layers, the same "
        "embeddings); import the discriminator folder alone"
    )


def _config_from_hf(disc: dict, gen: dict | None, where: Path) -> ElectraConfig:
    kwargs = {k: disc[k] for k in HF_FIELDS if disc.get(k) is not None}
    kwargs.setdefault("pad_token_id", 0)
    if gen is not None:
        kwargs["generator_size_divisor"] = _generator_divisor(disc, gen, where)
    try:
        return ElectraConfig(**kwargs)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: HF config cannot be read as an ELECTRA config: {e}") from None


# -- the two directions ------------------------------------------------------------------------------------------
def _read_weights(p: Path) -> dict[str, torch.Tensor]:
    weights = p / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{weights} not found; lmforge reads HF weights from safetensors only (not .bin)")
    state = load_safetensors(weights)
    bare = not any(k.startswith("electra.") for k in state)
    return {("electra." + k if bare else k): v for k, v in state.items()}  # a bare ElectraModel file has no prefix


def import_hf(hf_dir: str | Path, warn_fresh_heads: bool = True) -> ElectraForPreTraining:
    """Load an HF ELECTRA export (``OUT/`` discriminator and ``OUT/generator/``) as an lmforge ELECTRA.

    A discriminator folder without ``generator/`` gets a freshly initialised generator (the default
    ``generator_size_divisor``), and a bare ``ElectraModel`` a fresh discriminator head, each with a warning.

    Args:
        hf_dir: the HF folder of the discriminator (``ElectraForPreTraining`` or ``ElectraModel``).
        warn_fresh_heads: warn about freshly initialised parts; a caller that reads only the body says False.
    Returns:
        The model in eval mode, with the folder's tokenizer attached when lmforge reads it.
    """
    p = Path(hf_dir)
    disc = load_json(p / "config.json")
    _check_hf_config(disc, p)
    if "ElectraForMaskedLM" in (disc.get("architectures") or []):
        raise CheckpointError(f"{p} holds an ELECTRA generator (ElectraForMaskedLM); import-hf reads the "
                              "discriminator's folder (ElectraForPreTraining), with the generator in its generator/")
    gen_dir = p / GENERATOR_DIR
    gen = load_json(gen_dir / "config.json") if (gen_dir / "config.json").is_file() else None
    if gen is not None:
        _check_hf_config(gen, gen_dir)
    model = ElectraForPreTraining(_config_from_hf(disc, gen, p))
    ours = from_hf_state_dict(_read_weights(p), DISCRIMINATOR)
    if gen is not None:
        gen_state = _read_weights(gen_dir)
        ours.update(from_hf_state_dict(gen_state, GENERATOR, skip=("electra.embeddings.",)))
        _warn_if_embeddings_differ(gen_state, ours, gen_dir)
    missing = [k for k in model.state_dict() if k not in ours]
    optional = {"discriminator_predictions.": "the discriminator head"}
    if gen is None:
        optional["generator."] = "the generator"
    lacking = [k for k in missing if not k.startswith(tuple(optional))]
    if lacking:
        where = gen_dir if lacking[0].startswith("generator.") else p
        raise CheckpointError(f"{where / 'model.safetensors'} lacks ELECTRA weights, e.g. {lacking[:3]}; "
                              "is it a complete ELECTRA?")
    fresh = [what for prefix, what in optional.items() if any(k.startswith(prefix) for k in missing)]
    if fresh:
        (logger.warning if warn_fresh_heads else logger.debug)(
            "%s has no weights for %s: freshly initialised (pretrain or fine-tune before trusting their outputs)",
            p.name, " and ".join(fresh))
    model.load_weights(ours, strict=False)
    model.eval()
    model.tokenizer = load_tokenizer_beside(p)
    return model


def _warn_if_embeddings_differ(gen_state: dict[str, torch.Tensor], ours: dict[str, torch.Tensor], where: Path):
    prefix = "electra.embeddings."
    differ = [k for k, v in gen_state.items() if k.startswith(prefix) and not k.endswith(DROP_SUFFIXES)
              and (k not in ours or ours[k].shape != v.shape or not torch.equal(ours[k], v))]
    if differ:
        logger.warning("%s: the generator's embeddings differ from the discriminator's (e.g. %s); lmforge shares "
                       "one embedding module and keeps the discriminator's", where, differ[0])


def export_hf(model: ElectraForPreTraining, out_dir: str | Path) -> Path:
    """Write ``model`` as HF folders: the discriminator in ``out_dir``, the generator in ``out_dir/generator``.

    ``transformers.ElectraForPreTraining.from_pretrained(out_dir)`` then gives the discriminator's logits,
    ``ElectraForMaskedLM.from_pretrained(out_dir / "generator")`` the generator's, and
    ``AutoTokenizer.from_pretrained`` of either the same tokenizer.

    Args:
        model: an lmforge ELECTRA.
        out_dir: folder to create or overwrite files in.
    Returns:
        ``out_dir`` as a Path.
    """
    out = Path(out_dir)
    states, configs = to_hf_state_dicts(model), hf_config_dicts(model.config)
    for which, folder in ((DISCRIMINATOR, out), (GENERATOR, out / GENERATOR_DIR)):
        folder.mkdir(parents=True, exist_ok=True)
        save_safetensors(states[which], folder / "model.safetensors", metadata={"format": "pt"})
        save_json(configs[which], folder / "config.json")
        if model.tokenizer is not None:
            model.tokenizer.save(folder)
    if model.tokenizer is None:
        logger.warning("model has no tokenizer attached: %s holds weights and configs only", out)
    return out
