"""CPU kernels behind the Transformer layers: linear, dropout and attention dispatch.

Every function here computes exactly what a plain PyTorch call computes (named in its docstring) and
falls back to that call wherever its faster route does not apply or does not win on this machine:

* :func:`linear` - fp32 on CPU may go through oneDNN's linear kernel
  (``torch.ops.mkldnn._linear_pointwise``, the one ``torch.compile`` uses) with GELU fused in; with
  autograd, :class:`_OneDNNLinear` runs all three matmuls of a linear layer on it.  Whether it wins
  depends on the CPU: on some (an AMD EPYC) PyTorch's default fp32 GEMM (MKL) runs well below oneDNN, on
  others (an Intel Xeon with AMX) MKL is the faster one for training.  So the route is chosen by measurement
  (:mod:`lmforge.nn.autotune`): per kind of call (training, inference, inference with GELU) and shape,
  both are timed the first time on a machine and the answer is cached.  Fallback: ``F.linear`` (+ ``F.gelu``).
* :func:`matmul_t` - ``a @ b.T`` on oneDNN for the LM-head loss, chosen the same way.
* :func:`dropout` - one 64-bit random draw gives four 16-bit uniforms, cheaper than ``F.dropout``'s
  Bernoulli draw per element (``bench/bench_kernels.py`` times both).  A rule rather than a probe: the
  two draw other random numbers, and a run's dropout masks must not depend on a timing.  Fallback:
  ``F.dropout`` (other devices, ``p >= 1``).
* :func:`attention` - SDPA, except with dropout on CPU (SDPA's fused CPU kernels take none: its math
  path with the per-element Bernoulli draw is slower than the spelled-out form) and bf16 on a CPU
  without AMX (SDPA's bf16 kernels there run below fp32).  Rules, for the same reason as dropout.
  Fallback: SDPA.

Not every oneDNN kernel runs on every CPU (a bf16 one needs AVX-512 or better): each oneDNN route is tried
once per kind of call and shape before it is taken, and where oneDNN cannot build it, PyTorch's own kernel
computes that shape (:mod:`lmforge.nn.cpu_features`, which also answers the AMX rule and honours
``LMFORGE_CPU_FEATURES=avx2``, the routes of a CPU with AVX2 only on any machine).

The oneDNN op is a private PyTorch operator, so it sits behind one switch: the environment variable
``LMFORGE_ONEDNN`` (read at import) or :func:`set_onednn`: ``0`` turns every oneDNN route off (public
PyTorch calls only), ``1`` takes it wherever it applies, ``auto`` (the default) where it measured faster.
``tests/test_cpu_ops.py`` checks each route against its fallback; ``bench/bench_kernels.py`` times them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import autotune, cpu_features

ONEDNN_ENV = "LMFORGE_ONEDNN"
ONEDNN_MODES = ("auto", "on", "off")
_ONEDNN_OP = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)


def _mode_from_env() -> str:
    value = os.environ.get(ONEDNN_ENV, "auto").strip().lower()
    return {"0": "off", "off": "off", "false": "off", "1": "on", "on": "on", "true": "on"}.get(value, "auto")


# the one switch: "off" = every oneDNN route is off, "on" = taken wherever it applies, "auto" = where it
# measured faster on this machine (set from LMFORGE_ONEDNN at import, or by set_onednn)
_ONEDNN_MODE = _mode_from_env()
_ONEDNN_LINEAR = _ONEDNN_OP if _ONEDNN_MODE != "off" else None
_ROUTES: dict[str, bool] = {}  # question -> oneDNN or not, this process's answers (auto mode)
# auto takes oneDNN's private operator only where it measured this much faster than the public call: a
# measurement on a shared machine is noisy, and a near tie is not worth leaving the public API for
ONEDNN_MARGIN = 1.2
# bf16 attention on a CPU without AMX: up to this many scores (B * heads * T * T_total; 64 MB in fp32) the
# plain form (bf16 matmuls, fp32 softmax) beats SDPA in fp32 (docs/gpt.md, speed); above it, SDPA's flash
# kernel in fp32, which never holds the scores
_SMALL_SCORES = 1 << 24


def set_onednn(enabled: bool | str | None) -> None:
    """The oneDNN routes for this process: ``True``/``"on"``, ``False``/``"off"``, or ``None``/``"auto"``
    (taken where they measure faster on this machine)."""
    global _ONEDNN_LINEAR, _ONEDNN_MODE
    mode = {True: "on", False: "off", None: "auto"}.get(enabled, enabled) if not isinstance(enabled, str) else enabled
    if mode not in ONEDNN_MODES:
        raise ValueError(f"oneDNN mode must be one of {', '.join(ONEDNN_MODES)}, got {enabled!r}")
    _ONEDNN_MODE = mode
    _ONEDNN_LINEAR = _ONEDNN_OP if mode != "off" else None
    _ROUTES.clear()


def onednn_mode() -> str:
    """``auto``, ``on`` or ``off``: how :func:`linear` and :func:`matmul_t` choose oneDNN's kernel."""
    return _ONEDNN_MODE if onednn_enabled() else "off"


