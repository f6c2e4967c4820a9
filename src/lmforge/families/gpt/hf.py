"""lmforge GPT <-> HF ``transformers`` GPT-2 (``GPT2LMHeadModel``).

The architectures are the same (pre-LN blocks, final ``ln_f``, tied output layer, tanh GELU); only
the names and one layout differ.  HF keeps GPT-2's ``Conv1D`` modules, whose weights are stored as
(in, out), the transpose of ``nn.Linear``'s (out, in); Q, K and V are one fused ``c_attn`` in both.
GPT-1 (post-LN) models have no GPT-2 twin, so they are refused on export.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from ...config import load_json
from ...errors import CheckpointError, LmforgeError
from ...storage.files import atomic_write_text, load_safetensors, save_safetensors
from ...tokenization import Tokenizer
from .model import ACTIVATIONS, GPTConfig, GPTLMHeadModel

logger = logging.getLogger(__name__)

# lmforge GPTConfig field -> HF GPT2Config field (same names: the config uses HF's)
CONFIG_FIELDS = (
    "vocab_size",
    "n_positions",
    "n_embd",
    "n_layer",
    "n_head",
    "n_inner",
    "activation_function",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "layer_norm_epsilon",
    "initializer_range",
    "bos_token_id",
    "eos_token_id",
)

# per-block lmforge suffix -> (HF suffix, transpose?)  (HF Conv1D weights are (in, out))
BLOCK_MAP: dict[str, tuple[str, bool]] = {
    "ln_attn.weight": ("ln_1.weight", False),
    "ln_attn.bias": ("ln_1.bias", False),
    "attn.qkv.weight": ("attn.c_attn.weight", True),
    "attn.qkv.bias": ("attn.c_attn.bias", False),
    "attn.proj.weight": ("attn.c_proj.weight", True),
    "attn.proj.bias": ("attn.c_proj.bias", False),
    "ln_mlp.weight": ("ln_2.weight", False),
    "ln_mlp.bias": ("ln_2.bias", False),
    "mlp.fc.weight": ("mlp.c_fc.weight", True),
    "mlp.fc.bias": ("mlp.c_fc.bias", False),
    "mlp.proj.weight": ("mlp.c_proj.weight", True),
    "mlp.proj.bias": ("mlp.c_proj.bias", False),
}
TOP_MAP: dict[str, str] = {
    "wte.weight": "transformer.wte.weight",
    "wpe.weight": "transformer.wpe.weight",
    "ln_f.weight": "transformer.ln_f.weight",
    "ln_f.bias": "transformer.ln_f.bias",
}


def weight_map(n_layer: int) -> dict[str, tuple[str, bool]]:
    """Every lmforge state-dict key -> (HF key, transpose?) for an ``n_layer`` GPT (``lm_head`` is tied: absent)."""
    out = {k: (v, False) for k, v in TOP_MAP.items()}
    for i in range(n_layer):
        for ours, (theirs, t) in BLOCK_MAP.items():
            out[f"h.{i}.{ours}"] = (f"transformer.h.{i}.{theirs}", t)
    return out


def hf_config_dict(config: GPTConfig) -> dict:
    """The ``config.json`` of the HF GPT-2 twin of ``config``."""
    d = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}
    d.update({f: getattr(config, f) for f in CONFIG_FIELDS})
    d.update(
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        reorder_and_upcast_attn=False,
        add_cross_attention=False,
        tie_word_embeddings=True,
        use_cache=True,
    )
    return d


def export_hf(model: GPTLMHeadModel, out_dir: str | Path) -> Path:
    """Write ``model`` as an HF GPT-2 folder (config.json, model.safetensors, tokenizer files).

    ``transformers.GPT2LMHeadModel.from_pretrained(out_dir)`` then gives the same logits, and
    ``AutoTokenizer.from_pretrained(out_dir)`` the same token ids (when a tokenizer is attached).

    Args:
        model: a pre-LN (GPT-2 style) :class:`GPTLMHeadModel`.
        out_dir: folder to write (created).
    Returns:
        ``out_dir`` as a Path.
    """
    cfg = model.config
    if not cfg.norm_first:
        raise CheckpointError(
            "this GPT is post-LN (GPT-1 style, norm_first=false); HF GPT-2 is pre-LN, so it cannot be exported "
            "as GPT2LMHeadModel"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    hf_state = {}
    for ours, (theirs, transpose) in weight_map(cfg.n_layer).items():
        t = state[ours].detach().float().cpu()
        hf_state[theirs] = t.t().contiguous() if transpose else t.contiguous()
    save_safetensors(hf_state, out / "model.safetensors", metadata={"format": "pt"})
    atomic_write_text(out / "config.json", json.dumps(hf_config_dict(cfg), indent=2) + "\n")
    if model.tokenizer is not None:
        model.tokenizer.save(out)
    else:
        logger.warning("export-hf: the model has no tokenizer attached; wrote the weights only")
    return out


def import_hf(hf_dir: str | Path, warn_fresh_heads: bool = True) -> GPTLMHeadModel:
    """Load an HF GPT-2 folder (``config.json`` + ``model.safetensors``) as a :class:`GPTLMHeadModel`.

    The tokenizer is attached when the folder has a ``tokenizer.json`` lmforge can read.

    Args:
        hf_dir: the HF folder.
        warn_fresh_heads: accepted as every family's import takes it; GPT-2's LM head is tied to its embeddings,
            so nothing is ever freshly initialised.
    Returns:
        The model in eval mode.
    """
    p = Path(hf_dir)
    data = load_json(p / "config.json")
    if data.get("model_type") != "gpt2":
        raise CheckpointError(f"{p} holds an HF '{data.get('model_type')}' model, not gpt2")
    for key, want in (
        ("add_cross_attention", False),
        ("scale_attn_weights", True),
        ("scale_attn_by_inverse_layer_idx", False),
    ):
        if data.get(key, want) != want:
            raise CheckpointError(f"{p}: GPT-2 variant with {key}={data[key]} is not supported by lmforge")
    if data.get("activation_function", "gelu_new") not in ACTIVATIONS:
        raise CheckpointError(f"{p}: activation_function {data['activation_function']!r} is not supported")
    kwargs = {f: data[f] for f in CONFIG_FIELDS if f in data}
    for f in ("bos_token_id", "eos_token_id"):  # HF's defaults (50256) may lie outside a small vocabulary
        v = kwargs.get(f)
        if v is not None and not 0 <= v < kwargs.get("vocab_size", GPTConfig.vocab_size):
            logger.warning("import-hf: %s=%s is outside the vocabulary; dropped", f, v)
            kwargs[f] = None
    config = GPTConfig(**kwargs, norm_first=True)

    weights = p / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(
            f"{p} has no model.safetensors (lmforge never unpickles .bin files); convert it with "
            "transformers: GPT2LMHeadModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)"
        )
    hf_state = load_safetensors(weights)
    if any(k.startswith("h.0.") for k in hf_state):  # a bare GPT2Model checkpoint has no "transformer." prefix
        hf_state = {f"transformer.{k}": v for k, v in hf_state.items()}
    state: dict[str, torch.Tensor] = {}
    for ours, (theirs, transpose) in weight_map(config.n_layer).items():
        if theirs not in hf_state:
            raise CheckpointError(f"{weights} lacks '{theirs}'; is it a GPT-2 checkpoint of this config?")
        t = hf_state[theirs]
        state[ours] = t.t().contiguous() if transpose else t
    head = hf_state.get("lm_head.weight")
    if head is not None and not torch.equal(head, state["wte.weight"]):
        raise CheckpointError(f"{weights}: lm_head is not tied to wte; lmforge GPT ties its output layer")
    model = GPTLMHeadModel(config)
    model.load_weights(state)
    model.eval()
    if (p / "tokenizer.json").is_file():
        try:
            model.tokenizer = Tokenizer.load(p)
        except (LmforgeError, OSError, ValueError, KeyError) as e:  # keep the weights, say why
            logger.warning("import-hf: could not read the tokenizer in %s (%s); model has no tokenizer", p, e)
    return model


__all__ = ["export_hf", "import_hf", "weight_map", "hf_config_dict"]
