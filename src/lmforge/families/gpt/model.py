"""GPT: a Transformer decoder trained left to right (Radford et al. 2018, 2019).

Token + learned position embeddings, a stack of blocks with causal self-attention (SDPA with
``is_causal``), and an output layer tied to the token embedding.  ``norm_first=True`` is GPT-2
(pre-LN blocks and a final ``ln_f``); ``norm_first=False`` is GPT-1 (post-LN blocks, no final norm).

Config fields carry HF ``GPT2Config`` names so that :mod:`lmforge.families.gpt.hf` is a plain key map.
The blocks are :class:`lmforge.nn.transformer.TransformerBlock` (shared with BERT); their module
names map to HF's as ``ln_attn -> ln_1``, ``attn.qkv -> attn.c_attn``, ``ln_mlp -> ln_2``,
``mlp.fc -> mlp.c_fc`` (HF stores these as transposed ``Conv1D`` weights).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ...errors import ConfigError, LmforgeError
from ...generation import generate as generate_ids
from ...generation import generate_text
from ...models.base import ModelOutput, PretrainedModel
from ...nn.diagnostics import token_cosine
from ...nn.losses import causal_lm_loss, linear_cross_entropy, shift_labels
from ...nn.transformer import KVCache, TransformerBlock, init_weights

logger = logging.getLogger(__name__)

ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh", "gelu")  # the first two are the same tanh approximation


@dataclasses.dataclass
class GPTConfig:
    """GPT hyper-parameters (HF ``GPT2Config`` field names).

    Attributes:
        vocab_size: number of token ids (set from the tokenizer by
            :func:`lmforge.families.gpt.pretraining.setup_gpt`).
        n_positions: longest sequence the learned position embedding covers.
        n_embd: hidden size C.
        n_layer: number of Transformer blocks.
        n_head: attention heads (``n_embd`` must be divisible by it).
        n_inner: MLP width (``None`` = 4 * n_embd).
        activation_function: ``gelu_new`` (GPT-2, tanh approximation), ``gelu_pytorch_tanh`` (same) or
            ``gelu`` (exact erf, GPT-1).
        resid_pdrop, embd_pdrop, attn_pdrop: dropout after residual branches, on the embedding sum and on
            the attention probabilities.
        layer_norm_epsilon: LayerNorm epsilon.
        initializer_range: std of the normal initialisation.
        norm_first: True = GPT-2 pre-LN blocks with a final ``ln_f``; False = GPT-1 post-LN, no final norm.
        bos_token_id, eos_token_id: the end-of-text id (GPT uses one token for both); ``generate`` stops at
            ``eos_token_id``.
    """

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    activation_function: str = "gelu_new"
    resid_pdrop: float = 0.1
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    norm_first: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            if getattr(self, name) < 1:
                raise ConfigError(f"GPTConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ConfigError(f"GPTConfig: n_embd {self.n_embd} must be divisible by n_head {self.n_head}")
        if self.n_inner is not None and self.n_inner < 1:
            raise ConfigError(f"GPTConfig: n_inner must be >= 1 or null, got {self.n_inner}")
        if self.activation_function not in ACTIVATIONS:
            raise ConfigError(
                f"GPTConfig: activation_function must be one of {', '.join(ACTIVATIONS)}, "
                f"got {self.activation_function!r}"
            )
        for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"GPTConfig: {name} must be in [0, 1), got {getattr(self, name)}")
        if self.layer_norm_epsilon <= 0:
            raise ConfigError(f"GPTConfig: layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon}")
        if self.initializer_range <= 0:
            raise ConfigError(f"GPTConfig: initializer_range must be > 0, got {self.initializer_range}")
        for name in ("bos_token_id", "eos_token_id"):
            v = getattr(self, name)
            if v is not None and not 0 <= v < self.vocab_size:
                raise ConfigError(f"GPTConfig: {name} {v} is outside the vocabulary (0..{self.vocab_size - 1})")

    @property
    def inner_size(self) -> int:
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd


# -- the model -----------------------------------------------------------------------------------------
class GPTLMHeadModel(PretrainedModel):
    """GPT language model: ``wte`` + ``wpe`` -> ``h[0..L-1]`` -> (``ln_f``) -> ``lm_head`` (tied to ``wte``)."""

    config_class = GPTConfig
    model_type = "gpt"

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        C = config.n_embd
        self.wte = nn.Embedding(config.vocab_size, C)
        self.wpe = nn.Embedding(config.n_positions, C)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList(
            TransformerBlock(
                C,
                config.n_head,
                config.inner_size,
                dropout=config.resid_pdrop,
                attn_dropout=config.attn_pdrop,
                norm_first=config.norm_first,
                layer_norm_eps=config.layer_norm_epsilon,
                act=config.activation_function,
            )
            for _ in range(config.n_layer)
        )
        # GPT-1's post-LN blocks end in a LayerNorm already; GPT-2 adds one after the last pre-LN block.
        self.ln_f = nn.LayerNorm(C, eps=config.layer_norm_epsilon) if config.norm_first else nn.Identity()
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        self.reset_parameters()
        self.lm_head.weight = self.wte.weight  # tied output embedding

    def reset_parameters(self) -> None:
        """N(0, initializer_range) everywhere; residual output projections scaled by 1/sqrt(2 * n_layer).

        The scaling is GPT-2's (paper, section 2.3): each block adds two residual branches, so the
        residual stream's variance would otherwise grow with depth.
        """
        std = self.config.initializer_range
        self.apply(lambda m: init_weights(m, std))
        for block in self.h:
            for proj in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(proj.weight, mean=0.0, std=std / math.sqrt(2 * self.config.n_layer))

    def tied_weight_keys(self) -> list[str]:
        return ["lm_head.weight"]

    @property
    def hidden_size(self) -> int:
        return self.config.n_embd

    # -- body ------------------------------------------------------------------------------------------
    def _attn_mask(self, attention_mask: torch.Tensor | None, T: int, past: int) -> torch.Tensor | None:
        """Boolean (B, 1, T, past+T) SDPA mask (True = may attend), or None when plain causal attention is exact.

        Right padding (every row's ones before its zeros) needs no mask without a cache: no real token
        ever looks ahead at a pad.  Left padding (batched generation) does.  Each position may always
        attend to itself, so a pad query never has an all-masked row (which would give NaN).
        """
        if attention_mask is None:
            return None
        m = attention_mask.bool()
        if m.shape[-1] != past + T:
            raise LmforgeError(
                f"attention_mask covers {m.shape[-1]} positions but the input has {past} cached + {T} new ones"
            )
        if bool(m.all()) or (past == 0 and bool((m[:, 1:] <= m[:, :-1]).all())):
            return None
        q = torch.arange(past, past + T, device=m.device)[:, None]  # absolute query positions (T, 1)
        k = torch.arange(past + T, device=m.device)[None, :]  # (1, past+T)
        allowed = (k <= q)[None] & m[:, None, :]  # (B, T, past+T)
        allowed = allowed | (k == q)[None]
        return allowed[:, None]  # (B, 1, T, past+T)

    def body(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Run embeddings and blocks.

        Args:
            input_ids: (B, T) token ids.
            attention_mask: (B, past+T) 1 = real token, 0 = padding; covers the cached positions too.
            cache: KV cache; the new keys/values are appended to it.
            position_ids: (B, T) or (T,) positions; default ``past .. past+T-1``.
            output_hidden_states: also return the per-layer states.
        Returns:
            ``(x, states)``: x (B, T, C) after the final norm; states the embedding output and each block's
            output (the last one after ``ln_f``), or None.
        """
        B, T = input_ids.shape
        past = cache.length if cache is not None else 0
        if past + T > self.config.n_positions:
            raise LmforgeError(
                f"sequence of {past + T} tokens is longer than the model's n_positions={self.config.n_positions}; "
                "shorten the input"
            )
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=input_ids.device)  # (T,)
        x = self.drop(self.wte(input_ids) + self.wpe(position_ids))  # (B, T, C)
        mask = self._attn_mask(attention_mask, T, past)
        states = [x] if output_hidden_states else None
        for i, block in enumerate(self.h):
            x = block(x, mask, causal=mask is None, cache=cache, layer_idx=i)
            if states is not None:
                states.append(x)
        x = self.ln_f(x)
        if states is not None:
            states[-1] = x
        return x, states

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cache: KVCache | None = None,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        return_logits: bool = False,
    ) -> ModelOutput:
        """Next-token prediction.

        Args:
            input_ids: (B, T) token ids.
            attention_mask: (B, past+T) 1/0 padding mask, optional.
            labels: (B, T) targets aligned with ``input_ids`` (HF convention: the model shifts them, so
                position t is scored on ``labels[:, t+1]``); -100 is ignored.
            cache: optional :class:`KVCache` for incremental decoding.
            position_ids: optional positions, see :meth:`body`.
            output_hidden_states: fill ``hidden_states``.
            return_logits: with labels, also compute the logits.  By default a labelled call returns only the
                loss, computed by :func:`linear_cross_entropy` without ever holding the (B, T, V) logits
                (training never needs them, and they are the LM head's main memory traffic).
        Returns:
            ModelOutput with ``logits`` (B, T, V) (None for a labelled call unless ``return_logits``) and,
            with labels, ``loss`` = mean next-token cross-entropy; in eval mode with labels also ``metrics``
            ``token_cos``, the top layer's collapse measure (:func:`lmforge.nn.diagnostics.token_cosine`).
        """
        x, states = self.body(input_ids, attention_mask, cache, position_ids, output_hidden_states)
        loss = logits = None
        if labels is not None and not return_logits:
            B, T, C = x.shape
            loss = linear_cross_entropy(x.reshape(B * T, C), self.lm_head.weight, shift_labels(labels).reshape(B * T))
        else:
            logits = self.lm_head(x)  # (B, T, V)
            if labels is not None:
                loss = causal_lm_loss(logits, labels)
        metrics = {}
        if labels is not None and not self.training and cache is None:  # validation: the collapse diagnostic
            metrics["token_cos"] = token_cosine(x, attention_mask)
        return ModelOutput(loss=loss, logits=logits, metrics=metrics,
                           hidden_states=tuple(states) if states is not None else None)

    # -- the body interface (models.base.TransferBody) ------------------------------------------------
    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Every layer's (B, T, C) states, lowest first: the embedding sum, then each block (the top one after
        ``ln_f``).  ``token_type_ids`` is accepted for interface parity and ignored (GPT has no segments)."""
        _, states = self.body(input_ids, attention_mask, output_hidden_states=True)
        return states

    def transfer_layers(self) -> list[nn.Module]:
        """The body from the bottom: the embeddings, then each block (the last one together with ``ln_f``)."""
        parts: list[nn.Module] = [nn.ModuleList([self.wte, self.wpe])]
        parts += list(self.h[:-1])
        parts.append(nn.ModuleList([self.h[-1], self.ln_f]))
        return parts

    # embed (part of TransferBody) is the shared one (lmforge.models.base.PretrainedModel.embed): a causal
    # model's token takes its vectors from the window with the most tokens before it
    embed_causal = True

    def embed_window(self) -> int:
        return self.config.n_positions

    def layer_names(self) -> list[str]:
        return ["emb"] + [f"layer{i + 1}" for i in range(self.config.n_layer)]

    # -- generation ----------------------------------------------------------------------------------
    def resize_token_embeddings(self, new_size: int) -> None:
        """Grow the vocabulary to ``new_size`` rows; existing rows stay as they are, new rows get N(0, std).

        The output layer stays tied, so it grows with the embedding.
        """
        old = self.wte
        V, C = old.weight.shape
        if new_size < V:
            raise LmforgeError(f"cannot shrink the vocabulary from {V} to {new_size}")
        if new_size == V:
            return
        wte = nn.Embedding(new_size, C, device=old.weight.device, dtype=old.weight.dtype)
        with torch.no_grad():
            nn.init.normal_(wte.weight, mean=0.0, std=self.config.initializer_range)
            wte.weight[:V] = old.weight
        self.wte = wte
        self.lm_head = nn.Linear(C, new_size, bias=False, device=old.weight.device, dtype=old.weight.dtype)
        self.lm_head.weight = self.wte.weight
        self.config = dataclasses.replace(self.config, vocab_size=new_size)

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor | str | Sequence[str],
        max_new_tokens: int = 50,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | None = -1,
        stop_strings: list[str] | None = None,
        seed: int | None = None,
        streamer: Callable[[torch.Tensor], None] | None = None,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool = True,
        output_logits: bool = False,
    ):
        """Continue ``input_ids``; see :func:`lmforge.generation.generate` for the arguments.

        ``input_ids`` may be a prompt string, or a list of them, as ``fill_mask`` and ``encode`` take text: each is
        encoded with the model's tokenizer and continued as :func:`lmforge.generation.generate_text` does
        (``stop_strings`` cut from the text). ``eos_token_id`` defaults (-1) to the config's end-of-text id; None
        never stops at a token.

        Returns:
            (B, T + n) token ids; with ``output_logits`` the pair ``(ids, logits (B, n, V))``.  A string prompt
            gives the generated text (without the prompt), a list of prompts a list of texts.
        """
        if isinstance(input_ids, str) or (isinstance(input_ids, (list, tuple)) and input_ids
                                          and all(isinstance(p, str) for p in input_ids)):
            if streamer is not None or attention_mask is not None or output_logits or eos_token_id != -1:
                raise TypeError("streamer, attention_mask, output_logits and eos_token_id are for token ids; a text "
                                "prompt stops at the end-of-text token and at stop_strings")
            prompts = [input_ids] if isinstance(input_ids, str) else list(input_ids)
            texts = [generate_text(self, p, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                   top_p=top_p, stop=stop_strings, seed=seed, use_cache=use_cache) for p in prompts]
            return texts[0] if isinstance(input_ids, str) else texts
        return generate_ids(
            self,
            input_ids,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            eos_token_id=self.config.eos_token_id if eos_token_id == -1 else eos_token_id,
            stop_strings=stop_strings,
            seed=seed,
            streamer=streamer,
            attention_mask=attention_mask,
            use_cache=use_cache,
            output_logits=output_logits,
        )


__all__ = [
    "GPTConfig",
    "GPTLMHeadModel",
]
