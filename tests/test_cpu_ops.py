"""lmforge.nn.cpu_ops: every fast CPU route gives the numbers of its plain PyTorch fallback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from lmforge.nn import autotune, cpu_features, cpu_ops
from lmforge.nn.cpu_ops import Dropout, attention, dropout, linear, matmul_t


class _Mode:
    """A block with the oneDNN switch set to ``mode``, then the switch as it was."""

    def __init__(self, mode: str):
        self.mode = mode

    def __enter__(self):
        self.before = cpu_ops._ONEDNN_MODE
        cpu_ops.set_onednn(self.mode)

    def __exit__(self, *exc):
        cpu_ops.set_onednn(self.before)


@pytest.fixture
def onednn_off():
    """Run a block with the oneDNN routes off, then restore the switch."""
    return _Mode("off")


@pytest.fixture(autouse=True)
def onednn_on():
    """Every test here starts with the oneDNN routes on wherever they apply (not by measurement), so each
    compares the route with its fallback; the auto mode has tests of its own."""
    with _Mode("on"):
        yield


@pytest.mark.parametrize("act", [None, "gelu", "gelu_tanh"])
def test_linear_fast_path_matches_f_linear(act, onednn_off):
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 40, 48), torch.randn(96, 48) * 0.1, torch.randn(96)
    ref = F.linear(x, w, b)
    if act:
        ref = F.gelu(ref, approximate="tanh" if act == "gelu_tanh" else "none")
    with torch.no_grad():  # 160 rows: the oneDNN path where this build has it
        fast = linear(x, w, b, act)
        with onednn_off:
            plain = linear(x, w, b, act)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(plain, ref, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_autograd_matches_fallback(bias, onednn_off):
    """Training: the oneDNN autograd function's output and all three gradients equal F.linear's."""
    torch.manual_seed(1)
    x0, w0 = torch.randn(3, 50, 32), torch.randn(24, 32) * 0.1
    b0 = torch.randn(24) if bias else None
    g = torch.randn(3, 50, 24)

    def run():
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        b = b0.clone().requires_grad_() if bias else None
        y = linear(x, w, b)
        y.backward(g)
        return [y.detach(), x.grad, w.grad] + ([b.grad] if bias else [])

    fast = run()
    with onednn_off:
        plain = run()
    for a, p in zip(fast, plain):
        torch.testing.assert_close(a, p, atol=1e-5, rtol=1e-5)


ONEDNN = cpu_ops._ONEDNN_OP is not None and torch.backends.mkldnn.is_available()


def bf16_by_onednn(level: str) -> bool:
    """Whether oneDNN's bf16 inner product runs at this CPU features level: by torch's own probe of the CPU (not
    lmforge's), never under LMFORGE_CPU_FEATURES=avx2."""
    return ONEDNN and level == "native" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def test_matmul_t_matches_fallback(onednn_off, cpu_features_level):
    """fp32 on oneDNN wherever torch has it; bf16 on oneDNN only where this CPU computes it (AVX-512 or better,
    not LMFORGE_CPU_FEATURES=avx2), else ``a @ b.T`` in bf16: the same numbers, never an error."""
    torch.manual_seed(2)
    a, b = torch.randn(70, 33), torch.randn(90, 33)
    fast = matmul_t(a, b)
    ab, bb = a.bfloat16(), b.bfloat16()
    torch.testing.assert_close(matmul_t(ab, bb).float(), (ab @ bb.t()).float(), atol=0.1, rtol=2e-2)
    torch.testing.assert_close(matmul_t(ab.t().contiguous().t(), bb).float(), (ab @ bb.t()).float(), atol=0.1,
                               rtol=2e-2)  # a transposed layout: a route of its own
    routes = cpu_ops.chosen_routes()
    with onednn_off:
        plain = matmul_t(a, b)
    torch.testing.assert_close(plain, a @ b.t())
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=1e-5)
    fp32 = {q: r for q, r in routes.items() if q.startswith("matmul_t:float32")}
    bf16 = {q: r for q, r in routes.items() if q.startswith("matmul_t:bfloat16")}
    assert set(fp32.values()) == ({"onednn"} if ONEDNN else set())
    assert set(bf16.values()) == ({"onednn"} if bf16_by_onednn(cpu_features_level) else set())  # else never asked
    assert cpu_features.onednn_bf16() == bf16_by_onednn(cpu_features_level)


