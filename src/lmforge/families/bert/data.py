"""BERT pretraining instances, built at batch time: ``[CLS] A [SEP] B [SEP]`` with dynamic masking.

This follows the recipe of Google's ``create_pretraining_data.py`` but draws every instance fresh
from the token shards instead of writing ``dupe_factor`` masked copies to disk:

1. target length ``max_seq_length - 3``; with probability ``short_seq_prob`` a random length in
   [2, target] instead (so that the model also sees short inputs);
2. a chunk of whole sentences from one document is gathered until it reaches the target length
   (or the document ends); A is its first ``randint(1, len(chunk) - 1)`` sentences;
3. half of the time B is the rest of the chunk (IsNext); otherwise B is sentences from a random
   position in another random document, filling the rest of the target length (NotNext);
4. ``truncate_seq_pair`` trims the longer of A and B, one token at a time from a random end, until
   the pair fits in ``max_seq_length - 3``;
5. ``round(masked_lm_prob * n)`` of the n tokens other than ``[CLS]`` / ``[SEP]`` (``[UNK]`` included;
   at least 1, at most ``max_predictions_per_seq``, by default ``round(masked_lm_prob * max_seq_length)``)
   are picked; each becomes ``[MASK]`` 80 % of the time, a random
   token 10 %, and stays unchanged 10 % (``mask_token_prob``, ``random_token_prob``).  Labels hold the
   original id there and -100 elsewhere.
   With ``whole_word_mask`` whole words are picked: a word is a token plus its ``##``
   continuations, or, for Chinese (one token per character, no ``##``), a ``jieba`` word.

Without NSP a row is one stretch of one document, so a corpus of short lines (tweets, reviews) leaves
most of each padded batch empty.  ``pack_documents`` fills the row instead with the stretch and the
documents after it, a ``[SEP]`` between two documents (RoBERTa's FULL-SENTENCES inputs), and numbers
the documents (``document_ids``) so that the model keeps attention inside each and restarts its
positions: a packed row costs one row but teaches like several short ones.

IsNext is decided first (a fair coin) and its chunk starts at a sentence that has a successor in its
document, so the IsNext share is exactly 50 % in expectation (the original forces NotNext for
one-sentence chunks, which biases it below half).  Every row is a pure function of its own
``numpy.random.Generator`` (the sampler protocol of ``lmforge.train``).
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from ...errors import ConfigError, DataError, require
from ...text import is_cjk

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class MaskedLMRecipe:
    """The pretraining-data recipe of BERT and ELECTRA rows (``create_pretraining_data.py``'s flags, applied at
    batch time); saved under ``data`` in a run's ``train_config.json``, set with ``--set`` like model keys.

    ``max_seq_length`` None: 128, or the model's positions when it has fewer.
    ``max_predictions_per_seq`` None: ``round(masked_lm_prob * max_seq_length)``.
    """

    max_seq_length: int | None = None
    short_seq_prob: float = 0.1
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int | None = None
    whole_word_mask: bool = False
    pack_documents: bool = False  # MLM only: fill each row with several documents, [SEP] between them

    def __post_init__(self) -> None:
        if not 0.0 <= self.short_seq_prob < 1.0:
            raise ConfigError(f"short_seq_prob must be in [0, 1), got {self.short_seq_prob}")
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ConfigError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq < 1:
            raise ConfigError(f"max_predictions_per_seq must be >= 1, got {self.max_predictions_per_seq}")

    def seq_length(self, max_positions: int) -> int:
        """The row length for a model with ``max_positions`` positions (a one-line error when it does not fit)."""
        n = self.max_seq_length if self.max_seq_length is not None else min(128, max_positions)
        if not 5 <= n <= max_positions:
            raise ConfigError(f"max_seq_length must be in [5, max_position_embeddings={max_positions}], got {n}")
        return n




@dataclasses.dataclass
class _SplitIndex:
    """Sentence/document tables of one split, restricted to non-empty sentences."""

    tokens: np.ndarray  # (n_tokens,) memmap
    start: np.ndarray  # (S,) first token of each non-empty sentence
    end: np.ndarray  # (S,) one past its last token
    csum: np.ndarray  # (S + 1,) cumulative sentence lengths: tokens in sentences [i, j) = csum[j] - csum[i]
    doc_of: np.ndarray  # (S,) document of each sentence
    doc_first: np.ndarray  # (D,) first sentence of each document
    doc_stop: np.ndarray  # (D,) one past its last sentence
    has_next: np.ndarray  # sentences followed by another sentence of the same document


class BertPretrainingSampler:
    """MLM (+ NSP) batches drawn from WordPiece token shards, one row per random generator.

    Args:
        shards: an opened :class:`lmforge.data.shards.Shards` (``tokens``, ``sentences``,
            ``documents`` per split) made with a WordPiece tokenizer.
        max_seq_length: the longest instance, specials included.
        short_seq_prob: probability of a shorter random target length.
        masked_lm_prob: share of the non-special tokens to predict.
        max_predictions_per_seq: cap on the predicted tokens per instance (default
            ``round(masked_lm_prob * max_seq_length)``, so the masking rate holds at every length).
        next_sentence: build ``[CLS] A [SEP] B [SEP]`` pairs with an NSP label; False builds
            ``[CLS] A [SEP]`` from one stretch of a document (RoBERTa-style MLM only).
        whole_word_mask: mask whole words (``##`` continuations; ``jieba`` words for Chinese).
        pack_documents: without NSP, carry on into the following documents until the row is full,
            with ``[SEP]`` between documents.
        tokenizer: the shards' tokenizer (default: ``shards.tokenizer()``).
        mask_token_prob, random_token_prob: shares of the picked tokens that become ``[MASK]`` and a random
            token (the rest stay unchanged): BERT's 0.8 / 0.1; ELECTRA's generator reads 0.85 / 0.0.
    """

    def __init__(
        self,
        shards,
        max_seq_length: int = 128,
        short_seq_prob: float = 0.1,
        masked_lm_prob: float = 0.15,
        max_predictions_per_seq: int | None = None,
        next_sentence: bool = True,
        whole_word_mask: bool = False,
        pack_documents: bool = False,
        tokenizer=None,
        mask_token_prob: float = 0.8,
        random_token_prob: float = 0.1,
    ):
        tok = tokenizer if tokenizer is not None else shards.tokenizer()
        if getattr(tok, "kind", None) != "wordpiece":
            raise DataError(
                f"BERT pretraining needs shards made with a WordPiece tokenizer, not '{getattr(tok, 'kind', '?')}'; "
                "train one with kind=wordpiece and prepare the data with it"
            )
        if max_seq_length < 5:
            raise DataError(f"max_seq_length must be at least 5 ([CLS] A [SEP] B [SEP]), got {max_seq_length}")
        self.shards = shards
        self.tokenizer = tok
        self.max_seq_length = max_seq_length
        self.short_seq_prob = short_seq_prob
        self.masked_lm_prob = masked_lm_prob
        if max_predictions_per_seq is None:
            max_predictions_per_seq = max(1, int(round(masked_lm_prob * max_seq_length)))
        self.max_predictions_per_seq = max_predictions_per_seq
        self.next_sentence = next_sentence
        self.whole_word_mask = whole_word_mask
        if pack_documents and next_sentence:
            raise DataError("pack_documents fills MLM-only rows; turn next_sentence off to pack documents")
        self.pack_documents = pack_documents
        if min(mask_token_prob, random_token_prob) < 0 or mask_token_prob + random_token_prob > 1:
            raise DataError(f"mask_token_prob {mask_token_prob} and random_token_prob {random_token_prob} must be "
                            ">= 0 and add up to at most 1")
        self.mask_token_prob, self.random_token_prob = mask_token_prob, random_token_prob
        self.cls_id, self.sep_id, self.pad_id, self.mask_id = tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id
        V = tok.vocab_size
        specials = sorted(int(i) for i in tok.special_ids)
        special = np.zeros(V, dtype=bool)
        special[specials] = True
        self._normal_ids = np.flatnonzero(~special)  # random replacements never insert a special token
        # what is never predicted: [CLS], [SEP] and padding; [UNK] is masked like any word (Google's recipe)
        self._special = np.zeros(V, dtype=bool)
        self._special[[self.cls_id, self.sep_id, self.pad_id]] = True
        self._splits: dict[str, _SplitIndex] = {}
        if whole_word_mask:
            self._build_word_tables(tok, V)

    # -- tables ---------------------------------------------------------------------------------
    def _build_word_tables(self, tok, V: int) -> None:
        self._continuation = np.zeros(V, dtype=bool)  # "##xx" tokens continue the previous word
        self._cjk_char = np.zeros(V, dtype=bool)  # single CJK characters: jieba decides the words
        self._chars: dict[int, str] = {}
        for i in range(V):
            s = tok.id_to_token(i) or ""
            if s.startswith("##") and len(s) > 2:
                self._continuation[i] = True
            elif len(s) == 1 and is_cjk(s):
                self._cjk_char[i] = True
                self._chars[i] = s
        if self._cjk_char.any():
            jieba = require("jieba", "zh")
            jieba.setLogLevel(logging.WARNING)
            self._jieba = jieba
        else:
            self._jieba = None

    def split_index(self, split: str) -> _SplitIndex:
        """The sentence/document tables of ``split`` (built once, cached)."""
        if split in self._splits:
            return self._splits[split]
        tokens = self.shards.tokens(split)
        sent = np.asarray(self.shards.sentences(split), dtype=np.int64)
        docs = np.asarray(self.shards.documents(split), dtype=np.int64)
        start, end = sent[:-1], sent[1:]
        doc_of_all = np.repeat(np.arange(len(docs) - 1), np.diff(docs))  # (n_sentences,)
        keep = end > start
        start, end, doc_of = start[keep], end[keep], doc_of_all[keep]
        if len(start) == 0:
            raise DataError(f"the '{split}' split of the shards has no text; prepare them again with more data")
        # renumber documents that still have sentences
        doc_ids, doc_of = np.unique(doc_of, return_inverse=True)
        n_docs = len(doc_ids)
        doc_first = np.searchsorted(doc_of, np.arange(n_docs), side="left")
        doc_stop = np.searchsorted(doc_of, np.arange(n_docs), side="right")
        csum = np.concatenate([[0], np.cumsum(end - start)])
        has_next = np.flatnonzero(doc_of[:-1] == doc_of[1:])
        if self.next_sentence:
            if n_docs < 2:
                raise DataError(
                    f"next-sentence prediction needs at least 2 documents in the '{split}' split (found {n_docs}); "
                    "add documents (blank-line separated) or set next_sentence=false"
                )
            if len(has_next) == 0:
                raise DataError(
                    f"every document in the '{split}' split has a single sentence, so no B can follow an A; "
                    "keep documents together when preparing the data or set next_sentence=false"
                )
        idx = _SplitIndex(tokens, start, end, csum, doc_of, doc_first, doc_stop, has_next)
        self._splits[split] = idx
        return idx

    # -- one instance ---------------------------------------------------------------------------
    def _chunk_end(self, idx: _SplitIndex, s: int, target: int, min_sentences: int) -> int:
        """One past the last sentence of the chunk starting at sentence ``s``."""
        e = int(np.searchsorted(idx.csum, idx.csum[s] + target, side="left"))  # csum[e] >= csum[s] + target
        stop = int(idx.doc_stop[idx.doc_of[s]])
        return min(max(e, s + min_sentences), stop)

    def instance(self, rng: np.random.Generator, split: str) -> tuple[np.ndarray, np.ndarray, int]:
        """One unmasked instance.

        Returns:
            (ids, segment ids, NSP label): ``[CLS] A [SEP] B [SEP]`` (or ``[CLS] A [SEP]``), int64 arrays,
            label 0 = IsNext, 1 = NotNext, -1 without NSP.
        """
        idx = self.split_index(split)
        max_num = self.max_seq_length - (3 if self.next_sentence else 2)
        target = max_num
        if rng.random() < self.short_seq_prob:
            target = int(rng.integers(2, max_num + 1))
        toks = idx.tokens
        if not self.next_sentence:
            s = int(rng.integers(len(idx.start)))
            if self.pack_documents:
                a = self._packed(idx, s, target)
            else:
                e = self._chunk_end(idx, s, target, 1)
                a = np.asarray(toks[idx.start[s] : idx.end[e - 1]], dtype=np.int64)
            a = self._truncate_one(a, len(a) - max_num, rng) if len(a) > max_num else a
            ids = np.concatenate([[self.cls_id], a, [self.sep_id]])
            return ids, np.zeros(len(ids), dtype=np.int64), -1

        is_next = rng.random() < 0.5
        if is_next:
            s = int(idx.has_next[rng.integers(len(idx.has_next))])
            e = self._chunk_end(idx, s, target, 2)
        else:
            s = int(rng.integers(len(idx.start)))
            e = self._chunk_end(idx, s, target, 1)
        a_end = s + (int(rng.integers(1, e - s)) if e - s >= 2 else 1)
        a = np.asarray(toks[idx.start[s] : idx.end[a_end - 1]], dtype=np.int64)
        if is_next:
            b = np.asarray(toks[idx.start[a_end] : idx.end[e - 1]], dtype=np.int64)
        else:
            d = int(idx.doc_of[s])
            r = int(rng.integers(len(idx.doc_first) - 1))
            d2 = r + (r >= d)  # any document but this one
            s2 = int(rng.integers(idx.doc_first[d2], idx.doc_stop[d2]))
            e2 = self._chunk_end(idx, s2, max(1, target - len(a)), 1)
            b = np.asarray(toks[idx.start[s2] : idx.end[e2 - 1]], dtype=np.int64)
        a, b = self._truncate_pair(a, b, max_num, rng)
        ids = np.concatenate([[self.cls_id], a, [self.sep_id], b, [self.sep_id]])
        seg = np.zeros(len(ids), dtype=np.int64)
        seg[len(a) + 2 :] = 1
        return ids, seg, 0 if is_next else 1

    def _packed(self, idx: _SplitIndex, s: int, target: int) -> np.ndarray:
        """Sentences from ``s`` on, across documents (``[SEP]`` between two), cut at ``target`` tokens."""
        parts = []
        n = 0
        while n < target and s < len(idx.start):
            if parts:
                if n + 1 >= target:  # no room for a token after the separator
                    break
                parts.append(np.array([self.sep_id], dtype=np.int64))
                n += 1
            e = self._chunk_end(idx, s, target - n, 1)  # within the document of sentence s
            piece = np.asarray(idx.tokens[idx.start[s] : idx.end[e - 1]], dtype=np.int64)[: target - n]
            parts.append(piece)
            n += len(piece)
            s = e
        return np.concatenate(parts)

    @staticmethod
    def _truncate_one(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
        """Drop ``k`` tokens, each from the front or the back with equal probability."""
        front = int((rng.random(k) < 0.5).sum())
        return x[front : len(x) - (k - front)]

    def _truncate_pair(self, a: np.ndarray, b: np.ndarray, max_num: int, rng: np.random.Generator):
        """``truncate_seq_pair``: trim the longer side (B on ties) from a random end until they fit.

        Done in two vectorised steps with the same outcome distribution as the token-by-token loop:
        first the longer side alone down to the shorter's length, then the two alternately.
        """
        excess = len(a) + len(b) - max_num
        if excess <= 0:
            return a, b
        la, lb = len(a), len(b)
        k = min(excess, abs(la - lb))
        if la > lb:
            a = self._truncate_one(a, k, rng)
        elif k:
            b = self._truncate_one(b, k, rng)
        excess -= k
        if excess > 0:  # equal lengths now: B, A, B, A, ...
            b = self._truncate_one(b, (excess + 1) // 2, rng)
            a = self._truncate_one(a, excess // 2, rng)
        return a, b

    # -- masking --------------------------------------------------------------------------------
    def _word_starts(self, ids: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """For each candidate position, does a new word start there?  (Whole-word masking.)"""
        cont = self._continuation[ids[cand]].copy()
        if self._jieba is not None:
            cjk = self._cjk_char[ids[cand]]
            if cjk.any():
                cont |= self._jieba_continuations(ids, cand, cjk)
        starts = ~cont
        starts[0] = True
        starts[1:] |= cand[1:] != cand[:-1] + 1  # a word never spans a special token
        return starts

    def _jieba_continuations(self, ids: np.ndarray, cand: np.ndarray, cjk: np.ndarray) -> np.ndarray:
        """Mark CJK characters that are not the first character of their jieba word."""
        cont = np.zeros(len(cand), dtype=bool)
        # runs of adjacent CJK characters, each segmented on its own
        brk = np.flatnonzero(~cjk[1:] | ~cjk[:-1] | (cand[1:] != cand[:-1] + 1)) + 1
        for run in np.split(np.arange(len(cand)), brk):
            if len(run) < 2 or not cjk[run[0]]:
                continue
            text = "".join(self._chars[int(i)] for i in ids[cand[run]])
            pos = 0
            for word in self._jieba.lcut(text, HMM=True):
                cont[run[pos + 1 : pos + len(word)]] = True
                pos += len(word)
        return cont

    def mask(self, ids: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Dynamic masking of one instance.

        Args:
            ids: (T,) instance ids with specials.
            rng: the row's generator.
        Returns:
            (masked ids, labels): labels hold the original id at predicted positions, -100 elsewhere.
        """
        cand = np.flatnonzero(~self._special[ids])  # positions of non-special tokens
        n = len(cand)
        labels = np.full(len(ids), -100, dtype=np.int64)
        if n == 0:
            return ids, labels
        k = min(self.max_predictions_per_seq, max(1, int(round(n * self.masked_lm_prob))))
        if self.whole_word_mask:
            starts = self._word_starts(ids, cand)
            word_of = np.cumsum(starts) - 1  # (n,) word index of each candidate
            bounds = np.flatnonzero(np.concatenate([starts, [True]]))  # word w = cand[bounds[w]:bounds[w+1]]
            lengths = np.diff(bounds)
            chosen = []
            total = 0
            for w in rng.permutation(len(lengths)):
                if total >= k:
                    break
                if total + lengths[w] > k:
                    continue  # as the original: skip a word that would overshoot, try smaller ones
                chosen.append(w)
                total += int(lengths[w])
            pos = cand[np.isin(word_of, chosen)] if chosen else cand[:0]
        else:
            pos = cand[rng.permutation(n)[:k]]
        out = ids.copy()
        labels[pos] = ids[pos]
        u = rng.random(len(pos))
        replacement = self._normal_ids[rng.integers(len(self._normal_ids), size=len(pos))]
        out[pos[u < self.mask_token_prob]] = self.mask_id
        rand = (u >= self.mask_token_prob) & (u < self.mask_token_prob + self.random_token_prob)
        out[pos[rand]] = replacement[rand]
        return out, labels

    # -- the sampler protocol ---------------------------------------------------------------------
    def batch(self, rngs: list[np.random.Generator], split: str) -> dict[str, torch.Tensor]:
        """One padded batch, row i drawn only from ``rngs[i]``.

        Returns:
            ``input_ids``, ``attention_mask``, ``token_type_ids``, ``labels`` (B, T) int64 with
            T = the longest row, ``next_sentence_label`` (B,) when NSP is on, and with
            ``pack_documents`` ``document_ids`` (B, T): 1, 2, ... for the documents of a row, 0 for padding.
        """
        rows = []
        for rng in rngs:
            ids, seg, nsp = self.instance(rng, split)
            masked, labels = self.mask(ids, rng)
            rows.append((masked, seg, labels, nsp))
        B, T = len(rows), max(len(r[0]) for r in rows)
        input_ids = np.full((B, T), self.pad_id, dtype=np.int64)
        attention = np.zeros((B, T), dtype=np.int64)
        segments = np.zeros((B, T), dtype=np.int64)
        labels = np.full((B, T), -100, dtype=np.int64)
        for i, (m, s, lab, _) in enumerate(rows):
            n = len(m)
            input_ids[i, :n], attention[i, :n], segments[i, :n], labels[i, :n] = m, 1, s, lab
        out = {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention),
            "token_type_ids": torch.from_numpy(segments),
            "labels": torch.from_numpy(labels),
        }
        if self.next_sentence:
            out["next_sentence_label"] = torch.tensor([r[3] for r in rows], dtype=torch.long)
        if self.pack_documents:
            # document k of a row: its tokens and the [SEP] that ends it (the [CLS] joins document 1)
            docs = np.zeros((B, T), dtype=np.int64)
            for i, (m, *_) in enumerate(rows):
                sep = (m == self.sep_id).astype(np.int64)
                docs[i, : len(m)] = 1 + np.cumsum(sep) - sep
            out["document_ids"] = torch.from_numpy(docs)
        return out


__all__ = ["BertPretrainingSampler"]
