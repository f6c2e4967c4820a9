"""Learned scalar mixing of a model's layers (ELMo, section 3.2 of Peters et al. 2018).

Given layer representations ``h_0 .. h_{L-1}``, each (B, T, C)::

    mix = gamma * sum_j softmax(w)_j * h_j

``w`` (one scalar per layer) and ``gamma`` (one scalar) are learned by the downstream task.
``softmax(w)`` are the normalised layer weights; :meth:`ScalarMix.weights` returns them so a
trained task can say which layers it found useful.  With ``do_layer_norm=True`` each ``h_j`` is
first normalised to zero mean and unit variance over its non-padding entries (the paper found
this helps when the layers' scales differ a lot).  The inputs are plain tensors, so the same
module mixes BERT's or GPT's layer lists as well as ELMo's three layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def _masked_layer_norm(h: torch.Tensor, mask: torch.Tensor | None, eps: float = 1e-12) -> torch.Tensor:
    """Normalise ``h`` to zero mean, unit variance over all its non-padding entries (one mean per layer).

    Args:
        h: (B, T, C) one layer.
        mask: (B, T) 1 for real tokens, 0 for padding, or None.
    Returns:
        (B, T, C) the normalised layer.
    """
    if mask is None:
        mean = h.mean()
        var = ((h - mean) ** 2).mean()
        return (h - mean) / torch.sqrt(var + eps)
    m = mask.to(h.dtype).unsqueeze(-1)  # (B, T, 1)
    n = m.sum() * h.shape[-1]
    mean = (h * m).sum() / n
    var = (((h - mean) * m) ** 2).sum() / n
    return (h - mean) / torch.sqrt(var + eps)


class ScalarMix(nn.Module):
    """``gamma * sum_j softmax(w)_j * h_j`` over ``num_layers`` tensors of one shape.

    Args:
        num_layers: how many layers are mixed.
        do_layer_norm: normalise each layer (over non-padding entries) before mixing.
        initial_weights: starting values of ``w`` (default all zero: an equal average).
        initial_gamma: starting value of ``gamma``.
    """

    def __init__(
        self,
        num_layers: int,
        do_layer_norm: bool = False,
        initial_weights: Sequence[float] | None = None,
        initial_gamma: float = 1.0,
    ):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        init = list(initial_weights) if initial_weights is not None else [0.0] * num_layers
        if len(init) != num_layers:
            raise ValueError(f"{len(init)} initial weights given for {num_layers} layers")
        self.num_layers = num_layers
        self.do_layer_norm = do_layer_norm
        self.scalar_parameters = nn.Parameter(torch.tensor(init, dtype=torch.float32))
        self.gamma = nn.Parameter(torch.tensor([float(initial_gamma)]))

    def weights(self) -> torch.Tensor:
        """The normalised layer weights ``softmax(w)``, shape (num_layers,), detached."""
        return torch.softmax(self.scalar_parameters.detach(), dim=0)

    def forward(self, layers: Sequence[torch.Tensor] | torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Mix the layers.

        Args:
            layers: a list of ``num_layers`` tensors of one shape, e.g. (B, T, C), or one stacked
                tensor (num_layers, ...).
            mask: (B, T) 1 for tokens and 0 for padding; only used by the layer norm.
        Returns:
            The mixed tensor, shape of one layer.
        """
        if len(layers) != self.num_layers:
            raise ValueError(f"ScalarMix expects {self.num_layers} layers, got {len(layers)}")
        w = torch.softmax(self.scalar_parameters, dim=0)
        out = None
        for j, h in enumerate(layers):
            if self.do_layer_norm:
                h = _masked_layer_norm(h, mask)
            term = w[j].to(h.dtype) * h
            out = term if out is None else out + term
        return self.gamma.to(out.dtype) * out

    def extra_repr(self) -> str:
        return f"num_layers={self.num_layers}, do_layer_norm={self.do_layer_norm}"
