"""The transfer model and its inputs: batches of encodings, the body + head, stored feature vectors as batches.

- :func:`collate` pads encodings into the body's inputs plus the head's read-out indices;
- :class:`TransferModel` runs the body and cuts out the ``(B, n, L, C)`` blocks the head reads
  (rows, mean-pooled segments, or BERT's tanh pooler on ``[CLS]``);
- :class:`RowStore` holds vectors computed once (features mode) and serves the same blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .encoding import Encoding
from .heads import TaskHead


def collate(encs: Sequence[Encoding], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad encodings into body inputs plus the head's read-out indices.

    Returns:
        ``input_ids``, ``attention_mask``, ``token_type_ids``, ``segment`` (B, T); and either
        ``rows`` (B, n) or ``mean_segments`` (B, S); ``row_mask`` (B, n or S).
    """
    B = len(encs)
    T = max(1, max(len(e.input_ids) for e in encs))
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    att = torch.zeros(B, T, dtype=torch.long)
    types = torch.zeros(B, T, dtype=torch.long)
    seg = torch.full((B, T), -1, dtype=torch.long)
    for b, e in enumerate(encs):
        n = len(e.input_ids)
        ids[b, :n] = torch.tensor(e.input_ids, dtype=torch.long)
        att[b, :n] = 1
        types[b, :n] = torch.tensor(e.token_type_ids, dtype=torch.long)
        seg[b, :n] = torch.tensor(e.segment, dtype=torch.long)
    out = {"input_ids": ids, "attention_mask": att, "token_type_ids": types, "segment": seg}
    if encs[0].mean_segments:
        S = max(len(e.mean_segments) for e in encs)
        ms = torch.full((B, S), -2, dtype=torch.long)
        rm = torch.zeros(B, S, dtype=torch.long)
        for b, e in enumerate(encs):
            ms[b, : len(e.mean_segments)] = torch.tensor(e.mean_segments)
            rm[b, : len(e.mean_segments)] = 1
        out["mean_segments"], out["row_mask"] = ms, rm
    else:
        n = max(1, max(len(e.rows) for e in encs))
        rows = torch.zeros(B, n, dtype=torch.long)
        rm = torch.zeros(B, n, dtype=torch.long)
        for b, e in enumerate(encs):
            rows[b, : len(e.rows)] = torch.tensor(e.rows, dtype=torch.long)
            rm[b, : len(e.rows)] = 1
        out["rows"], out["row_mask"] = rows, rm
    return out


def with_twins(encs: Sequence[Encoding]) -> list[Encoding]:
    """``encs`` followed by their twins (pairs read in both orders), or ``encs`` when none has one."""
    twins = [e.twin for e in encs if e.twin is not None]
    if twins and len(twins) != len(encs):  # pragma: no cover - a pair task gives every example a twin
        raise ValueError("a batch mixes pairs read in both orders with single inputs")
    return [*encs, *twins]


