"""Pretraining diagnostics the validation pass reports: token-vector collapse and the replaced-token detector's AUC.

* :func:`token_cosine` - ``token_cos``: how alike a model's top-layer vectors of different tokens are.  For each
  row of a batch, the mean cosine over every pair of distinct non-padding positions i != j of that row; then
  the mean over the rows with at least two such positions.  1.0 means every token of a row has the same
  direction (the vectors have collapsed and carry nothing that tells the tokens apart); values near 0 mean
  spread-out directions.  Trained encoders sit in between: the shared direction every token vector has
  (anisotropy, Ethayarajh 2019, https://arxiv.org/abs/1909.00512) raises it well above 0.
* :func:`roc_auc` - ``rtd_auc``: the area under the ROC curve of a detector's scores against binary labels,
  the probability that a random positive scores above a random negative (ties count half).  0.5 is chance:
  ELECTRA's discriminator at 0.5 tells replaced tokens from original ones no better than a coin.

Both are computed on the device from tensors the forward pass already holds, without a second pass and
without drawing random numbers, so reporting them changes no weight of a run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_cosine(h: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean pairwise cosine between the token vectors of each row, averaged over rows (``token_cos``).

    With unit vectors u_1..u_n of a row's n tokens, the mean over the n(n-1) ordered pairs i != j of
    u_i . u_j is (|sum u_i|^2 - sum |u_i|^2) / (n(n-1)): one sum per row, no n x n matrix.  A zero vector
    has cosine 0 with every other one.

    Args:
        h: (B, T, C) token vectors (any float dtype; computed in fp32).
        mask: (B, T) 1/True for the tokens to count (not padding); None = every position.
    Returns:
        A scalar fp32 tensor; NaN when no row has two tokens.
    """
    u = F.normalize(h.detach().float(), dim=-1)  # (B, T, C)
    m = torch.ones(h.shape[:2], device=h.device) if mask is None else mask.to(device=h.device, dtype=torch.float32)
    u = u * m.unsqueeze(-1)
    n = m.sum(1)  # (B,)
    total = u.sum(1).pow(2).sum(-1)  # (B,) |sum u_i|^2
    self_pairs = u.pow(2).sum((1, 2))  # (B,) sum |u_i|^2 (n, less the zero vectors)
    rows = (n >= 2).float()
    per_row = (total - self_pairs) / (n * (n - 1)).clamp(min=1)
    return (per_row * rows).sum() / rows.sum()  # 0 / 0 = NaN without a row of two tokens; nothing read back


def roc_auc(scores: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """The ROC AUC of ``scores`` for ``positive`` by the rank formula (Mann-Whitney U), ties given mid-ranks.

    AUC = (sum of the positives' ranks - P(P+1)/2) / (P N) over P positives and N negatives: the same number as
    ``sklearn.metrics.roc_auc_score(positive, scores)``, on the device.

    Args:
        scores: any shape; higher = more likely positive.
        positive: bool, the same shape.
    Returns:
        A scalar fp32 tensor in [0, 1]; NaN when there is no positive or no negative.
    """
    s = scores.detach().reshape(-1).double()
    pos = positive.reshape(-1).bool()
    n_pos = pos.sum().double()
    n_neg = pos.numel() - n_pos
    if s.numel() == 0:
        return torch.full((), float("nan"), device=scores.device)
    _, inverse, counts = torch.unique(s, sorted=True, return_inverse=True, return_counts=True)
    first = torch.cumsum(counts, 0) - counts  # 0-based rank of the first member of each tied group
    mid_rank = first.double() + (counts.double() + 1) / 2  # 1-based mean rank of each group
    rank_sum = mid_rank[inverse][pos].sum()
    auc = (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return torch.where((n_pos > 0) & (n_neg > 0), auc, torch.full_like(auc, float("nan"))).float()


__all__ = ["roc_auc", "token_cosine"]
