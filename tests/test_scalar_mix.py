"""ScalarMix: golden values against a hand computation, masked layer norm, learning, any layer list."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.nn.scalar_mix import ScalarMix


def test_golden_against_hand_computation():
    mix = ScalarMix(3, initial_weights=[0.0, 1.0, 2.0], initial_gamma=0.5)
    h = [torch.full((1, 1, 2), 1.0), torch.full((1, 1, 2), 2.0), torch.tensor([[[3.0, -3.0]]])]
    e = [math.exp(0), math.exp(1), math.exp(2)]
    w = [x / sum(e) for x in e]  # 0.09003057, 0.24472847, 0.66524096
    expected = [0.5 * (w[0] * 1 + w[1] * 2 + w[2] * 3), 0.5 * (w[0] * 1 + w[1] * 2 - w[2] * 3)]
    out = mix(h)
    assert out.shape == (1, 1, 2)
    torch.testing.assert_close(out[0, 0], torch.tensor(expected))
    # the numbers themselves, so a change of formula cannot hide behind the same expression
    torch.testing.assert_close(out[0, 0], torch.tensor([1.2876, -0.7081]), atol=1e-4, rtol=0)
    torch.testing.assert_close(mix.weights(), torch.tensor(w))


def test_default_is_equal_average_and_stacked_input_works():
    torch.manual_seed(0)
    layers = torch.randn(4, 2, 5, 8)  # (L, B, T, C)
    mix = ScalarMix(4)
    torch.testing.assert_close(mix(layers), layers.mean(0))
    torch.testing.assert_close(mix(list(layers)), layers.mean(0))
    with pytest.raises(ValueError):
        mix(list(layers[:3]))


def test_masked_layer_norm_ignores_padding():
    torch.manual_seed(0)
    h = torch.randn(2, 4, 3) * 5 + 2
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    # what is in the padding positions must not matter
    h2 = h.clone()
    h2[mask == 0] = 1000.0
    mix = ScalarMix(1, do_layer_norm=True)
    out1, out2 = mix([h], mask), mix([h2], mask)
    torch.testing.assert_close(out1[mask == 1], out2[mask == 1])
    real = out1[mask == 1]
    assert abs(real.mean().item()) < 1e-5
    assert abs(real.var(unbiased=False).item() - 1.0) < 1e-4
    # hand computation for the real entries
    vals = h[mask == 1]
    torch.testing.assert_close(real, (vals - vals.mean()) / vals.std(unbiased=False), atol=1e-5, rtol=1e-5)


def test_weights_learn_which_layer_helps():
    """Trained to reproduce layer 2, the mix puts its weight there."""
    torch.manual_seed(0)
    layers = [torch.randn(8, 6, 4) for _ in range(3)]
    target = layers[2] * 2.0
    mix = ScalarMix(3)
    opt = torch.optim.Adam(mix.parameters(), lr=0.1)
    for _ in range(200):
        loss = ((mix(layers) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    w = mix.weights()
    assert w[2] > 0.9 and abs(w.sum().item() - 1.0) < 1e-6
    assert abs(mix.gamma.item() - 2.0) < 0.2


def test_mixes_elmo_and_transformer_style_layer_lists():
    """Works on any list of same-shaped tensors, e.g. BERT's 13 hidden states."""
    layers = [torch.randn(2, 7, 16) for _ in range(13)]
    mix = ScalarMix(13, do_layer_norm=True)
    out = mix(layers, mask=torch.ones(2, 7))
    assert out.shape == (2, 7, 16)
    out.sum().backward()
    assert mix.scalar_parameters.grad is not None and mix.gamma.grad is not None
