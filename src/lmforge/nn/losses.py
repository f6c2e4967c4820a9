"""Language-model losses: the causal LM loss and a fused linear + cross-entropy for large vocabularies.

:func:`linear_cross_entropy` is ``F.cross_entropy(x @ weight.T, targets, ignore_index=-100)`` computed
without ever holding the full (N, V) logits: the LM head is the largest matmul of a small GPT and its
logits its main memory traffic, and the plain form passes over them five times (matmul, log-softmax,
NLL, their backward).  Here the logits are made a cache-sized chunk at a time and turned into the loss
and its gradient while in cache, which on CPU is faster (docs/gpt.md, speed).  The matmuls go through
:func:`lmforge.nn.cpu_ops.matmul_t` (oneDNN where on, ``a @ b.T`` otherwise).  Fallback: callers that
want the logits use :func:`causal_lm_loss` on them, the plain form; ``tests/test_losses.py`` checks
the two give the same loss and gradients.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from .cpu_ops import compiling, matmul_t


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: position t predicts ``labels[:, t+1]``; -100 is ignored.

    The labels are shifted rather than the logits, so the (B, T, V) logits are never copied.

    Args:
        logits: (B, T, V) scores.
        labels: (B, T) targets aligned with the input.
    Returns:
        Scalar loss (fp32).
    """
    B, T, V = logits.shape
    return F.cross_entropy(logits.reshape(B * T, V).float(), shift_labels(labels).reshape(B * T), ignore_index=-100)


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) labels aligned with the input -> (B, T) next-token targets (the last position gets -100)."""
    return F.pad(labels[:, 1:], (0, 1), value=-100)


_SOFTMAX_OUT = getattr(getattr(getattr(torch.ops, "aten", None), "_softmax", None), "out", None)


def _softmax_(z: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of a contiguous fp32 ``z``, written over ``z`` (a new tensor would cost
    its page faults again on every call, which on CPU cost more than the softmax itself)."""
    if _SOFTMAX_OUT is not None:
        try:
            return _SOFTMAX_OUT(z, -1, False, out=z)
        except RuntimeError:  # pragma: no cover - a build that refuses the aliased out
            pass
    return torch.softmax(z, dim=-1)  # pragma: no cover


_WORKSPACE = threading.local()  # per thread: name -> reusable scratch tensor


def _workspace(rows: int, cols: int, dtype: torch.dtype, device: torch.device, name: str) -> torch.Tensor:
    """A (rows, cols) scratch buffer ``name``, kept for later calls with the same width, dtype and device.

    Reusing the buffer saves its page faults on every training step (on CPU the faults of a fresh buffer
    of the logits' size are a sizeable share of the LM head's step).  :func:`free_workspace` releases it.
    """
    bufs = _WORKSPACE.__dict__
    buf = bufs.get(name)
    if buf is None or buf.shape[0] < rows or buf.shape[1] != cols or buf.dtype != dtype or buf.device != device:
        bufs.pop(name, None)
        buf = bufs[name] = torch.empty(rows, cols, dtype=dtype, device=device)
    return buf[:rows]


