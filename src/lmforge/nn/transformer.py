"""Multi-head self-attention over SDPA and the Transformer block shared by BERT and GPT.

Names are generic (``attn.qkv``, ``attn.proj``, ``mlp.fc``, ``mlp.proj``, ``ln_attn``, ``ln_mlp``);
each family's interop module maps them to HF names with one explicit dict.  Q, K and V are one
fused ``Linear`` because one (C -> 3C) matmul is faster than three (C -> C) ones on CPU.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return F.gelu(x, approximate=approximate)


_ONEDNN_LINEAR = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
_CPU_AMX = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
# bf16 attention on a CPU without AMX: up to this many scores (B * heads * T * T_total; 64 MB in fp32) the
# plain form (bf16 matmuls, fp32 softmax) runs ~1.9x faster than SDPA in fp32; above it, SDPA's flash
# kernel in fp32, which never holds the scores
_SMALL_SCORES = 1 << 24


def _cpu_autocast() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled()


def _use_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        _ONEDNN_LINEAR is not None
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.numel() >= 64 * x.shape[-1]  # tiny inputs (one decoding step) gain nothing
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and not _cpu_autocast()
        and torch.backends.mkldnn.is_available()
    )


def _use_onednn_autograd(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Training-time twin of :func:`_use_onednn`: fp32 CPU with autograd (GPT engineer's addition)."""
    return (
        _ONEDNN_LINEAR is not None
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.numel() >= 64 * x.shape[-1]
        and torch.is_grad_enabled()
        and (x.requires_grad or weight.requires_grad)
        and not _cpu_autocast()
        and torch.backends.mkldnn.is_available()
    )


class _OneDNNLinear(torch.autograd.Function):
    """``F.linear`` whose three matmuls (forward, input grad, weight grad) run on oneDNN (fp32 CPU).

    The same 2x over MKL as the no-grad path, for training: grad_input = grad @ W and
    grad_weight = grad.T @ x are oneDNN linears too (on transposed views; no activation copies).
    """

    @staticmethod
    def forward(ctx, x, weight, bias):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (N, C_in)
        y = _ONEDNN_LINEAR(x2, weight, bias, "none", [], "")  # (N, C_out)
        ctx.save_for_backward(x2, weight)
        ctx.in_shape = shape
        ctx.has_bias = bias is not None
        return y.view(*shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])  # (N, C_out)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _ONEDNN_LINEAR(g2, weight.t().contiguous(), None, "none", [], "").view(ctx.in_shape)
        if ctx.needs_input_grad[1]:
            gw = _ONEDNN_LINEAR(g2.t(), x2.t(), None, "none", [], "")  # (C_out, C_in) = grad.T @ x
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, act: str | None = None
) -> torch.Tensor:
    """``F.linear`` (then GELU when ``act`` is ``"gelu"`` or ``"gelu_tanh"``), faster on CPU without autograd.

    Without gradients, fp32 on CPU goes through oneDNN's linear with the GELU fused in (the kernel
    ``torch.compile`` uses).  On the AMD EPYC machines of this project PyTorch's default fp32 GEMM
    (MKL) runs 2-3x below oneDNN.  Results agree with ``F.linear`` to float rounding (~1e-6).
    Training (autograd), autocast and other devices use plain ``F.linear``.

    Args:
        x: (..., C_in); weight: (C_out, C_in); bias: (C_out,) or None.
    Returns:
        (..., C_out).
    """
    if _use_onednn(x, weight):
        try:
            if act is None:
                return _ONEDNN_LINEAR(x, weight, bias, "none", [], "")
            return _ONEDNN_LINEAR(x, weight, bias, "gelu", [], "tanh" if act == "gelu_tanh" else "none")
        except RuntimeError:  # pragma: no cover - a build without the kernel: fall through
            pass
    if _use_onednn_autograd(x, weight):
        y = _OneDNNLinear.apply(x, weight, bias)
    else:
        y = F.linear(x, weight, bias)
    if act is None:
        return y
    return F.gelu(y, approximate="tanh" if act == "gelu_tanh" else "none")


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state-dict names) that calls :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout: zero each element with probability ``p``, scale the rest by 1 / (1 - p).

    On CPU, ``F.dropout`` draws one Bernoulli sample per element (~20 ns each), which made dropout
    ~15 % of a BERT training step and more than the whole attention softmax.  Here one 64-bit draw
    of the (seeded, global) generator gives four 16-bit uniforms, ~10x faster; ``p`` is rounded to a
    multiple of 1/65536.  Other devices use ``F.dropout`` (already fused there).
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, True)
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
    r = words.view(torch.int16)[:n].view(x.shape)  # uniform on [-32768, 32767]
    keep = r >= round(p * 65536) - 32768
    return x * keep * (1.0 / (1.0 - p))


class Dropout(nn.Module):
    """``nn.Dropout`` with the fast CPU mask of :func:`dropout` (no parameters, no state)."""

    def __init__(self, p: float = 0.1):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with the same arguments and result.

    SDPA's fused CPU kernels do not take dropout, so with attention dropout on CPU it falls back to
    its math path with the slow Bernoulli dropout; that case is spelled out here with :func:`dropout`.
    bf16/fp16 on a CPU without AMX, where SDPA's low-precision kernels run at half their fp32 speed:
    two bf16 matmuls around an fp32 softmax while the scores are small (``_SMALL_SCORES``), else SDPA
    in fp32 on upcast inputs; the result is in the inputs' dtype either way.

    Args:
        q: (B, nh, T, hs); k, v: (B, nh, T_total, hs).
        attn_mask: boolean, broadcastable to (B, nh, T, T_total), True = may attend.
    Returns:
        (B, nh, T, hs).
    """
    low = q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and not _CPU_AMX
    if low and q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] > _SMALL_SCORES:
        # without AMX, SDPA's CPU kernels run ~2x slower in bf16 than in fp32 (GPT engineer's addition)
        with torch.autocast("cpu", enabled=False):  # else autocast would cast q, k, v straight back
            y = attention(q.float(), k.float(), v.float(), attn_mask, is_causal, dropout_p)
        return y.to(q.dtype)
    if not low and (dropout_p == 0.0 or q.device.type != "cpu"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
    T, S = q.shape[-2], k.shape[-2]
    att = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # (B, nh, T, T_total)
    if is_causal:
        tri = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
        attn_mask = tri if attn_mask is None else (attn_mask & tri)
    if attn_mask is not None:
        att = att.masked_fill(~attn_mask, float("-inf"))
    att = dropout(att.softmax(dim=-1, dtype=torch.float32).to(q.dtype), dropout_p, True)  # softmax in fp32
    return att @ v  # (B, nh, T, hs)


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
    """Multi-head self-attention (causal or bidirectional) via ``scaled_dot_product_attention``."""

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


def padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) 1/0 padding mask -> (B, 1, 1, T) boolean SDPA mask (True = attend), or None if no padding."""
    if attention_mask is None:
        return None
    if bool(attention_mask.all()):
        return None  # no padding: let SDPA pick its fastest kernel
    return attention_mask.bool()[:, None, None, :]


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
    "init_weights",
    "Dropout",
    "dropout",
    "attention",
    "Linear",
    "linear",
]
