"""ELECTRA pretraining batches: BERT's masked rows without next-sentence pairs, plus the generator's sampling noise.

ELECTRA (Clark et al. 2020) reads the same instances as an MLM-only BERT: one stretch of a document as
``[CLS] A [SEP]`` (or documents packed into the row), with ``masked_lm_prob`` of its tokens picked for the
generator to predict (whole words with ``whole_word_mask``).  Two things differ, both from the paper's code
(``pretrain/pretrain_helpers.py`` of google-research/electra):

* a picked token becomes ``[MASK]`` 85 % of the time and stays unchanged 15 %, never a random token: the
  generator's samples are the replacements, so BERT's 10 % random tokens would only add noise;
* each row carries one uniform number per position (``sample_noise``) from which the model draws the
  generator's sample at that position (inverse-CDF sampling, :func:`lmforge.families.electra.model.sample_tokens`).
  Drawing the noise here, from the row's own generator, keeps the run a pure function of (config, data,
  seed) as for every family: the samples do not depend on how a batch is split over micro-batches or
  processes, a resumed run replays them, and validation sees the same replacements every time.

Every row is a function of its own ``numpy.random.Generator`` (the sampler protocol of ``lmforge.train``).
"""

from __future__ import annotations

import numpy as np
import torch

from ..bert.data import BertPretrainingSampler

#: share of the picked tokens replaced by ``[MASK]`` in the generator's input; the rest stay as they are
MASK_TOKEN_PROB = 0.85
_BELOW_ONE = np.nextafter(np.float32(1), np.float32(0))


class ElectraPretrainingSampler:
    """Masked rows for the generator and sampling noise for the discriminator's replacements.

    Args:
        shards: an opened :class:`lmforge.data.shards.Shards` made with a WordPiece tokenizer.
        max_seq_length, short_seq_prob, masked_lm_prob, max_predictions_per_seq, whole_word_mask,
            pack_documents, tokenizer: as for :class:`~lmforge.families.bert.data.BertPretrainingSampler` (which
            builds and masks the rows, next-sentence prediction off).
    """

    def __init__(
        self,
        shards,
        max_seq_length: int = 128,
        short_seq_prob: float = 0.1,
        masked_lm_prob: float = 0.15,
        max_predictions_per_seq: int | None = None,
        whole_word_mask: bool = False,
        pack_documents: bool = False,
        tokenizer=None,
    ):
        self.rows = BertPretrainingSampler(
            shards,
            max_seq_length=max_seq_length,
            short_seq_prob=short_seq_prob,
            masked_lm_prob=masked_lm_prob,
            max_predictions_per_seq=max_predictions_per_seq,
            next_sentence=False,
            whole_word_mask=whole_word_mask,
            pack_documents=pack_documents,
            tokenizer=tokenizer,
            mask_token_prob=MASK_TOKEN_PROB,
            random_token_prob=0.0,
        )
        self.max_seq_length = max_seq_length

    @property
    def tokenizer(self):
        return self.rows.tokenizer

    def batch(self, rngs: list[np.random.Generator], split: str) -> dict[str, torch.Tensor]:
        """One padded batch, row i drawn only from ``rngs[i]``.

        Returns:
            What :meth:`BertPretrainingSampler.batch` returns without NSP (``input_ids`` masked,
            ``attention_mask``, ``token_type_ids``, ``labels``: the original id at the picked positions,
            -100 elsewhere; ``document_ids`` with ``pack_documents``), plus ``sample_noise`` (B, T) float32
            uniforms in [0, 1).
        """
        out = self.rows.batch(rngs, split)
        T = out["input_ids"].shape[1]
        # a fixed-length draw per row, cut to the batch's length: a row's noise never depends on the other rows
        noise = np.stack([rng.random(self.max_seq_length)[:T] for rng in rngs]).astype(np.float32)
        noise = np.minimum(noise, _BELOW_ONE)  # float32 rounds the largest doubles below 1 up to 1
        out["sample_noise"] = torch.from_numpy(noise)
        return out


__all__ = ["ElectraPretrainingSampler", "MASK_TOKEN_PROB"]
