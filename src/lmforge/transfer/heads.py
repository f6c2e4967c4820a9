"""Task heads: what is trained on top of a body's vectors, in every transfer mode.

A head reads *blocks*: ``(B, n, L, C)`` vectors, ``n`` rows per example (one pooled sentence, two
pooled sentences of a plain pair, one row per word for tagging, one per position for QA or a
BiLSTM head) and ``L`` layers of the body, with a ``(B, n)`` mask of real rows.  It

1. optionally standardises each (layer, channel) with statistics of the training vectors (the
   features mode's logistic regression wants inputs of unit scale);
2. combines the ``L`` layers with a learned :class:`~lmforge.nn.scalar_mix.ScalarMix`
   (``gamma * sum_j softmax(w)_j h_j``, ELMo's recipe), or takes the single layer given;
3. applies the task's output layer:

| task | output | shape |
|---|---|---|
| classify / pair | class scores from the pooled vector (plain pairs: ``[a, b, |a-b|, a*b]``) | (B, K) |
| choice | one score for each (context, choice) input, read as a pair (K = 1) | (B, 1) |
| tokens | tag scores of each word | (B, n, K) |
| qa | start and end scores of each position | (B, n, 2) |

The classifier is ``linear`` (dropout + Linear: the standard fine-tuning head), ``logreg`` (a
Linear: logistic regression), ``mlp`` (Linear-ReLU-dropout-Linear) or ``bilstm`` (a small
bidirectional LSTM over the rows, then max-pooled for sentences or per row for tagging).
"""

from __future__ import annotations

import torch
from torch import nn

from ..data.task_data import SENTENCE_TASKS
from ..nn.scalar_mix import ScalarMix

CLASSIFIERS = ("linear", "logreg", "mlp", "bilstm")


class TaskHead(nn.Module):
    """The trainable head of a transfer run.

    Args:
        task: ``classify``, ``pair``, ``tokens``, ``qa`` or ``choice``.
        hidden_size: C, the body's vector size.
        num_layers: L, how many layers each block carries.
        num_labels: K classes or tags (ignored for QA).
        classifier: one of :data:`CLASSIFIERS`.
        layer_mix: mix the L layers with a ScalarMix (else L must be 1).
        pair_rows: the pooled input has two rows (a plain pair) to combine as ``[a, b, |a-b|, a*b]``.
        dropout: dropout before the output layer (``linear`` / ``mlp`` / ``bilstm``).
        mlp_hidden: hidden width of ``mlp``; LSTM size per direction of ``bilstm``.
    """

    def __init__(
        self,
        task: str,
        hidden_size: int,
        num_layers: int,
        num_labels: int,
        classifier: str = "linear",
        layer_mix: bool = False,
        pair_rows: bool = False,
        dropout: float = 0.1,
        mlp_hidden: int = 128,
    ):
        super().__init__()
        if classifier not in CLASSIFIERS:
            raise ValueError(f"unknown classifier '{classifier}'; choose one of {', '.join(CLASSIFIERS)}")
        if not layer_mix and num_layers != 1:
            raise ValueError(f"a head without layer mixing reads one layer, got {num_layers}")
        self.task = task
        self.classifier = classifier
        self.pair_rows = pair_rows
        self.num_layers = num_layers
        self.scalar_mix = ScalarMix(num_layers, do_layer_norm=False) if layer_mix else None
        # feature standardisation (identity until set_standardization is called)
        self.register_buffer("feat_mean", torch.zeros(num_layers, hidden_size))
        self.register_buffer("feat_std", torch.ones(num_layers, hidden_size))
        width = hidden_size
        self.lstm = None
        if classifier == "bilstm":
            self.lstm = nn.LSTM(hidden_size, mlp_hidden, batch_first=True, bidirectional=True)
            width = 2 * mlp_hidden
        if pair_rows:
            width *= 4
        out = num_labels  # the task's outputs per row (TaskSpec.num_outputs)
        self.drop = nn.Dropout(dropout if classifier != "logreg" else 0.0)
        if classifier == "mlp":
            self.out = nn.Sequential(
                nn.Linear(width, mlp_hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(mlp_hidden, out)
            )
        else:
            self.out = nn.Linear(width, out)

    @torch.no_grad()
    def set_standardization(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Standardise inputs with per (layer, channel) ``mean`` and ``std``, each (L, C)."""
        self.feat_mean.copy_(mean)
        self.feat_std.copy_(std.clamp_min(1e-6))

    def layer_weights(self) -> list[float] | None:
        """The learned softmax layer weights of the ScalarMix (None without one)."""
        return None if self.scalar_mix is None else [float(w) for w in self.scalar_mix.weights()]

    def gamma(self) -> float | None:
        return None if self.scalar_mix is None else float(self.scalar_mix.gamma.detach())

    def readout(self, blocks: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """What the output layer reads: (B, D) for sentence tasks, (B, n, D) per row otherwise.

        Args:
            blocks: (B, n, L, C) body vectors.
            mask: (B, n) 1 for real rows, 0 for padding rows.
        """
        x = (blocks - self.feat_mean) / self.feat_std  # (B, n, L, C)
        if self.scalar_mix is not None:
            x = self.scalar_mix(list(x.unbind(dim=2)))  # (B, n, C)
        else:
            x = x[:, :, 0]  # (B, n, C)
        m = mask.to(x.dtype).unsqueeze(-1)  # (B, n, 1)
        if self.lstm is not None:
            lengths = mask.sum(1).clamp_min(1).cpu()
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            y, _ = self.lstm(packed)
            x, _ = nn.utils.rnn.pad_packed_sequence(y, batch_first=True, total_length=blocks.shape[1])  # (B, n, 2H)
            if self.task in SENTENCE_TASKS:
                return x.masked_fill(m == 0, float("-inf")).max(dim=1).values  # (B, 2H)
        if self.task in SENTENCE_TASKS:
            if self.pair_rows:
                a, b = x[:, 0], x[:, 1]  # (B, C) each
                return torch.cat([a, b, (a - b).abs(), a * b], dim=-1)  # (B, 4C)
            return x[:, 0]  # (B, C)
        return x  # (B, n, C)

    def forward(self, blocks: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Args:
            blocks: (B, n, L, C) body vectors.
            mask: (B, n) 1 for real rows, 0 for padding rows.
        Returns:
            (B, K) for classify/pair/choice, (B, n, K) for tokens, (B, n, 2) for qa.
        """
        return self.out(self.drop(self.readout(blocks, mask)))
