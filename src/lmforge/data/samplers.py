"""Samplers: turn token shards into training batches, one row per random generator.

``sampler.batch(rngs, split)`` draws row ``i`` only from ``rngs[i]``, so a batch is a pure function
of the generators' seeds: resuming a run or sharding it over ranks reproduces the same rows.

- :class:`CausalWindowSampler` (GPT): a random window of ``seq_len`` consecutive tokens of the split's
  stream (crossing documents through the BPE end-of-text token); ``labels`` are the ``input_ids``
  themselves (the model shifts them, as HF does).
- :class:`BiLMWindowSampler` (ELMo): a random window of up to ``seq_len`` tokens inside one document,
  padded with the tokenizer's pad id; the model predicts the next token (forward LM) and the previous
  token (backward LM) from the same ``labels``.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import DataError

IGNORE_INDEX = -100


def _split_tokens(shards, split: str) -> np.ndarray:
    tokens = shards.tokens(split)
    if len(tokens) == 0:
        raise DataError(
            f"the {split} split of {shards.path} is empty; prepare the corpus with a --val-fraction that gives "
            "it at least one document (and at least two documents in the corpus)"
        )
    return tokens


def _pad_id(tokenizer) -> int:
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else tokenizer.eot_id
    return int(pad) if pad is not None else 0


class CausalWindowSampler:
    """Random windows of ``seq_len`` tokens for causal LM training.

    Args:
        shards: an opened :class:`lmforge.data.shards.Shards`.
        seq_len: T, tokens per row.
    Batch:
        ``input_ids`` (B, T) int64 and ``labels`` (B, T) = ``input_ids``. Only when a split holds
        fewer than T tokens are rows right-padded (pad id, label -100) and ``attention_mask`` (B, T)
        added.
    """

    def __init__(self, shards, seq_len: int):
        if seq_len < 2:
            raise DataError(f"seq_len must be at least 2, not {seq_len}")
        self.shards = shards
        self.seq_len = int(seq_len)
        self.pad_id = _pad_id(shards.tokenizer())

    def batch(self, rngs: list[np.random.Generator], split: str = "train") -> dict[str, torch.Tensor]:
        """One window per generator; see the class docstring for the keys and shapes."""
        tokens = _split_tokens(self.shards, split)
        N, T = len(tokens), self.seq_len
        rows = np.full((len(rngs), T), self.pad_id, dtype=np.int64)  # (B, T)
        if N >= T:
            for i, rng in enumerate(rngs):
                start = int(rng.integers(0, N - T + 1))
                rows[i] = tokens[start:start + T]
            ids = torch.from_numpy(rows)
            return {"input_ids": ids, "labels": ids.clone()}
        rows[:, :N] = tokens[:N]
        ids = torch.from_numpy(rows)
        mask = torch.zeros_like(ids)
        mask[:, :N] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, IGNORE_INDEX)}

    def tokens_per_batch(self, batch_size: int) -> int:
        return batch_size * self.seq_len


class BiLMWindowSampler:
    """Random windows of up to ``seq_len`` tokens inside one document, for a bidirectional LM (ELMo).

    A position is drawn uniformly over the split's tokens; the window starts there, moved back so it
    stays inside that position's document when the document is long enough; rows from short documents
    (or ending at a document's end) are right-padded.

    Args:
        shards: an opened :class:`lmforge.data.shards.Shards`.
        seq_len: T, the longest row.
    Batch:
        ``input_ids`` (B, T) int64, ``attention_mask`` (B, T) (1 = token), ``labels`` (B, T) =
        ``input_ids`` with -100 on padding.
    """

    def __init__(self, shards, seq_len: int):
        if seq_len < 2:
            raise DataError(f"seq_len must be at least 2, not {seq_len}")
        self.shards = shards
        self.seq_len = int(seq_len)
        self.pad_id = _pad_id(shards.tokenizer())
        self._doc_bounds: dict[str, np.ndarray] = {}

    def _bounds(self, split: str) -> np.ndarray:
        """Token offsets where each document starts, plus the end (n_docs + 1,)."""
        if split not in self._doc_bounds:
            sentences = self.shards.sentences(split)
            self._doc_bounds[split] = np.asarray(sentences[np.asarray(self.shards.documents(split))], dtype=np.int64)
        return self._doc_bounds[split]

    def batch(self, rngs: list[np.random.Generator], split: str = "train") -> dict[str, torch.Tensor]:
        """One window per generator; see the class docstring for the keys and shapes."""
        tokens = _split_tokens(self.shards, split)
        bounds = self._bounds(split)
        N, T = len(tokens), self.seq_len
        rows = np.full((len(rngs), T), self.pad_id, dtype=np.int64)  # (B, T)
        mask = np.zeros((len(rngs), T), dtype=np.int64)  # (B, T)
        for i, rng in enumerate(rngs):
            p = int(rng.integers(0, N))
            d = int(np.searchsorted(bounds, p, side="right")) - 1
            doc_start, doc_end = int(bounds[d]), int(bounds[d + 1])
            start = max(doc_start, min(p, doc_end - T))
            end = min(start + T, doc_end)
            rows[i, : end - start] = tokens[start:end]
            mask[i, : end - start] = 1
        ids = torch.from_numpy(rows)
        m = torch.from_numpy(mask)
        return {"input_ids": ids, "attention_mask": m, "labels": ids.masked_fill(m == 0, IGNORE_INDEX)}

    def tokens_per_batch(self, batch_size: int) -> int:
        return batch_size * self.seq_len
