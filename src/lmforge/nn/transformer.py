"""Multi-head self-attention and the Transformer block shared by BERT and GPT.

Names are generic (``attn.qkv``, ``attn.proj``, ``mlp.fc``, ``mlp.proj``, ``ln_attn``, ``ln_mlp``);
each family's interop module maps them to HF names with one explicit dict.  Q, K and V are one
fused ``Linear`` because one (C -> 3C) matmul is faster than three (C -> C) ones on CPU.  The
linear, dropout and attention kernels come from :mod:`lmforge.nn.cpu_ops` (each a drop-in for
its PyTorch counterpart, faster on CPU).
"""

from __future__ import annotations

import torch
from torch import nn

from .cpu_ops import Dropout, Linear, attention, linear


class KVCache:
    """Keys and values of earlier positions, one (B, nh, T_past, hs) pair per layer."""

    def __init__(self, n_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layers
        self.values: list[torch.Tensor | None] = [None] * n_layers

    @property
    def length(self) -> int:
        """Positions cached so far (read between forward calls)."""
        k = self.keys[-1]
        return 0 if k is None else k.shape[2]

    def layer_length(self, layer: int) -> int:
        """Positions cached for ``layer``; inside a forward, lower layers have already been extended."""
        k = self.keys[layer]
        return 0 if k is None else k.shape[2]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class SelfAttention(nn.Module):
    """Multi-head self-attention (causal or bidirectional) via :func:`~lmforge.nn.cpu_ops.attention` (SDPA)."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.qkv = Linear(hidden_size, 3 * hidden_size, bias=bias)
        self.proj = Linear(hidden_size, hidden_size, bias=bias)
        self.dropout = dropout
        self.resid_dropout = Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        layer_idx: int = 0,
    ) -> torch.Tensor:
        """Args:
            x: (B, T, C) input.
            attn_mask: boolean (B, 1, 1|T, T_total) mask, True = may attend; or None.
            causal: mask out future positions (GPT).
            cache: KV cache for incremental decoding; new keys/values are appended to it.
        Returns:
            (B, T, C) output.
        """
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.num_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.num_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.num_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        past = 0
        if cache is not None:
            past = cache.layer_length(layer_idx)
            k, v = cache.update(layer_idx, k, v)  # (B, nh, past+T, hs)
        drop = self.dropout if self.training else 0.0
        if causal and attn_mask is None and past == 0:
            y = attention(q, k, v, dropout_p=drop, is_causal=True)
        else:
            mask = attn_mask
            if causal and T > 1:
                # query i sits at absolute position past+i and may see keys 0..past+i
                total = past + T
                tri = torch.ones(T, total, dtype=torch.bool, device=x.device).tril(diagonal=past)
                mask = tri if mask is None else (mask & tri)
            y = attention(q, k, v, attn_mask=mask, dropout_p=drop)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.proj(y))

    def forward_at(self, x: torch.Tensor, xq: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Bidirectional attention computed for some query positions only; keys and values from all of ``x``.

        The rows of ``qkv`` split into the queries' (C -> C, on the ``Tq`` rows of ``xq``) and the keys' and
        values' (C -> 2C, on every row of ``x``); each output row equals :meth:`forward`'s at that position.

        Args:
            x: (B, T, C) input of every position; xq: (B, Tq, C) the rows of ``x`` at the query positions.
            attn_mask: boolean, broadcastable to (B, 1, Tq, T), True = may attend; or None.
        Returns:
            (B, Tq, C) output at the query positions.
        """
        B, T, C = x.shape
        Tq = xq.shape[1]
        w, b = self.qkv.weight, self.qkv.bias
        q = linear(xq, w[:C], None if b is None else b[:C])  # (B, Tq, C)
        k, v = linear(x, w[C:], None if b is None else b[C:]).split(C, dim=2)  # (B, T, C) each
        q = q.view(B, Tq, self.num_heads, self.head_size).transpose(1, 2)  # (B, nh, Tq, hs)
        k = k.view(B, T, self.num_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.num_heads, self.head_size).transpose(1, 2)  # (B, nh, T, hs)
        y = attention(q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, Tq, C)  # (B, Tq, C)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, dropout: float = 0.0, act: str = "gelu"):
        super().__init__()
        self.fc = Linear(hidden_size, intermediate_size)
        self.proj = Linear(intermediate_size, hidden_size)
        self.approximate = "tanh" if act in ("gelu_new", "gelu_tanh", "gelu_pytorch_tanh") else "none"
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = "gelu_tanh" if self.approximate == "tanh" else "gelu"
        return self.dropout(self.proj(linear(x, self.fc.weight, self.fc.bias, act)))


class TransformerBlock(nn.Module):
    """Attention + MLP with residuals; post-LN (BERT, GPT-1) or pre-LN (GPT-2) by ``norm_first``."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        intermediate_size: int,
        dropout: float = 0.1,
        attn_dropout: float = 0.1,
        norm_first: bool = False,
        layer_norm_eps: float = 1e-12,
        act: str = "gelu",
    ):
        super().__init__()
        self.norm_first = norm_first
        self.attn = SelfAttention(hidden_size, num_heads, attn_dropout)
        self.attn.resid_dropout = Dropout(dropout)
        self.ln_attn = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.mlp = MLP(hidden_size, intermediate_size, dropout, act)
        self.ln_mlp = nn.LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
        layer_idx: int = 0,
    ) -> torch.Tensor:
        if self.norm_first:
            x = x + self.attn(self.ln_attn(x), attn_mask, causal, cache, layer_idx)
            x = x + self.mlp(self.ln_mlp(x))
        else:
            x = self.ln_attn(x + self.attn(x, attn_mask, causal, cache, layer_idx))
            x = self.ln_mlp(x + self.mlp(x))
        return x

    def forward_at(self, x: torch.Tensor, index: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The block's (bidirectional) output at some positions only: ``forward(x)`` gathered at ``index``.

        Every position still gives its key and value; the queries, the attention output, the residuals and
        the MLP run on the ``Tq`` chosen rows alone.  A top layer whose output is read at a few positions
        (BERT's masked tokens) costs a fraction of a full layer this way.

        Args:
            x: (B, T, C) input; index: (B, Tq) positions to compute in each row (any order, repeats allowed).
            attn_mask: boolean (B, 1, 1|T, T) mask, True = may attend; or None.
        Returns:
            (B, Tq, C), row ``j`` of batch row ``b`` being ``forward(x)[b, index[b, j]]``.
        """
        B, T, C = x.shape
        flat = (index + torch.arange(B, device=index.device)[:, None] * T).reshape(-1)  # (B * Tq,)

        def pick(t: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, Tq, C)
            return t.reshape(B * T, C).index_select(0, flat).view(B, -1, C)

        if attn_mask is not None and attn_mask.shape[-2] != 1:  # a mask per query: keep the chosen rows
            attn_mask = attn_mask.gather(2, index[:, None, :, None].expand(-1, attn_mask.shape[1], -1, T))
        if self.norm_first:
            h = self.ln_attn(x)
            x = pick(x) + self.attn.forward_at(h, pick(h), attn_mask)
            return x + self.mlp(self.ln_mlp(x))
        x = self.ln_attn(pick(x) + self.attn.forward_at(x, pick(x), attn_mask))
        return self.ln_mlp(x + self.mlp(x))


def padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) 1/0 padding mask -> (B, 1, 1, T) boolean SDPA mask (True = attend), or None if no padding."""
    if attention_mask is None:
        return None
    if bool(attention_mask.all()):
        return None  # no padding: let SDPA pick its fastest kernel
    return attention_mask.bool()[:, None, None, :]


def document_mask(document_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows packed with several documents -> their SDPA mask and positions.

    Args:
        document_ids: (B, T) 1, 2, ... for the documents of a row (each a contiguous run), 0 for padding.
    Returns:
        ``(mask, positions)``: a (B, 1, T, T) boolean mask that keeps attention inside each document
        (a padding position attends to itself only) and (B, T) positions that restart in each
        document: the first from 0, later ones from 1 (the first holds the row's leading token).
    """
    d = document_ids
    t = torch.arange(d.shape[1], device=d.device).expand_as(d)
    starts = torch.ones_like(d, dtype=torch.bool)
    starts[:, 1:] = d[:, 1:] != d[:, :-1]
    first = torch.cummax(torch.where(starts, t, torch.zeros_like(t)), dim=1).values
    positions = t - first + (d > 1).long()
    mask = (d[:, :, None] == d[:, None, :]) & (d[:, None, :] > 0)
    mask |= torch.eye(d.shape[1], dtype=torch.bool, device=d.device)
    return mask[:, None], positions


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT/GPT initialisation: N(0, std) for Linear/Embedding, ones/zeros for LayerNorm."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


__all__ = [
    "SelfAttention",
    "MLP",
    "TransformerBlock",
    "KVCache",
    "padding_mask",
    "document_mask",
    "init_weights",
]