def onednn_enabled() -> bool:
    """Whether :func:`linear` and :func:`matmul_t` may use oneDNN's linear kernel (``on`` or ``auto``)."""
    return _ONEDNN_LINEAR is not None and torch.backends.mkldnn.is_available()


def chosen_routes() -> dict[str, str]:
    """The routes measured (or read from the cache) so far in this process: question -> ``onednn``/``torch``."""
    return {q: "onednn" if v else "torch" for q, v in sorted(_ROUTES.items())}


def describe_routes() -> str:
    """One line naming every route's setting, for benches and run logs."""
    lin = {"auto": "by measurement on this machine", "on": "on wherever it applies", "off": "off"}[onednn_mode()]
    bf16 = "" if cpu_features.onednn_bf16() else ", fp32 only (no oneDNN bf16)"
    amx = "" if cpu_features.amx() else " and for bf16 (no AMX)"
    return (f"oneDNN linear: {lin}{bf16} ({ONEDNN_ENV}={os.environ.get(ONEDNN_ENV, 'auto')}); fast dropout: CPU; "
            f"attention: SDPA, spelled out with dropout on CPU{amx}; LM loss: chunked (nn.losses); "
            f"{cpu_features.describe()}")


def _prefer_onednn(question: str, fast: Callable[[], object], plain: Callable[[], object]) -> bool:
    """Whether to take oneDNN for ``question``: never where its kernel does not run on this CPU (tried once,
    :func:`lmforge.nn.cpu_features.runs`), else as the switch says, or by a cached measurement (auto)."""
    hit = _ROUTES.get(question)
    if hit is None:
        with torch.random.fork_rng(devices=[]):  # probing and timing draw no random number a run would see
            if not cpu_features.runs(question, fast):
                hit = False
            elif _ONEDNN_MODE == "on":
                hit = True
            else:
                hit = autotune.choose(question, {"onednn": fast, "torch": plain}, default="torch", reps=4,
                                      margin=ONEDNN_MARGIN) == "onednn"
        _ROUTES[question] = hit
    return hit


def _question(kind: str, shape: str) -> str:
    """A route's cache key: the kind of call, its shape and the thread count (the answer depends on all three)."""
    return f"{kind}:{shape}:t{torch.get_num_threads()}"


def _rows_bucket(n: int) -> int:
    """Rows rounded down to a power of two: one measurement serves a range of batch shapes."""
    return 1 << max(n, 1).bit_length() - 1


def _cpu_autocast() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled()


def compiling() -> bool:
    """Whether ``torch.compile`` is tracing: the routes here step aside for inductor's own kernels (which use
    the same oneDNN linear where it pays) and no timing runs inside a graph."""
    try:
        return bool(torch.compiler.is_compiling())
    except AttributeError:  # pragma: no cover - torch < 2.3
        return False


