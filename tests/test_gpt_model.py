"""GPT model: shapes, causality, loss at init, overfitting, save/load, post-LN, presets and setup."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from lmforge.errors import ConfigError, DataError, LmforgeError
from lmforge.families.gpt.model import GPTConfig, GPTLMHeadModel
from lmforge.families.gpt.presets import DEFAULT_PRESET, PRESETS
from lmforge.families.gpt.pretraining import setup_gpt
from lmforge.nn import cpu_features, cpu_ops

V = 97


def tiny_config(**kw) -> GPTConfig:
    base = dict(
        vocab_size=V, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    base.update(kw)
    return GPTConfig(**base)


def tiny_model(**kw) -> GPTLMHeadModel:
    torch.manual_seed(0)
    return GPTLMHeadModel(tiny_config(**kw)).eval()


def test_config_checks():
    with pytest.raises(ConfigError):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ConfigError):
        GPTConfig(activation_function="relu")
    with pytest.raises(ConfigError):
        GPTConfig(vocab_size=10, eos_token_id=10)
    with pytest.raises(ConfigError):
        GPTConfig(attn_pdrop=1.0)
    assert DEFAULT_PRESET in PRESETS
    for kw in PRESETS.values():
        GPTConfig(**kw)  # every preset is a valid config


def test_shapes_and_tied_weights():
    model = tiny_model()
    ids = torch.randint(0, V, (3, 11))
    out = model(ids)
    assert out.logits.shape == (3, 11, V)
    assert out.loss is None
    assert model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()
    states = model.hidden_states(ids)
    assert len(states) == 3 and all(s.shape == (3, 11, 32) for s in states)
    assert model.hidden_size == 32
    # the top state is what the LM head reads
    torch.testing.assert_close(model.lm_head(states[-1]), out.logits)
    parts = model.transfer_layers()
    assert len(parts) == 3  # embeddings, block 0, block 1 (+ ln_f)
    n_params = sum(p.numel() for part in parts for p in part.parameters())
    assert n_params == model.num_parameters()


def test_residual_projection_init_is_scaled():
    torch.manual_seed(0)
    model = GPTLMHeadModel(tiny_config(n_embd=64, n_layer=8, n_head=4))
    std_proj = model.h[0].mlp.proj.weight.std().item()
    std_fc = model.h[0].mlp.fc.weight.std().item()
    assert std_fc == pytest.approx(0.02, rel=0.05)
    assert std_proj == pytest.approx(0.02 / math.sqrt(16), rel=0.1)


@pytest.mark.parametrize("norm_first", [True, False])
def test_causality(norm_first):
    """Changing a future token leaves every earlier position's logits unchanged."""
    model = tiny_model(norm_first=norm_first)
    torch.manual_seed(1)
    ids = torch.randint(0, V, (2, 16))
    base = model(ids).logits
    for t in (3, 9, 15):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] + 1) % V
        logits = model(changed).logits
        torch.testing.assert_close(logits[:, :t], base[:, :t], atol=1e-6, rtol=0)
        assert (logits[:, t] - base[:, t]).abs().max() > 1e-4  # the changed position itself does move


def test_loss_at_init_is_about_ln_v():
    model = tiny_model()
    torch.manual_seed(2)
    ids = torch.randint(0, V, (8, 32))
    loss = model(ids, labels=ids).loss.item()
    assert abs(loss - math.log(V)) < 0.1, loss


def test_loss_shifts_labels_and_ignores_minus_100():
    model = tiny_model()
    ids = torch.randint(0, V, (2, 10))
    logits = model(ids).logits
    ref = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(model(ids, labels=ids).loss, ref)
    labels = ids.clone()
    labels[:, 5:] = -100
    ref = torch.nn.functional.cross_entropy(logits[:, :4].reshape(-1, V), ids[:, 1:5].reshape(-1))
    torch.testing.assert_close(model(ids, labels=labels).loss, ref)


