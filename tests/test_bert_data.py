"""BERT pretraining data: the create_pretraining_data.py recipe, measured over >= 10,000 instances.

Most checks run on a synthetic stand-in for the shards in which token id = 5 + position in the
stream, so every token tells where it came from (document, sentence) and the tests can verify
"B follows A in the source" and "B comes from another document" from the batch alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmforge.errors import DataError
from lmforge.families.bert.data import BertPretrainingSampler

N_SPECIAL = 5  # [PAD] [UNK] [CLS] [SEP] [MASK] = 0..4
PAD, UNK, CLS, SEP, MASK = range(N_SPECIAL)


class StandInTokenizer:
    """Just the tokenizer attributes the sampler reads."""

    def __init__(self, vocab: list[str], kind: str = "wordpiece"):
        self.kind = kind
        self._vocab = vocab
        self.vocab_size = len(vocab)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = PAD, UNK, CLS, SEP, MASK
        self.special_ids = {PAD, UNK, CLS, SEP, MASK}

    def id_to_token(self, i: int) -> str:
        return self._vocab[i]


class StandInShards:
    """Shards-like object over in-memory arrays, the same layout for train and val."""

    def __init__(self, tokens: np.ndarray, sent_lengths: list[int], doc_sizes: list[int], tokenizer):
        self._tokens = tokens
        self._sentences = np.concatenate([[0], np.cumsum(sent_lengths)]).astype(np.int64)
        self._documents = np.concatenate([[0], np.cumsum(doc_sizes)]).astype(np.int64)
        self._tok = tokenizer

    def tokens(self, split):
        return self._tokens

    def sentences(self, split):
        return self._sentences

    def documents(self, split):
        return self._documents

    def tokenizer(self):
        return self._tok


def positional_shards(n_docs: int = 300, seed: int = 0, continuation_every: int = 0):
    """Token id = 5 + stream position.  Returns (shards, doc_of_position, sentence_starts)."""
    rng = np.random.default_rng(seed)
    doc_sizes = [int(rng.integers(1, 15)) for _ in range(n_docs)]
    sent_lengths = [int(rng.integers(1, 40)) for _ in range(sum(doc_sizes))]
    sent_lengths[3] = 0  # an empty sentence must not break anything
    n = sum(sent_lengths)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    for i in range(n):  # every k-th token is a "##" continuation when asked
        vocab.append(f"##p{i}" if continuation_every and i % continuation_every else f"p{i}")
    tokens = (np.arange(n) + N_SPECIAL).astype(np.uint32)
    shards = StandInShards(tokens, sent_lengths, doc_sizes, StandInTokenizer(vocab))
    sent_doc = np.repeat(np.arange(n_docs), doc_sizes)
    doc_of_pos = np.repeat(sent_doc, sent_lengths)
    sent_starts = np.concatenate([[0], np.cumsum(sent_lengths)])
    return shards, doc_of_pos, sent_starts


def draw(sampler, n: int, seed: int = 0, batch: int = 1000, split: str = "train"):
    batches = []
    for start in range(0, n, batch):
        rngs = [np.random.default_rng([seed, start + i]) for i in range(batch)]
        batches.append(sampler.batch(rngs, split))
    T = max(b["input_ids"].shape[1] for b in batches)

    def cat(key, fill):
        return torch.cat([torch.nn.functional.pad(b[key], (0, T - b[key].shape[1]), value=fill) for b in batches])

    out = {
        "input_ids": cat("input_ids", PAD),
        "attention_mask": cat("attention_mask", 0),
        "token_type_ids": cat("token_type_ids", 0),
        "labels": cat("labels", -100),
    }
    if "document_ids" in batches[0]:
        out["document_ids"] = cat("document_ids", 0)
    if "next_sentence_label" in batches[0]:
        out["next_sentence_label"] = torch.cat([b["next_sentence_label"] for b in batches])
    return {k: v.numpy() for k, v in out.items()}


@pytest.fixture(scope="module")
def positional():
    return positional_shards()


@pytest.fixture(scope="module")
def nsp_draw(positional):
    shards, _, _ = positional
    sampler = BertPretrainingSampler(shards, max_seq_length=128)
    return draw(sampler, 10_000)


def test_masking_statistics(nsp_draw):
    ids, labels, att = nsp_draw["input_ids"], nsp_draw["labels"], nsp_draw["attention_mask"]
    original = np.where(labels != -100, labels, ids)
    special = original < N_SPECIAL
    candidates = (~special) & (att == 1)
    masked = labels != -100
    assert not (masked & special).any(), "a special token was picked for prediction"
    assert (ids[special] == original[special]).all(), "a special token was changed"
    # exact per-row count: round(0.15 n), at least 1, capped by max_predictions_per_seq = round(0.15 * 128)
    n = candidates.sum(1)
    expected = np.minimum(19, np.maximum(1, np.array([int(round(0.15 * x)) for x in n])))
    assert (masked.sum(1) == expected).all()
    share = masked.sum() / candidates.sum()
    assert abs(share - 0.15) < 0.005, share
    picked_in, picked_orig = ids[masked], original[masked]
    as_mask = (picked_in == MASK).mean()
    kept = (picked_in == picked_orig).mean()
    random = ((picked_in != MASK) & (picked_in != picked_orig)).mean()
    assert abs(as_mask - 0.8) < 0.01 and abs(kept - 0.1) < 0.01 and abs(random - 0.1) < 0.01, (as_mask, kept, random)
    assert (picked_in[picked_in != MASK] >= N_SPECIAL).all(), "random replacement inserted a special token"
    # unpredicted tokens are never altered
    assert (ids[~masked] == original[~masked]).all()


def test_unk_is_masked_and_the_cap_follows_the_length():
    # every 7th token of the stream is [UNK]: Google's recipe predicts it like any word (only [CLS]/[SEP] never)
    shards, _, _ = positional_shards(n_docs=200, seed=3)
    shards._tokens = shards._tokens.copy()
    shards._tokens[::7] = UNK
    out = draw(BertPretrainingSampler(shards, max_seq_length=128), 2000)
    original = np.where(out["labels"] != -100, out["labels"], out["input_ids"])
    masked = out["labels"] != -100
    unk = (original == UNK) & (out["attention_mask"] == 1)
    share_unk = masked[unk].mean()
    assert abs(share_unk - 0.15) < 0.02, share_unk
    assert not masked[(original == CLS) | (original == SEP)].any()
    # long sequences: the default cap grows with the length, so the masking rate stays 15 %
    long = BertPretrainingSampler(shards, max_seq_length=512, short_seq_prob=0.0)
    assert long.max_predictions_per_seq == round(0.15 * 512)
    out = draw(long, 500)
    orig = np.where(out["labels"] != -100, out["labels"], out["input_ids"])
    cand = (out["attention_mask"] == 1) & ~np.isin(orig, [PAD, CLS, SEP])
    assert abs((out["labels"] != -100).sum() / cand.sum() - 0.15) < 0.01
    assert BertPretrainingSampler(shards, max_seq_length=512, max_predictions_per_seq=20).max_predictions_per_seq == 20


def _spans(row_ids, row_seg, row_att):
    n = int(row_att.sum())
    ids, seg = row_ids[:n], row_seg[:n]
    assert ids[0] == CLS and ids[-1] == SEP
    sep_a = int(np.flatnonzero(ids == SEP)[0])
    a, b = ids[1:sep_a], ids[sep_a + 1 : n - 1]
    assert (seg[: sep_a + 1] == 0).all() and (seg[sep_a + 1 :] == 1).all()
    return a - N_SPECIAL, b - N_SPECIAL  # stream positions


def test_next_sentence_pairs(nsp_draw, positional):
    _, doc_of, sent_starts = positional
    d = nsp_draw
    original = np.where(d["labels"] != -100, d["labels"], d["input_ids"])
    nsp = d["next_sentence_label"]
    assert abs((nsp == 0).mean() - 0.5) < 0.02
    boundaries = set(sent_starts.tolist())
    lengths = d["attention_mask"].sum(1)
    assert lengths.max() <= 128 and (d["attention_mask"][:, :1] == 1).all()
    for i in range(len(nsp)):
        a, b = _spans(original[i], d["token_type_ids"][i], d["attention_mask"][i])
        assert len(a) >= 1 and len(b) >= 1 and len(a) + len(b) <= 125
        # A and B are each one contiguous stretch of one document
        assert (np.diff(a) == 1).all() and (np.diff(b) == 1).all()
        assert doc_of[a[0]] == doc_of[a[-1]] and doc_of[b[0]] == doc_of[b[-1]]
        if nsp[i] == 0:  # IsNext: B starts after A ends, same document, split on a sentence boundary
            assert doc_of[a[0]] == doc_of[b[0]]
            assert b[0] > a[-1]
            assert any(p in boundaries for p in range(a[-1] + 1, b[0] + 1))
        else:
            assert doc_of[a[0]] != doc_of[b[0]]


def test_rows_depend_only_on_their_rng(positional):
    shards, _, _ = positional
    sampler = BertPretrainingSampler(shards, max_seq_length=64)
    one = sampler.batch([np.random.default_rng(7)], "train")
    many = sampler.batch([np.random.default_rng(s) for s in (3, 7, 9)], "train")
    n = int(one["attention_mask"].sum())
    for key in ("input_ids", "token_type_ids", "labels"):
        assert torch.equal(one[key][0, :n], many[key][1, :n])
    assert one["next_sentence_label"][0] == many["next_sentence_label"][1]
    again = sampler.batch([np.random.default_rng(s) for s in (3, 7, 9)], "train")
    assert all(torch.equal(many[k], again[k]) for k in many)


def test_mlm_only_single_segments(positional):
    shards, doc_of, _ = positional
    sampler = BertPretrainingSampler(shards, max_seq_length=64, next_sentence=False)
    d = draw(sampler, 2000, batch=500)
    assert "next_sentence_label" not in d
    assert (d["token_type_ids"] == 0).all()
    original = np.where(d["labels"] != -100, d["labels"], d["input_ids"])
    for row, att in zip(original, d["attention_mask"]):
        n = int(att.sum())
        assert n <= 64 and row[0] == CLS and row[n - 1] == SEP and (row[1 : n - 1] >= N_SPECIAL).all()
        pos = row[1 : n - 1] - N_SPECIAL
        assert (np.diff(pos) == 1).all() and doc_of[pos[0]] == doc_of[pos[-1]]


def test_packed_rows_fill_up_with_the_following_documents(positional):
    shards, doc_of, sent_starts = positional
    packed = BertPretrainingSampler(
        shards, max_seq_length=64, next_sentence=False, short_seq_prob=0.0, pack_documents=True
    )
    d = draw(packed, 2000, batch=500)
    assert (d["token_type_ids"] == 0).all()
    original = np.where(d["labels"] != -100, d["labels"], d["input_ids"])
    boundaries = set(sent_starts.tolist())
    crossed = 0
    for row, att, docs in zip(original, d["attention_mask"], d["document_ids"]):
        n = int(att.sum())
        assert row[0] == CLS and row[n - 1] == SEP
        assert (docs[n:] == 0).all() and docs[0] == 1 and docs[n - 1] == (row[: n] == SEP).sum()
        assert ((np.diff(docs[:n]) == 1) == (row[: n - 1] == SEP)).all()  # a new document after each [SEP]
        body = row[1 : n - 1]
        pieces = np.split(body, np.flatnonzero(body == SEP))
        pieces = [p[p != SEP] - N_SPECIAL for p in pieces]
        assert all(len(p) for p in pieces)
        for i, p in enumerate(pieces):
            # each piece is one stretch of one document; pieces are consecutive documents in the stream
            assert (np.diff(p) == 1).all() and doc_of[p[0]] == doc_of[p[-1]]
            if i:
                assert doc_of[p[0]] == doc_of[pieces[i - 1][-1]] + 1 or p[0] == pieces[i - 1][-1] + 1
                assert p[0] in boundaries  # a later document is read from its first sentence
        crossed += len(pieces) > 1
        # a row is full (or one short, where a separator would end it) unless the split ran out of text
        assert n >= 63 or pieces[-1][-1] == len(doc_of) - 1
    assert crossed > 400  # a row that starts late in its document (about a third here) spans two or more
    # on one-line documents of 1-20 tokens (tweets, reviews) rows without packing are mostly empty
    rng = np.random.default_rng(1)
    lines = [int(x) for x in rng.integers(1, 21, size=3000)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(sum(lines))]
    short = StandInShards(np.arange(5, sum(lines) + 5, dtype=np.uint32), lines, [1] * len(lines),
                          StandInTokenizer(vocab))
    plain = BertPretrainingSampler(short, max_seq_length=64, next_sentence=False, short_seq_prob=0.0)
    full = BertPretrainingSampler(short, max_seq_length=64, next_sentence=False, pack_documents=True,
                                  short_seq_prob=0.0)
    assert draw(plain, 1000, batch=500)["attention_mask"].sum(1).mean() < 13
    assert draw(full, 1000, batch=500)["attention_mask"].sum(1).mean() > 63
    masked = (d["labels"] != -100).sum() / ((original >= N_SPECIAL) & (d["attention_mask"] == 1)).sum()
    assert abs(masked - 0.15) < 0.01
    with pytest.raises(DataError, match="next_sentence"):
        BertPretrainingSampler(shards, max_seq_length=64, pack_documents=True)


def test_short_seq_prob():
    # one-token sentences in one long document: an instance is exactly as long as its target
    # (except in the last 62 tokens, where the document ends first: 0.3 % of starts)
    n = 20_000
    tok = StandInTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(n)])
    shards = StandInShards(np.arange(5, n + 5, dtype=np.uint32), [1] * n, [n], tok)
    sampler = BertPretrainingSampler(shards, max_seq_length=64, next_sentence=False, short_seq_prob=0.1)
    lengths = draw(sampler, 4000, batch=1000)["attention_mask"].sum(1)
    short = lengths < 64
    assert abs(short.mean() - 0.1) < 0.015
    assert lengths.min() >= 4  # target >= 2 tokens plus [CLS] and [SEP]
    assert np.unique(lengths[short]).size > 30  # short targets spread over [2, 61]


def _words_split(original, masked, is_start) -> bool:
    """True if some word (a start token plus its continuations, never across specials) is partly predicted."""
    o, m = original.ravel(), masked.ravel()
    special = o < N_SPECIAL
    prev_special = np.concatenate([[True], special[:-1]])
    starts = special | prev_special | is_start(o)
    bounds = np.flatnonzero(starts)
    lo = np.minimum.reduceat(m.astype(np.int8), bounds)
    hi = np.maximum.reduceat(m.astype(np.int8), bounds)
    return bool((lo != hi).any())


def test_whole_word_masking_english():
    shards, _, _ = positional_shards(n_docs=100, seed=1, continuation_every=3)  # words of 3 tokens
    sampler = BertPretrainingSampler(shards, max_seq_length=64, whole_word_mask=True)
    d = draw(sampler, 10_000, batch=1000)
    original = np.where(d["labels"] != -100, d["labels"], d["input_ids"])
    masked = d["labels"] != -100
    is_start = lambda tok: (tok - N_SPECIAL) % 3 == 0  # noqa: E731
    assert not _words_split(original, masked, is_start)
    # the per-token sampler on the same data does split words: the check can fail
    plain = draw(BertPretrainingSampler(shards, max_seq_length=64), 1000, batch=1000)
    assert _words_split(np.where(plain["labels"] != -100, plain["labels"], plain["input_ids"]),
                        plain["labels"] != -100, is_start)
    share = masked.sum() / ((original >= N_SPECIAL) & (d["attention_mask"] == 1)).sum()
    assert 0.12 < share <= 0.15 + 0.005  # whole words can undershoot the target, never overshoot it
    ids_m = d["input_ids"][masked]
    assert abs((ids_m == MASK).mean() - 0.8) < 0.01


CHINESE = [
    "我们在北京大学学习自然语言处理。",
    "今天的天气非常好，我们去公园散步吧。",
    "中华人民共和国成立于一九四九年。",
    "他喜欢阅读历史书籍和科学杂志。",
    "研究人员发现这种方法可以提高效率。",
    "经济发展需要科技创新和人才培养。",
]


def test_whole_word_masking_chinese():
    import jieba
    chars = sorted({c for s in CHINESE for c in s})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars
    cid = {c: i for i, c in enumerate(vocab)}
    rng = np.random.default_rng(0)
    docs = [[CHINESE[j] for j in rng.permutation(len(CHINESE))[: rng.integers(2, 6)]] for _ in range(40)]
    sents = [s for doc in docs for s in doc]
    tokens = np.array([cid[c] for s in sents for c in s], dtype=np.uint16)
    shards = StandInShards(tokens, [len(s) for s in sents], [len(doc) for doc in docs], StandInTokenizer(vocab))
    sampler = BertPretrainingSampler(shards, max_seq_length=48, whole_word_mask=True)
    d = draw(sampler, 2000, batch=500)
    original = np.where(d["labels"] != -100, d["labels"], d["input_ids"])
    masked = d["labels"] != -100
    n_multi = 0
    for row_o, row_m in zip(original, masked):
        # segment every run of CJK characters with jieba independently and check each word
        runs = np.split(np.arange(len(row_o)), np.flatnonzero(np.diff((row_o >= N_SPECIAL).astype(int)) != 0) + 1)
        for run in runs:
            if row_o[run[0]] < N_SPECIAL or len(run) < 2:
                continue
            text = "".join(vocab[t] for t in row_o[run])
            pos = 0
            for word in jieba.lcut(text):
                states = set(row_m[run[pos : pos + len(word)]].tolist())
                assert len(states) == 1, f"word {word!r} was split"
                n_multi += len(word) > 1 and states == {True}
                pos += len(word)
    assert n_multi > 100  # many multi-character words were masked whole


def test_rejects_bpe_and_single_document():
    shards, _, _ = positional_shards(n_docs=5)
    bpe = StandInTokenizer(shards.tokenizer()._vocab, kind="bpe")
    with pytest.raises(DataError, match="WordPiece"):
        BertPretrainingSampler(shards, tokenizer=bpe)
    one_doc = StandInShards(np.arange(5, 105, dtype=np.uint32), [50, 50], [2], shards.tokenizer())
    sampler = BertPretrainingSampler(one_doc, max_seq_length=32)
    with pytest.raises(DataError, match="at least 2 documents"):
        sampler.batch([np.random.default_rng(0)], "train")
    # without NSP one document is enough
    mlm = BertPretrainingSampler(one_doc, max_seq_length=32, next_sentence=False)
    assert mlm.batch([np.random.default_rng(0)], "train")["input_ids"].shape[1] <= 32


def test_real_wordpiece_shards(request):
    from lmforge.data.shards import Shards

    shards = Shards.open(request.getfixturevalue("wordpiece_shards"))
    tok = shards.tokenizer()
    sampler = BertPretrainingSampler(shards, max_seq_length=64)
    for split in ("train", "val"):
        d = draw(sampler, 2000, batch=500, split=split)
        original = np.where(d["labels"] != -100, d["labels"], d["input_ids"])
        special = np.isin(original, sorted(tok.special_ids))
        assert not ((d["labels"] != -100) & special).any()
        assert abs((d["next_sentence_label"] == 0).mean() - 0.5) < 0.05
        masked = d["labels"] != -100
        share = masked.sum() / ((~special) & (d["attention_mask"] == 1)).sum()
        assert abs(share - 0.15) < 0.01
    # the text reads back: an unmasked row decodes to real words
    row = original[0][: int(d["attention_mask"][0].sum())]
    assert len(tok.decode([int(t) for t in row if t not in tok.special_ids]).split()) > 2