def free_workspace() -> None:
    """Release the scratch buffers :func:`linear_cross_entropy` keeps between calls (this thread's)."""
    _WORKSPACE.__dict__.clear()


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``x @ weight.T`` against ``targets``, without a separate softmax pass.

    Rows go in blocks of at most ``block_rows`` (all of them when the block's logits fit ``block_scores``),
    and each block in cache-sized chunks of ``chunk_rows``: one matmul makes a chunk's logits, which are
    turned in cache into the loss and the gradient (softmax - one-hot) / n and written once into the
    block's gradient buffer; two more matmuls over the whole block give the gradients of ``x`` and
    ``weight``.  The loss is a scalar, so those gradients are known in the forward pass and backward only
    scales them.  Compared with ``F.cross_entropy(x @ weight.T)`` this skips the log-softmax output, the
    zero-filled gradient of the NLL loss and the log-softmax backward: each a full pass over the (N, V)
    logits.  Making the logits a chunk at a time also keeps the matmul's output in cache, which on CPU
    makes it faster than one (N, V) matmul; under bf16 the chunk's fp32 copy stays in cache too.
    """

    @staticmethod
    def forward(ctx, x, master_weight, targets, block_rows: int, chunk_rows: int, need_grad: bool):
        # x (N, C) in the matmul dtype, master_weight (V, C) in its own dtype (fp32 under autocast), targets (N,)
        weight = master_weight.to(x.dtype)  # one cast; the weight gradient is returned in master_weight's dtype
        N = x.shape[0]
        valid = targets != -100
        safe = targets.clamp(min=0)
        n_valid = valid.sum()  # a tensor on a GPU: reading it back would stall the GPU every step
        if x.device.type == "cpu":
            n_valid = int(n_valid)
        loss_sum = torch.zeros((), dtype=torch.float32, device=x.device)
        grad_x = torch.empty_like(x) if need_grad else None
        grad_w = None  # (V, C) fp32, summed over blocks
        for b in range(0, N, block_rows):
            xb, tb, vb = x[b : b + block_rows], safe[b : b + block_rows, None], valid[b : b + block_rows]
            p = _workspace(xb.shape[0], weight.shape[0], x.dtype, x.device, "grad") if need_grad else None  # (r, V)
            lse = torch.empty(xb.shape[0], 1, dtype=torch.float32, device=x.device)  # log-sum-exp per row
            target_score = torch.empty_like(lse)
            for i in range(0, xb.shape[0], chunk_rows):  # a cache-sized chunk: all its passes stay in cache
                # (c, V) logits in the matmul dtype; in fp32 with gradients they are made in the gradient buffer
                # itself and become the gradient there (no copy of the chunk)
                in_place = need_grad and x.dtype == torch.float32
                zc = matmul_t(xb[i : i + chunk_rows], weight, out=p[i : i + chunk_rows] if in_place else None)
                tc = tb[i : i + chunk_rows]
                zf = zc  # the softmax is always fp32: a bf16 chunk goes through a reused fp32 buffer
                if zc.dtype != torch.float32:
                    zf = _workspace(zc.shape[0], zc.shape[1], torch.float32, zc.device, "chunk").copy_(zc)
                target_score[i : i + chunk_rows] = zf.gather(1, tc)
                m = zf.amax(dim=-1, keepdim=True)
                sm = _softmax_(zf)  # one fused kernel, in place
                # log-sum-exp = m + log(sum exp(z - m)) = m - log(softmax at the max), which is >= 1/V
                lse[i : i + chunk_rows] = m - sm.amax(dim=-1, keepdim=True).log()
                if need_grad:
                    sm.scatter_add_(1, tc, torch.full(tc.shape, -1.0, device=sm.device))  # softmax - one-hot
                    if x.device.type == "cpu":  # ignored rows give no gradient; few rows to fill, in cache
                        ignored = (~vb[i : i + chunk_rows]).nonzero().squeeze(1)
                        if ignored.numel():
                            sm.index_fill_(0, ignored, 0.0)
                    else:  # no data-dependent shape (a host sync) on a GPU
                        sm.masked_fill_(~vb[i : i + chunk_rows, None], 0.0)
                    if not in_place:
                        p[i : i + chunk_rows] = sm
            loss_sum += ((lse - target_score).squeeze(1) * vb).sum()
            if need_grad:
                grad_x[b : b + block_rows] = matmul_t(p, weight.t())  # (r, C) = p @ W, no transposed copy of W
                gw = matmul_t(xb.t(), p.t()).t().float()  # (V, C) = p.T @ x (this order is the fastest on CPU)
                grad_w = gw if grad_w is None else grad_w.add_(gw)
        if need_grad:
            if isinstance(n_valid, int):
                scale = 1.0 / max(n_valid, 1)
                grad_x.mul_(scale)
            else:  # scaled in fp32: a bf16 copy of the scale would be off by up to 0.4 %
                scale = 1.0 / n_valid.clamp(min=1).float()
                grad_x = grad_x.mul_(scale) if grad_x.dtype == torch.float32 else grad_x.float().mul_(scale)
            ctx.grads = (grad_x, grad_w.mul_(scale).to(master_weight.dtype).contiguous())
        else:
            ctx.grads = None
        return loss_sum / n_valid  # 0 / 0 = NaN when every target is ignored, as F.cross_entropy

    @staticmethod
    def backward(ctx, grad_out):
        if getattr(ctx, "consumed", False):  # the gradients were handed out and freed by the first backward
            raise RuntimeError(
                "linear_cross_entropy: backward ran twice through the same loss; its gradients are computed in the "
                "forward pass and freed by the first backward, so compute the loss again "
                "(retain_graph cannot keep them)"
            )
        if ctx.grads is None:
            return None, None, None, None, None, None
        grad_x, grad_w = ctx.grads
        ctx.grads = None
        ctx.consumed = True
        if grad_out.device.type != "cpu" or float(grad_out) != 1.0:  # a CPU loss seeded with 1 needs no pass
            grad_x, grad_w = grad_x * grad_out.to(grad_x.dtype), grad_w * grad_out.to(grad_w.dtype)
        return grad_x, grad_w, None, None, None, None


class _CrossEntropyRows(torch.autograd.Function):
    """``sum_i weights_i * CE(logits_i, targets_i)`` and the per-row CE, the gradient made in the forward pass.

    The logits (the caller keeps them) are read a cache-sized chunk at a time: an fp32 copy of the chunk
    becomes its softmax in place, which gives the loss (log-sum-exp minus the target's score) and the
    gradient ``weights_i * (softmax_i - onehot_i)``, written once into the gradient buffer.  Against
    ``F.cross_entropy`` this skips writing the log-softmax, the zero-filled gradient of the NLL and the
    log-softmax backward: three passes over the (N, V) scores.
    """

    @staticmethod
    def forward(ctx, logits, targets, weights, chunk_rows: int, need_grad: bool):
        N, V = logits.shape
        valid = targets != -100
        safe = targets.clamp(min=0)
        nll = torch.empty(N, dtype=torch.float32, device=logits.device)
        grad = torch.empty_like(logits) if need_grad else None
        w = (weights * valid).float()
        for i in range(0, N, chunk_rows):
            tc = safe[i : i + chunk_rows, None]
            zf = _workspace(tc.shape[0], V, torch.float32, logits.device, "rows").copy_(logits[i : i + chunk_rows])
            target_score = zf.gather(1, tc)
            m = zf.amax(dim=-1, keepdim=True)
            sm = _softmax_(zf)
            lse = m - sm.amax(dim=-1, keepdim=True).log()  # as in _LinearCrossEntropy
            nll[i : i + chunk_rows] = (lse - target_score).squeeze(1) * valid[i : i + chunk_rows]
            if need_grad:
                sm.scatter_add_(1, tc, torch.full(tc.shape, -1.0, device=sm.device))  # softmax - one-hot
                grad[i : i + chunk_rows] = sm.mul_(w[i : i + chunk_rows, None])  # ignored rows: weight 0
        ctx.grad = grad
        ctx.mark_non_differentiable(nll)
        return (nll * w).sum(), nll

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        grad = ctx.grad
        if grad is None:
            return None, None, None, None, None
        if grad_loss.device.type != "cpu" or float(grad_loss) != 1.0:  # a CPU loss seeded with 1 needs no pass
            grad = grad * grad_loss.to(grad.dtype)
        return grad, None, None, None, None


def cross_entropy_rows(
    logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted cross-entropy of each row of ``logits``, the gradient computed in one pass over the scores.

    Same value and gradient as ``(weights * F.cross_entropy(logits, targets, ignore_index=-100,
    reduction="none")).sum()`` (to float rounding), in fp32 whatever the logits' dtype; the logits are
    not changed.  ELMo's two directions use it with weights 1 / (tokens of the direction).

    Args:
        logits: (N, V) scores; targets: (N,) ids, -100 = ignore; weights: (N,) per-row weights.
    Returns:
        ``(loss, nll)``: the scalar weighted sum (differentiable) and the (N,) per-row cross-entropies
        (0 where ignored; no gradient).
    """
    V = logits.shape[-1]
    chunk_rows = max(8, (1 << 21) // V) if logits.device.type == "cpu" else logits.shape[0]
    need_grad = torch.is_grad_enabled() and logits.requires_grad
    return _CrossEntropyRows.apply(logits, targets, weights, max(chunk_rows, 1), need_grad)


def mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the (N, V) rows against ``targets`` (N,), in fp32, made by :func:`cross_entropy_rows`
    in one pass over the scores; with no rows, a zero that still reaches every parameter behind ``logits``."""
    if not targets.numel():
        return logits.sum() * 0.0
    return cross_entropy_rows(logits, targets, torch.full(targets.shape, 1.0 / len(targets), device=targets.device))[0]


def top1_share(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Share of the (N, V) rows whose target (N,) scores highest (a tie with another token counts as right).

    The same as ``(scores.argmax(-1) == target).float().mean()`` but for exact ties; a row maximum is one
    vectorised pass where CPU's ``argmax`` is several times slower.
    """
    return (scores.gather(1, target[:, None]).squeeze(1) >= scores.amax(-1)).float().mean()


def linear_cross_entropy(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, block_scores: int = 1 << 26
) -> torch.Tensor:
    """``F.cross_entropy(x @ weight.T, targets, ignore_index=-100)`` with fewer passes over the logits.

    Same value and gradients as the plain form (to float rounding).  At most ``block_scores`` logits
    (default 64M, 256 MB in fp32) exist at a time, so a large vocabulary times a long batch stays bounded.
    With gradients, the buffer of the logits' gradient is kept for the next call (no page faults on
    every step); :func:`free_workspace` releases it.

    Args:
        x: (N, C) final hidden states.
        weight: (V, C) output embedding.
        targets: (N,) target ids, -100 = ignore.
        block_scores: the most logits held at once.
    Returns:
        Scalar mean loss (fp32); NaN when every target is ignored (as ``F.cross_entropy``).
    """
    if compiling():  # inductor fuses the plain form itself; the chunk loop would only break its graph
        logits = x @ weight.to(x.dtype).t() if not torch.is_autocast_enabled(x.device.type) else x @ weight.t()
        return F.cross_entropy(logits.float(), targets, ignore_index=-100)
    V = weight.shape[0]
    block_rows = max(1, block_scores // V)
    # On CPU, chunks of ~8 MB of fp32 scores keep the softmax passes in cache.  A GPU gains nothing from
    # that and pays a launch per small kernel instead: there a chunk is the whole block.
    chunk_rows = max(8, (1 << 21) // V) if x.device.type == "cpu" else block_rows
    need_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if torch.is_autocast_enabled(x.device.type):  # matmuls in the autocast dtype, softmax in fp32
        dt = torch.get_autocast_dtype(x.device.type)
        with torch.autocast(x.device.type, enabled=False):
            return _LinearCrossEntropy.apply(x.to(dt), weight, targets, block_rows, chunk_rows, need_grad)
    return _LinearCrossEntropy.apply(x, weight, targets, block_rows, chunk_rows, need_grad)


__all__ = ["causal_lm_loss", "shift_labels", "linear_cross_entropy", "cross_entropy_rows", "free_workspace"]
