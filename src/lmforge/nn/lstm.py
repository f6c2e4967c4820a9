"""A stack of projected LSTMs (LSTMP) with residual connections between the layers, as in ELMo.

Each layer is one ``torch.nn.LSTM(proj_size=...)``: the cell has ``cell_size`` units and its output
is projected to ``proj_size`` (the original ELMo: 4096 -> 512), which keeps the recurrent matmul
and the next layer's input small.  PyTorch's own kernels run the whole sequence, far faster than a
Python loop over time steps: oneDNN on CPU when there is no projection (``proj_size == cell_size``),
PyTorch's generic LSTM kernel on CPU with a projection (oneDNN has none), cuDNN on GPU.  Layers after the first
add their input to their output (a residual connection).  One stack reads one direction: ELMo
builds two and feeds the backward one the reversed sequence.

Unlike the original, the cell and projection values are not clipped (``torch.nn.LSTM`` has no
clip), and no state is carried from one batch to the next.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

# PyTorch warns once that LSTMs with proj_size do not run on oneDNN; the docstring above says so,
# and the warning would otherwise show in every CLI run of a projected ELMo.
warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")


class ResidualLSTMStack(nn.Module):
    """``num_layers`` LSTMP layers; returns every layer's output.

    Args:
        input_size: width of the input vectors.
        cell_size: LSTM cell (and gate) width.
        proj_size: output width of each layer; equal to ``cell_size`` means no projection.
        num_layers: layers in the stack.
        dropout: dropout on each layer's output (training only).
        residual: add each layer's input to its output from the second layer on.
    """

    def __init__(
        self,
        input_size: int,
        cell_size: int,
        proj_size: int,
        num_layers: int = 2,
        dropout: float = 0.0,
        residual: bool = True,
    ):
        super().__init__()
        if proj_size > cell_size:
            raise ValueError(f"proj_size {proj_size} must be <= cell_size {cell_size}")
        p = 0 if proj_size == cell_size else proj_size
        self.layers = nn.ModuleList(
            nn.LSTM(input_size if i == 0 else proj_size, cell_size, num_layers=1, batch_first=True, proj_size=p)
            for i in range(num_layers)
        )
        self.output_size = proj_size
        self.residual = residual
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Run the stack left to right over ``x``.

        Args:
            x: (B, T, input_size).
        Returns:
            ``num_layers`` tensors (B, T, proj_size), lowest first (residuals included, before dropout
            of the next layer's input).
        """
        outputs = []
        h = x
        for i, lstm in enumerate(self.layers):
            y, _ = lstm(self.dropout(h) if i > 0 else h)  # (B, T, P)
            if i > 0 and self.residual:
                y = y + h
            outputs.append(y)
            h = y
        return outputs