def _onednn_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """fp32 on CPU, not under autocast, and enough rows to gain (one decoding step gains nothing)."""
    return (
        _ONEDNN_LINEAR is not None
        and not compiling()
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

    grad_input = grad @ W and grad_weight = grad.T @ x are oneDNN linears too (on transposed views; no
    activation copies).
    """

    @staticmethod
    def forward(ctx, x, weight, bias):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # (N, C_in)
        y = _ONEDNN_OP(x2, weight, bias, "none", [], "")  # (N, C_out)
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
            gx = _ONEDNN_OP(g2, weight.t().contiguous(), None, "none", [], "").view(ctx.in_shape)
        if ctx.needs_input_grad[1]:
            gw = _ONEDNN_OP(g2.t(), x2.t(), None, "none", [], "")  # (C_out, C_in) = grad.T @ x
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


def _gelu_name(act: str) -> str:
    return "tanh" if act == "gelu_tanh" else "none"


def _train_route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Training: whether oneDNN's forward and two gradient matmuls beat ``F.linear``'s at this shape."""
    rows = x.numel() // x.shape[-1]
    question = _question("linear:train", f"{_rows_bucket(rows)}x{weight.shape[1]}x{weight.shape[0]}"
                                         f"{'' if bias is None else '+b'}")
    if question in _ROUTES:
        return _ROUTES[question]
    # timed on detached copies of the real inputs, with a gradient of ones: the same shapes as the layer
    xs = x.detach().reshape(rows, x.shape[-1]).requires_grad_()
    ws = weight.detach().requires_grad_()
    bs = None if bias is None else bias.detach().requires_grad_()
    g = torch.ones(rows, weight.shape[0])

    def fast():
        _OneDNNLinear.apply(xs, ws, bs).backward(g)

    def plain():
        F.linear(xs, ws, bs).backward(g)

    with torch.enable_grad():
        return _prefer_onednn(question, fast, plain)


def _infer_route(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str | None) -> bool:
    """No gradients: whether oneDNN's linear (GELU fused) beats ``F.linear`` (then ``F.gelu``) at this shape."""
    rows = x.numel() // x.shape[-1]
    question = _question(f"linear:infer{'' if act is None else '+' + act}",
                         f"{_rows_bucket(rows)}x{weight.shape[1]}x{weight.shape[0]}{'' if bias is None else '+b'}")
    fused = ("none", [], "") if act is None else ("gelu", [], _gelu_name(act))
    return _prefer_onednn(
        question,
        lambda: _ONEDNN_OP(x, weight, bias, *fused),
        lambda: F.linear(x, weight, bias) if act is None else F.gelu(F.linear(x, weight, bias),
                                                                      approximate=_gelu_name(act)),
    )


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, act: str | None = None
) -> torch.Tensor:
    """``F.linear`` (then GELU when ``act`` is ``"gelu"`` or ``"gelu_tanh"``), on oneDNN for fp32 CPU where it wins.

    Without gradients the GELU is fused into oneDNN's kernel; with autograd the linear runs as
    :class:`_OneDNNLinear` and the GELU is ``F.gelu``.  Results agree with ``F.linear`` to float rounding
    (~1e-6).  Fallback (autocast, other devices and dtypes, tiny inputs, the switch off, a machine where
    ``F.linear`` measured faster at this shape): ``F.linear``.

    Args:
        x: (..., C_in); weight: (C_out, C_in); bias: (C_out,) or None.
    Returns:
        (..., C_out).
    """
    fits = _onednn_fits(x, weight)
    grad = fits and _needs_grad(x, weight)
    if fits and not grad and _infer_route(x, weight, bias, act):
        return _ONEDNN_OP(x, weight, bias, *(("none", [], "") if act is None else ("gelu", [], _gelu_name(act))))
    if grad and _train_route(x, weight, bias):
        y = _OneDNNLinear.apply(x, weight, bias)
    else:
        y = F.linear(x, weight, bias)
    if act is None:
        return y
    return F.gelu(y, approximate=_gelu_name(act))


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state-dict names) that calls :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def matmul_t(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b.T`` for 2-D tensors; fp32, or bf16 where oneDNN computes it, on CPU through oneDNN where it
    runs and measures faster.

    No autograd (the caller computes its own gradients).  ``out``: a contiguous tensor of the result's
    shape and dtype to write into (the public route writes there directly).  Fallback (a CPU without
    oneDNN bf16, a shape whose oneDNN primitive cannot be created here): ``a @ b.t()``.
    """
    if (
        _ONEDNN_LINEAR is not None
        and not compiling()
        and a.device.type == "cpu"
        and a.dtype == b.dtype
        and (a.dtype == torch.float32 or (a.dtype == torch.bfloat16 and cpu_features.onednn_bf16()))
        and torch.backends.mkldnn.is_available()
    ):
        layout = f"{'t' if a.stride(0) == 1 and a.shape[1] > 1 else 'n'}{'t' if b.stride(0) == 1 else 'n'}"
        question = _question(f"matmul_t:{str(a.dtype)[6:]}", f"{_rows_bucket(a.shape[0])}x{a.shape[1]}x{b.shape[0]}:"
                                                              f"{layout}")
        if _prefer_onednn(question, lambda: _ONEDNN_OP(a, b, None, "none", [], ""), lambda: a @ b.t()):
            y = _ONEDNN_OP(a, b, None, "none", [], "")
            return y if out is None else out.copy_(y)
    return a @ b.t() if out is None else torch.mm(a, b.t(), out=out)


class _Dropout(torch.autograd.Function):
    """``x * mask`` where the mask already holds 0 or 1 / (1 - p); the backward multiplies by the same mask."""

    @staticmethod
    def forward(ctx, x, mask):
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout: zero each element with probability ``p``, scale the rest by 1 / (1 - p).

    On CPU, ``F.dropout`` draws one Bernoulli sample per element.  Here one 64-bit draw of the (seeded,
    global) generator gives four 16-bit uniforms, turned into an fp32 mask of 0 and 1 / (1 - p) (a boolean
    mask would be converted on every multiply; bf16 inputs keep it, as bf16 cannot hold 1 / (1 - p)):
    forward and backward together cost less than ``F.dropout``'s (``bench/bench_kernels.py`` times both);
    ``p`` is rounded to a multiple of 1/65536.  Fallback (other devices, ``p >= 1``): ``F.dropout``, same
    distribution, other random numbers.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, True)
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
    r = words.view(torch.int16)[:n].view(x.shape)  # uniform on [-32768, 32767]
    keep = r >= round(p * 65536) - 32768
    if x.dtype != torch.float32:  # a bf16 mask could not hold 1 / (1 - p) exactly: scale in the multiply
        return x * keep * (1.0 / (1.0 - p))
    mask = keep.to(torch.float32).mul_(1.0 / (1.0 - p))  # 0 or 1 / (1 - p); faster than where() with two scalars
    if not (torch.is_grad_enabled() and x.requires_grad):
        return x * mask
    return _Dropout.apply(x, mask)


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
    bf16/fp16 on a CPU without AMX, where SDPA's low-precision kernels run slower than in fp32:
    two bf16 matmuls around an fp32 softmax while the scores are small (``_SMALL_SCORES``), else SDPA
    in fp32 on upcast inputs; the result is in the inputs' dtype either way.  Fallback: SDPA.

    Args:
        q: (B, nh, T, hs); k, v: (B, nh, T_total, hs).
        attn_mask: boolean, broadcastable to (B, nh, T, T_total), True = may attend.
    Returns:
        (B, nh, T, hs).
    """
    low = q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and not cpu_features.amx()
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
    "ONEDNN_MODES",
    "set_onednn",
    "onednn_mode",
    "onednn_enabled",
    "chosen_routes",
    "describe_routes",
    "compiling",
    "linear",
    "Linear",
    "matmul_t",
    "dropout",
    "Dropout",
    "attention",
]
