"""CPU kernels behind the Transformer layers: linear, dropout and attention dispatch.

Every function here computes exactly what a plain PyTorch call computes (named in its docstring) and
falls back to that call wherever its faster route does not apply.  The routes exist because lmforge
trains on CPUs, where PyTorch's defaults leave a lot of speed unused:

* :func:`linear` - fp32 on CPU goes through oneDNN's linear kernel
  (``torch.ops.mkldnn._linear_pointwise``, the one ``torch.compile`` uses) with GELU fused in; with
  autograd, :class:`_OneDNNLinear` runs all three matmuls of a linear layer on it.  On AMD EPYC CPUs
  PyTorch's default fp32 GEMM (MKL) runs 2-3x below oneDNN.  Fallback: ``F.linear`` (+ ``F.gelu``).
* :func:`dropout` - one 64-bit random draw gives four 16-bit uniforms, ~10x faster than ``F.dropout``'s
  per-element Bernoulli draw on CPU.  Fallback: ``F.dropout`` (other devices, ``p >= 1``).
* :func:`attention` - SDPA, except where SDPA's CPU kernels are slow: dropout (SDPA falls back to its
  math path with the slow Bernoulli dropout) and bf16 without AMX.  Fallback: SDPA.
* :func:`matmul_t` - ``a @ b.T`` on oneDNN, for the LM-head loss.  Fallback: ``a @ b.t()``.

The oneDNN op is a private PyTorch operator, so it sits behind one switch: the environment variable
``LMFORGE_ONEDNN=0`` (read at import) or :func:`set_onednn` turns every oneDNN route off, and the code
runs on public PyTorch calls only.  ``tests/test_cpu_ops.py`` checks each route against its fallback.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn

ONEDNN_ENV = "LMFORGE_ONEDNN"
_ONEDNN_OP = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
# the one switch: None = every oneDNN route is off (set from LMFORGE_ONEDNN at import, or by set_onednn)
_ONEDNN_LINEAR = _ONEDNN_OP if os.environ.get(ONEDNN_ENV, "1") != "0" else None
_CPU_AMX = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
# bf16 attention on a CPU without AMX: up to this many scores (B * heads * T * T_total; 64 MB in fp32) the
# plain form (bf16 matmuls, fp32 softmax) runs ~1.9x faster than SDPA in fp32; above it, SDPA's flash
# kernel in fp32, which never holds the scores
_SMALL_SCORES = 1 << 24


def set_onednn(enabled: bool) -> None:
    """Turn the oneDNN routes on (where this PyTorch build has the kernel) or off, for this process."""
    global _ONEDNN_LINEAR
    _ONEDNN_LINEAR = _ONEDNN_OP if enabled else None


def onednn_enabled() -> bool:
    """Whether :func:`linear` and :func:`matmul_t` may use oneDNN's linear kernel."""
    return _ONEDNN_LINEAR is not None and torch.backends.mkldnn.is_available()


def _cpu_autocast() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled()


def _onednn_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """fp32 on CPU, not under autocast, and enough rows to gain (one decoding step gains nothing)."""
    return (
        _ONEDNN_LINEAR is not None
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.numel() >= 64 * x.shape[-1]
        and not _cpu_autocast()
        and torch.backends.mkldnn.is_available()
    )


def _needs_grad(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)


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
    """``F.linear`` (then GELU when ``act`` is ``"gelu"`` or ``"gelu_tanh"``), on oneDNN for fp32 CPU.

    Without gradients the GELU is fused into oneDNN's kernel; with autograd the linear runs as
    :class:`_OneDNNLinear` and the GELU is ``F.gelu``.  Results agree with ``F.linear`` to float rounding
    (~1e-6).  Fallback (autocast, other devices and dtypes, tiny inputs, the switch off): ``F.linear``.

    Args:
        x: (..., C_in); weight: (C_out, C_in); bias: (C_out,) or None.
    Returns:
        (..., C_out).
    """
    fits = _onednn_fits(x, weight)
    if fits and not _needs_grad(x, weight):
        try:
            if act is None:
                return _ONEDNN_LINEAR(x, weight, bias, "none", [], "")
            return _ONEDNN_LINEAR(x, weight, bias, "gelu", [], "tanh" if act == "gelu_tanh" else "none")
        except RuntimeError:  # pragma: no cover - a build without the kernel: fall through
            pass
    if fits and _needs_grad(x, weight):
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


def matmul_t(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` for 2-D tensors; fp32 or bf16 on CPU through oneDNN (~2x MKL's fp32 GEMM on AMD CPUs).

    No autograd (the caller computes its own gradients).  Fallback: ``a @ b.t()``.
    """
    if (
        _ONEDNN_LINEAR is not None
        and a.device.type == "cpu"
        and a.dtype == b.dtype
        and a.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
    ):
        try:
            return _ONEDNN_LINEAR(a, b, None, "none", [], "")
        except RuntimeError:  # pragma: no cover - a build without the kernel
            pass
    return a @ b.t()


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout: zero each element with probability ``p``, scale the rest by 1 / (1 - p).

    On CPU, ``F.dropout`` draws one Bernoulli sample per element (~20 ns each), which made dropout
    ~15 % of a BERT training step and more than the whole attention softmax.  Here one 64-bit draw
    of the (seeded, global) generator gives four 16-bit uniforms, ~10x faster; ``p`` is rounded to a
    multiple of 1/65536.  Fallback (other devices, ``p >= 1``): ``F.dropout``, same distribution,
    other random numbers.
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
    bf16/fp16 on a CPU without AMX, where SDPA's low-precision kernels run ~2x slower than in fp32:
    two bf16 matmuls around an fp32 softmax while the scores are small (``_SMALL_SCORES``), else SDPA
    in fp32 on upcast inputs; the result is in the inputs' dtype either way.  Fallback: SDPA.

    Args:
        q: (B, nh, T, hs); k, v: (B, nh, T_total, hs).
        attn_mask: boolean, broadcastable to (B, nh, T, T_total), True = may attend.
    Returns:
        (B, nh, T, hs).
    """
    low = q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and not _CPU_AMX
    if low and q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] > _SMALL_SCORES:
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


__all__ = [
    "ONEDNN_ENV",
    "set_onednn",
    "onednn_enabled",
    "linear",
    "Linear",
    "matmul_t",
    "dropout",
    "Dropout",
    "attention",
]