@pytest.mark.parametrize("norm_first", [True, False])
def test_overfits_one_batch(norm_first):
    model = tiny_model(norm_first=norm_first).train()
    torch.manual_seed(3)
    ids = torch.randint(0, V, (4, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(50):
        loss = model(ids, labels=ids).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 4.0 and loss.item() < 0.1, (first, loss.item())


def test_padding_mask_right_and_left():
    model = tiny_model()
    ids = torch.randint(0, V, (1, 6))
    ref = model(ids).logits
    # right padding: real positions are unchanged
    padded = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.tensor([[1] * 6 + [0] * 3])
    torch.testing.assert_close(model(padded, attention_mask=mask).logits[:, :6], ref, atol=1e-5, rtol=0)
    # left padding: with positions from the mask, the real tokens see exactly what they saw unpadded
    left = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    lmask = torch.tensor([[0] * 3 + [1] * 6])
    pos = (lmask.cumsum(-1) - 1).clamp(min=0)
    out = model(left, attention_mask=lmask, position_ids=pos).logits
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[:, 3:], ref, atol=1e-5, rtol=0)


def test_too_long_input_is_refused():
    model = tiny_model()
    with pytest.raises(LmforgeError, match="n_positions"):
        model(torch.zeros(1, 33, dtype=torch.long))


@pytest.mark.parametrize("norm_first", [True, False])
def test_save_load_identical(tmp_path, norm_first):
    model = tiny_model(norm_first=norm_first)
    model.save_pretrained(tmp_path / "m")
    loaded = GPTLMHeadModel.from_pretrained(tmp_path / "m")
    assert loaded.config == model.config
    assert loaded.lm_head.weight.data_ptr() == loaded.wte.weight.data_ptr()
    ids = torch.randint(0, V, (2, 12))
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_post_ln_structure():
    post = tiny_model(norm_first=False)
    pre = tiny_model(norm_first=True)
    assert isinstance(post.ln_f, torch.nn.Identity) and isinstance(pre.ln_f, torch.nn.LayerNorm)
    assert not post.h[0].norm_first and pre.h[0].norm_first
    ids = torch.randint(0, V, (1, 8))
    # post-LN: every block output is layer-normed (zero mean, unit variance per position)
    top = post.hidden_states(ids)[-1]
    torch.testing.assert_close(top.mean(-1), torch.zeros(1, 8), atol=1e-5, rtol=0)
    assert not torch.allclose(post(ids).logits, pre(ids).logits)


def test_resize_keeps_existing_rows():
    model = tiny_model()
    ids = torch.randint(0, V, (2, 8))
    before = model(ids).logits
    old = model.wte.weight.detach().clone()
    model.resize_token_embeddings(V + 3)
    assert model.config.vocab_size == V + 3 and model.wte.weight.shape == (V + 3, 32)
    assert torch.equal(model.wte.weight[:V], old)
    assert model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()
    torch.testing.assert_close(model(ids).logits[..., :V], before)


def test_pretraining_setup_needs_bpe(bpe_shards, wordpiece_shards):
    from lmforge.data.shards import Shards

    cfg = GPTConfig(**PRESETS["tiny"])
    wp = Shards.open(wordpiece_shards)
    with pytest.raises(DataError, match="BPE"):
        setup_gpt(cfg, wp, wp.tokenizer())
    shards = Shards.open(bpe_shards)
    tok = shards.tokenizer()
    model, sampler = setup_gpt(dataclasses.replace(cfg, n_positions=16), shards, tok)
    assert model.config.vocab_size == tok.vocab_size and model.config.eos_token_id == tok.eot_id
    batch = sampler.batch([__import__("numpy").random.default_rng(i) for i in range(3)], "train")
    assert batch["input_ids"].shape == (3, 16)
    out = model(**batch)
    assert abs(out.loss.item() - math.log(tok.vocab_size)) < 0.2


def test_embed_returns_all_layers(bpe_tokenizer):
    torch.manual_seed(0)
    model = GPTLMHeadModel(tiny_config(vocab_size=bpe_tokenizer.vocab_size)).eval()
    model.tokenizer = bpe_tokenizer
    text = "The python is a large snake."
    (res,) = model.embed([text])
    n = len(bpe_tokenizer.encode(text))
    assert res.layers.shape == (3, n, 32) and len(res.tokens) == n and len(res.offsets) == n
    assert res.layer_names == ["emb", "layer1", "layer2"]
    assert text[res.offsets[1][0] : res.offsets[1][1]].strip() in text


def test_labelled_forward_skips_logits_but_matches(cpu_features_level):
    model = tiny_model().train()
    ids = torch.randint(0, V, (3, 20))
    fused = model(ids, labels=ids)
    assert fused.logits is None
    plain = model(ids, labels=ids, return_logits=True)
    assert plain.logits.shape == (3, 20, V)
    torch.testing.assert_close(fused.loss, plain.loss)
    g1 = torch.autograd.grad(fused.loss, list(model.parameters()))
    g2 = torch.autograd.grad(plain.loss, list(model.parameters()))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf = model(ids, labels=ids).loss
    bf.backward()
    assert abs(bf.item() - plain.loss.item()) < 0.05
    bf16 = {r for q, r in cpu_ops.chosen_routes().items() if q.startswith("matmul_t:bfloat16")}
    if cpu_features_level == "avx2" or not cpu_features.onednn_bf16():  # the LM head's bf16 matmuls: PyTorch's
        assert "onednn" not in bf16