class _NoPrimitive:
    """A oneDNN linear that cannot build its primitive on this CPU, as bf16 on an AVX2-only CPU: counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        raise RuntimeError("could not create a primitive descriptor for the inner product forward propagation "
                           "primitive")


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_a_kernel_that_cannot_run_here_falls_back_once_per_shape(mode, monkeypatch, tmp_path):
    """Every oneDNN route whose primitive cannot be created takes F.linear / a @ b.T for that shape, decided by one
    try per kind of call and shape (cached, nothing timed), never raised."""
    monkeypatch.setenv(autotune.CACHE_ENV, str(tmp_path))
    autotune.forget()
    cpu_features.forget()
    op = _NoPrimitive()
    monkeypatch.setattr(cpu_ops, "_ONEDNN_OP", op)
    asked = _timings(monkeypatch, {"onednn": 0.1, "torch": 1.0})  # oneDNN would win, if it ran
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    torch.manual_seed(6)
    x, w, b = torch.randn(2, 40, 48, requires_grad=True), torch.randn(96, 48, requires_grad=True), torch.randn(96)
    with _Mode(mode):
        for _ in range(2):  # the second round is answered from memory
            y = linear(x, w, b)
            y.sum().backward()
            with torch.no_grad():
                z = linear(x, w, b, "gelu")
            m = matmul_t(x.detach()[0], w.detach())
        routes = cpu_ops.chosen_routes()
    torch.testing.assert_close(y, F.linear(x, w, b))
    torch.testing.assert_close(z, F.gelu(F.linear(x, w, b)))
    torch.testing.assert_close(m, x.detach()[0] @ w.detach().t())
    assert len(routes) == 3 and set(routes.values()) == {"torch"}
    assert op.calls == 3 and not asked  # one try per question; no timing of a kernel that cannot run
    assert sorted(cpu_features.failed_routes()) == sorted(routes)
    cpu_features.forget()
    autotune.forget()


def test_switch_reads_the_environment():
    """LMFORGE_ONEDNN=0 turns the oneDNN routes off at import, 1 on, anything else (or unset) means auto."""
    code = "from lmforge.nn import cpu_ops; print(cpu_ops.onednn_enabled(), cpu_ops.onednn_mode())"
    have = cpu_ops._ONEDNN_OP is not None and torch.backends.mkldnn.is_available()
    for value, mode in (("0", "off"), ("1", "on"), ("auto", "auto"), (None, "auto")):
        env = {k: v for k, v in os.environ.items() if k != "LMFORGE_ONEDNN"}
        if value is not None:
            env["LMFORGE_ONEDNN"] = value
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.split() == ([str(have), mode] if have and mode != "off" else ["False", "off"])


def _timings(monkeypatch, seconds: dict[str, float]) -> list[list[str]]:
    """``autotune.best_times`` answers ``seconds`` (a measurement on a machine where those are the times);
    returns the list of candidate names each measurement was asked for."""
    asked: list[list[str]] = []

    def best_times(candidates, reps=5, warmup=1):
        asked.append(sorted(candidates))
        for fn in candidates.values():  # the candidates must run
            fn()
        return {k: seconds[k] for k in candidates}

    monkeypatch.setattr(autotune, "best_times", best_times)
    return asked


@pytest.mark.skipif(cpu_ops._ONEDNN_OP is None, reason="this PyTorch build has no oneDNN linear")
@pytest.mark.parametrize(("onednn_s", "route"), [(0.5, "onednn"), (0.99, "torch"), (2.0, "torch")])
def test_auto_takes_onednn_only_where_it_measured_faster(onednn_s, route, monkeypatch, tmp_path):
    """auto: one measurement per kind of call and shape, cached in LMFORGE_CACHE; a near tie keeps F.linear."""
    monkeypatch.setenv(autotune.CACHE_ENV, str(tmp_path))
    autotune.forget()
    asked = _timings(monkeypatch, {"onednn": onednn_s, "torch": 1.0})
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 40, 48, requires_grad=True), torch.randn(96, 48, requires_grad=True), torch.randn(96)
    with _Mode("auto"):
        y = linear(x, w, b)
        linear(x, w, b)  # the same question: answered from memory
        y.sum().backward()
        with torch.no_grad():
            linear(x, w, b, "gelu")
        routes = cpu_ops.chosen_routes()
    assert set(routes.values()) == {route} and len(routes) == len(asked) == 2
    assert any(q.startswith("linear:train:64x48x96") for q in routes)
    torch.testing.assert_close(y, F.linear(x, w, b), atol=1e-5, rtol=1e-5)
    cached = json.loads((tmp_path / autotune.CACHE_FILE).read_text())[autotune.machine_key()]
    assert {q: e["choice"] for q, e in cached.items()} == routes
    autotune.forget()  # a new process: the file answers, nothing is measured again
    with _Mode("auto"):
        linear(x, w, b)
    assert len(asked) == 2
    autotune.forget()


def test_describe_routes_names_every_setting():
    line = cpu_ops.describe_routes()
    for part in ("oneDNN linear", "dropout", "attention", "LM loss"):
        assert part in line
    with _Mode("off"):
        assert "oneDNN linear: off" in cpu_ops.describe_routes()


def test_fast_dropout_statistics_and_determinism():
    x = torch.ones(64, 1000)
    torch.manual_seed(3)
    y = dropout(x, 0.1, True)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.9) < 0.005
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.9))
    # each of the four 16-bit lanes of a 64-bit draw is uniform: drop rate per lane ~ p
    lanes = kept.view(-1)[: 64000 // 4 * 4].view(-1, 4).float().mean(0)
    assert (lanes - 0.9).abs().max().item() < 0.01
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.1, True), y)  # seeded by torch's generator
    assert dropout(x, 0.1, False) is x and dropout(x, 0.0, True) is x
    g = torch.randn(64, 1000, requires_grad=True)
    out = Dropout(0.25).train()(g)
    out.sum().backward()
    assert torch.equal(g.grad, (out != 0).float() / 0.75)
    assert abs((out == 0).float().mean().item() - 0.25) < 0.01


def test_fast_dropout_matches_f_dropout_in_distribution():
    """Other random numbers than F.dropout, the same law: drop rate, scale of the kept values, mean."""
    torch.manual_seed(4)
    x = torch.randn(200, 500)
    fast, plain = dropout(x, 0.3, True), F.dropout(x, 0.3, True)
    for y in (fast, plain):
        kept = y != 0
        torch.testing.assert_close(y[kept], x[kept] / 0.7)
    assert abs((fast == 0).float().mean().item() - (plain == 0).float().mean().item()) < 0.01
    assert abs(fast.mean().item() - plain.mean().item()) < 0.02


def test_attention_with_dropout_matches_sdpa_in_expectation():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4) for _ in range(3))
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    for causal in (False, True):
        m = None if causal else mask
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal)
        assert torch.allclose(attention(q, k, v, m, causal, 0.0), ref, atol=1e-6)
        mean = torch.stack([attention(q, k, v, m, causal, 0.2) for _ in range(3000)]).mean(0)
        assert torch.allclose(mean, ref, atol=0.05)


@pytest.mark.parametrize("path", ["plain", "flash"])
def test_bf16_attention_matches_fp32_sdpa(path, monkeypatch):
    """bf16 on CPU: small score tensors take bf16 matmuls with an fp32 softmax, large ones SDPA in fp32."""
    if path == "flash":
        monkeypatch.setattr(cpu_ops, "_SMALL_SCORES", 0)
    monkeypatch.setenv(cpu_features.FEATURES_ENV, "avx2")  # the rule of a CPU without AMX, on any CPU
    assert not cpu_features.amx()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    mask = torch.ones(2, 1, 1, 16, dtype=torch.bool)
    mask[1, ..., 11:] = False
    g = torch.randn(2, 3, 16, 8)
    for causal in (False, True):
        m = None if causal else mask
        qkv = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*qkv, attn_mask=m, is_causal=causal)
        ref.backward(g)
        low = [t.bfloat16().requires_grad_() for t in (q, k, v)]
        got = attention(*low, m, causal, 0.0)
        assert got.dtype == torch.bfloat16
        got.backward(g.bfloat16())
        torch.testing.assert_close(got.float(), ref, atol=3e-2, rtol=3e-2)
        for a, b in zip(low, qkv):
            torch.testing.assert_close(a.grad.float(), b.grad, atol=5e-2, rtol=5e-2)


def test_gpt_and_bert_give_the_same_losses_with_the_switch_off(onednn_off):
    """A whole training step of each Transformer family: same loss and gradients either way."""
    from lmforge.families.bert.model import BertConfig, BertForPreTraining
    from lmforge.families.gpt.model import GPTConfig, GPTLMHeadModel

    torch.manual_seed(5)
    gpt = GPTLMHeadModel(GPTConfig(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).train()
    bert = BertForPreTraining(BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0, max_position_embeddings=64)).train()
    ids = torch.randint(5, 300, (4, 32))
    labels = torch.full_like(ids, -100)
    labels[:, ::5] = ids[:, ::5]

    def step():
        out = []
        for model, kw in ((gpt, dict(labels=ids)), (bert, dict(labels=labels))):
            model.zero_grad()
            loss = model(ids, **kw).loss
            loss.backward()
            out.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        return out

    fast = step()
    with onednn_off:
        plain = step()
    for (lf, gf), (lp, gp) in zip(fast, plain):
        torch.testing.assert_close(lf, lp, atol=1e-5, rtol=1e-5)
        for a, b in zip(gf, gp):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
