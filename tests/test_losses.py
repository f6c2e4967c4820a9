"""lmforge.nn.losses: the fused linear cross-entropy gives the numbers of the plain form, with oneDNN on or off."""

from __future__ import annotations

import pytest
import torch
from test_cpu_ops import bf16_by_onednn

from lmforge.nn import cpu_ops
from lmforge.nn.losses import causal_lm_loss, cross_entropy_rows, free_workspace, linear_cross_entropy, shift_labels


@pytest.mark.parametrize("with_ignored", [False, True])
@pytest.mark.parametrize("block_scores", [1 << 26, 5000 * 300])
def test_fused_linear_cross_entropy_matches_plain(with_ignored, block_scores):
    torch.manual_seed(4)
    # softmax chunks of 2**21 // 5000 = 419 rows; with the small block_scores, blocks of 300 rows (last short)
    N, C, Vb = 1000, 16, 5000
    x = torch.randn(N, C, requires_grad=True)
    w = torch.randn(Vb, C, requires_grad=True)
    t = torch.randint(0, Vb, (N,))
    if with_ignored:
        t[::3] = -100
    ref = torch.nn.functional.cross_entropy(x @ w.t(), t, ignore_index=-100)
    gx, gw = torch.autograd.grad(ref * 2.0, (x, w))
    got = linear_cross_entropy(x, w, t, block_scores)
    fx, fw = torch.autograd.grad(got * 2.0, (x, w))
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fx, gx, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(fw, gw, atol=1e-6, rtol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(x, w, t, block_scores), ref.detach(), atol=1e-5, rtol=1e-5)


def test_fused_linear_cross_entropy_bf16_and_workspace_reuse(cpu_features_level):
    """Under bf16 autocast: close to autocast's own cross-entropy, fp32 weight gradient; the kept scratch
    buffers give the same result on a second call, after a call of another shape, and after being freed.  The
    matmuls run on oneDNN's bf16 kernel where this CPU has it (else ``a @ b.T`` in bf16)."""
    cpu_ops.set_onednn("on")
    torch.manual_seed(5)
    N, C, Vb = 600, 32, 3000
    x = torch.randn(N, C, requires_grad=True)
    w = (torch.randn(Vb, C) * 0.3).requires_grad_()
    t = torch.randint(0, Vb, (N,))
    t[::7] = -100
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = torch.nn.functional.cross_entropy((x @ w.t()).float(), t)
    gx, gw = torch.autograd.grad(ref, (x, w))

    def fused():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = linear_cross_entropy(x, w, t)
        return (loss, *torch.autograd.grad(loss, (x, w)))

    loss, fx, fw = fused()
    assert fw.dtype == torch.float32 and fx.dtype == torch.float32
    assert abs(loss.item() - ref.item()) < 2e-3
    torch.testing.assert_close(fx, gx, atol=2e-3, rtol=5e-2)
    torch.testing.assert_close(fw, gw, atol=2e-3, rtol=5e-2)
    again = fused()
    linear_cross_entropy(x[:50], w, t[:50]).backward()  # another shape and dtype in between
    after_other = fused()
    free_workspace()
    after_free = fused()
    for res in (again, after_other, after_free):
        for a, b in zip(res, (loss, fx, fw)):
            assert torch.equal(a, b)
    bf16 = {r for q, r in cpu_ops.chosen_routes().items() if q.startswith("matmul_t:bfloat16")}
    assert bf16 == ({"onednn"} if bf16_by_onednn(cpu_features_level) else set())


@pytest.fixture
def onednn_switch():
    """Set the oneDNN switch for one test (on wherever it applies, or off: not by measurement), then restore it."""
    before = cpu_ops._ONEDNN_MODE
    yield cpu_ops.set_onednn
    cpu_ops.set_onednn(before)


@pytest.mark.parametrize("onednn", [True, False])
def test_fused_matches_plain_with_either_matmul(onednn, onednn_switch):
    """The chunked loss over oneDNN's matmul and over ``a @ b.T`` (the fallback) both equal the plain form."""
    onednn_switch(onednn)
    torch.manual_seed(6)
    x = torch.randn(300, 24, requires_grad=True)
    w = torch.randn(700, 24, requires_grad=True)
    t = torch.randint(0, 700, (300,))
    ref = torch.nn.functional.cross_entropy(x @ w.t(), t)
    gx, gw = torch.autograd.grad(ref, (x, w))
    got = linear_cross_entropy(x, w, t)
    fx, fw = torch.autograd.grad(got, (x, w))
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fx, gx, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(fw, gw, atol=1e-6, rtol=1e-4)


def test_causal_lm_loss_shifts_the_labels_and_the_fused_form_agrees():
    torch.manual_seed(7)
    x, w = torch.randn(2, 5, 8), torch.randn(11, 8)
    logits = x @ w.t()  # (2, 5, 11)
    labels = torch.randint(0, 11, (2, 5))
    shifted = shift_labels(labels)
    assert shifted[:, -1].eq(-100).all() and torch.equal(shifted[:, :-1], labels[:, 1:])
    ref = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1))
    torch.testing.assert_close(causal_lm_loss(logits, labels), ref)
    torch.testing.assert_close(linear_cross_entropy(x.reshape(10, 8), w, shifted.reshape(10)), ref)


def test_second_backward_through_the_fused_loss_is_an_error():
    torch.manual_seed(0)
    x = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(20, 8, requires_grad=True)
    loss = linear_cross_entropy(x, w, torch.randint(0, 20, (6,)))
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()
    assert torch.equal(x.grad, first)  # nothing was silently added


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weighted_rows_match_the_plain_cross_entropy(dtype):
    """cross_entropy_rows: the loss, the per-row values and the gradient of the plain weighted form; the logits
    stay as they were, and another gradient through them adds up (ELMo's tests take one)."""
    torch.manual_seed(8)
    logits0 = (torch.randn(700, 300) * 3).to(dtype)
    t = torch.randint(0, 300, (700,))
    t[::7] = -100
    w = torch.rand(700)
    kept = logits0.clone()

    def run(fused: bool):
        z = logits0.clone().requires_grad_()
        if fused:
            loss, nll = cross_entropy_rows(z, t, w)
        else:
            nll = torch.nn.functional.cross_entropy(z.float(), t, ignore_index=-100, reduction="none")
            loss = (nll * w).sum()
        (2.5 * loss + z.float()[:, 0].sum()).backward()
        return loss.detach(), nll.detach(), z.grad.float()

    (lf, nf, gf), (lp, np_, gp) = run(True), run(False)
    tol = dict(atol=1e-4, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lf, lp, **tol)
    torch.testing.assert_close(nf, np_, **tol)
    torch.testing.assert_close(gf, gp, **tol)
    assert torch.equal(logits0, kept) and nf.dtype == torch.float32 and nf[::7].eq(0).all()
    with torch.no_grad():
        torch.testing.assert_close(cross_entropy_rows(logits0, t, w)[0], lp, **tol)