class TransferModel(nn.Module):
    """A body (the body interface of :mod:`lmforge.models.base`) and a :class:`TaskHead`.

    Args:
        body: the pretrained model (``hidden_states``, ``transfer_layers``, ``hidden_size``, ``tokenizer``).
        head: the task head.
        layer_ids: which of ``body.hidden_states`` the head reads (lowest first).
        pooler: read BERT's tanh pooler on ``[CLS]`` of the top layer instead of the raw vectors.
    """

    def __init__(self, body: nn.Module, head: TaskHead, layer_ids: list[int], pooler: bool = False):
        super().__init__()
        self.body = body
        self.head = head
        self.layer_ids = list(layer_ids)
        self.pooler = pooler
        self.last_top: torch.Tensor | None = None

    def blocks(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the body and cut out what the head reads.

        Returns:
            blocks (B, n, L, C) and their (B, n) row mask.  The body's top states (B, T, C) stay in
            ``self.last_top`` for an auxiliary loss.
        """
        states = self.body.hidden_states(
            batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"]
        )
        self.last_top = states[-1]
        if self.pooler:
            pooled = self.body.bert.pooler(states[-1])  # (B, C): tanh(dense(h[CLS]))
            return pooled[:, None, None, :], batch["row_mask"][:, :1]
        h = torch.stack([states[i] for i in self.layer_ids], dim=2)  # (B, T, L, C)
        if "mean_segments" in batch:
            segs = batch["mean_segments"]  # (B, S) segment ids, -2 = none
            seg = batch["segment"]  # (B, T)
            pooled = []
            for s in range(segs.shape[1]):
                m = (seg == segs[:, s : s + 1]).to(h.dtype)  # (B, T)
                denom = m.sum(1).clamp_min(1.0)[:, None, None]  # (B, 1, 1)
                pooled.append((h * m[:, :, None, None]).sum(1) / denom)  # (B, L, C)
            return torch.stack(pooled, dim=1), batch["row_mask"]  # (B, S, L, C)
        rows = batch["rows"]  # (B, n)
        B, n = rows.shape
        L, C = h.shape[2], h.shape[3]
        idx = rows[:, :, None, None].expand(B, n, L, C)
        return h.gather(1, idx), batch["row_mask"]  # (B, n, L, C)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        blocks, mask = self.blocks(batch)
        return self.head(blocks, mask)


class RowStore:
    """Stored vectors (R, L, C) of N encodings, served as padded (B, n, L, C) batches.

    Args:
        vectors: every encoding's rows one after another.
        lengths: (N,) rows per encoding.
        owners: (N,) the example each encoding belongs to (QA windows and a question's choices share
            one; default: its own).
    """

    def __init__(self, vectors: torch.Tensor, lengths: torch.Tensor, owners: torch.Tensor | None = None):
        self.vectors = vectors.float()
        self.lengths = lengths.long()
        self.owners = torch.arange(len(self.lengths)) if owners is None else owners.long()
        self.starts = torch.cat([torch.zeros(1, dtype=torch.long), self.lengths.cumsum(0)])

    def __len__(self) -> int:
        return len(self.lengths)

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per (layer, channel) mean and std over all rows: (L, C) each."""
        if self.vectors.shape[0] == 0:
            L, C = self.vectors.shape[1:]
            return torch.zeros(L, C), torch.ones(L, C)
        return self.vectors.mean(0), self.vectors.std(0, unbiased=False)

    def layers(self, ids: Sequence[int]) -> RowStore:
        """The same rows with only the layers at ``ids``."""
        return RowStore(self.vectors[:, list(ids)], self.lengths, self.owners)

    def subset(self, idx: Sequence[int]) -> RowStore:
        """The store of the examples at ``idx`` (in that order; each with all of its encodings)."""
        by_owner: dict[int, list[int]] = {}
        for w, o in enumerate(self.owners.tolist()):
            by_owner.setdefault(o, []).append(w)
        windows, owners = [], []
        for k, i in enumerate(idx):
            windows += by_owner.get(int(i), [])
            owners += [k] * len(by_owner.get(int(i), []))
        parts = [self.vectors[int(self.starts[w]) : int(self.starts[w + 1])] for w in windows]
        L, C = self.vectors.shape[1:]
        vectors = torch.cat(parts) if parts else torch.zeros(0, L, C)
        return RowStore(vectors, self.lengths[windows], torch.tensor(owners, dtype=torch.long))

    def batch(self, idx: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        n = max(1, max(int(self.lengths[i]) for i in idx))
        L, C = self.vectors.shape[1:]
        blocks = torch.zeros(len(idx), n, L, C)
        mask = torch.zeros(len(idx), n, dtype=torch.long)
        for b, i in enumerate(idx):
            s, ln = int(self.starts[i]), int(self.lengths[i])
            blocks[b, :ln] = self.vectors[s : s + ln]
            mask[b, :ln] = 1
        return blocks, mask
