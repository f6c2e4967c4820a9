"""word2vec training with gensim (skip-gram or CBOW, negative sampling) on token shards.

The model itself (:class:`lmforge.families.word2vec.model.Word2Vec`) is an ``nn.Embedding`` indexed by token
id; gensim trains the vectors on the shards' sentences, fed as the tokenizer's token strings, and
:func:`run_pretraining` copies them into the model and writes the model folder.  gensim is an optional
dependency (the ``w2v`` extra), imported when training starts.

Determinism: with ``workers=1`` (the default) a run is a function of (config, shards): gensim's
initial vectors come from its seeded generator, and lmforge passes a stable hash function, so
Python's per-process string-hash randomisation does not enter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ...data.shards import Shards
from ...errors import LmforgeError, require
from ...storage.files import save_json
from ..result import PretrainResult
from .model import Word2Vec, Word2VecConfig

logger = logging.getLogger(__name__)


def _stable_hash(s: str) -> int:
    """A string hash that is the same in every process (Python's ``hash`` is randomised)."""
    return zlib.crc32(s.encode("utf-8"))


class _ShardSentences:
    """Re-iterable sentences of a shard split as lists of token strings (what gensim reads)."""

    def __init__(self, shards, tokenizer, split: str = "train"):
        self.tokens = shards.tokens(split)
        self.starts = np.asarray(shards.sentences(split), dtype=np.int64)
        self.names = [tokenizer.id_to_token(i) or f"<id{i}>" for i in range(tokenizer.vocab_size)]

    def __len__(self) -> int:
        return max(len(self.starts) - 1, 0)

    def __iter__(self) -> Iterator[list[str]]:
        names = self.names
        for s, e in zip(self.starts[:-1], self.starts[1:]):
            if e > s:
                yield [names[i] for i in self.tokens[s:e].tolist()]


class _GensimRateLog(logging.Handler):
    """Collects the ``N effective words/s`` figures gensim logs while training."""

    pattern = re.compile(r"([\d.]+) effective words/s")

    def __init__(self):
        super().__init__(logging.INFO)
        self.rates: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = self.pattern.search(record.getMessage())
        if m:
            self.rates.append(float(m.group(1)))


@contextlib.contextmanager
def _gensim_rates() -> Iterator[_GensimRateLog]:
    """Collect gensim's training-speed reports (its INFO lines) without printing them."""
    gensim_logger = logging.getLogger("gensim.models.word2vec")
    rate_log = _GensimRateLog()
    old_level, old_propagate = gensim_logger.level, gensim_logger.propagate
    gensim_logger.addHandler(rate_log)
    gensim_logger.setLevel(logging.INFO)
    gensim_logger.propagate = False
    try:
        yield rate_log
    finally:
        gensim_logger.removeHandler(rate_log)
        gensim_logger.setLevel(old_level)
        gensim_logger.propagate = old_propagate


def _train_gensim(gensim_w2v, sentences: _ShardSentences, config: Word2VecConfig):
    """gensim's Word2Vec (``gensim_w2v`` is ``gensim.models.word2vec``) trained on ``sentences``; returns it
    with (effective words, raw words, seconds, effective words/s)."""
    with _gensim_rates() as rate_log:
        w2v = gensim_w2v.Word2Vec(
            vector_size=config.vector_size,
            sg=1 if config.architecture == "skipgram" else 0,
            window=config.window,
            negative=config.negative,
            hs=0,
            min_count=config.min_count,
            sample=config.sample,
            alpha=config.alpha,
            min_alpha=config.min_alpha,
            seed=config.seed,
            workers=config.workers,
            hashfxn=_stable_hash,
        )
        w2v.build_vocab(sentences)
        logger.info(
            "word2vec (%s): %d sentences, %d of %d tokens in the vocabulary, %d epochs",
            config.architecture,
            len(sentences),
            len(w2v.wv.index_to_key),
            config.vocab_size,
            config.epochs,
        )
        t0 = time.perf_counter()
        effective, raw = w2v.train(sentences, total_examples=w2v.corpus_count, epochs=config.epochs)
        elapsed = time.perf_counter() - t0
    # gensim's last report is the whole run's; fall back to our own timing if it logged none
    rate = rate_log.rates[-1] if rate_log.rates else effective / max(elapsed, 1e-9)
    logger.info(
        "word2vec: %d raw words (%d effective) in %.1fs, %.0f effective words/s (gensim)", raw, effective, elapsed, rate
    )
    return w2v, effective, raw, elapsed, rate


def _to_model(w2v, config: Word2VecConfig, tokenizer) -> tuple[Word2Vec, list[int]]:
    """The lmforge model holding gensim's vectors at the tokenizer's ids, and the ids that got one."""
    model = Word2Vec(config)
    model.tokenizer = tokenizer
    weight = torch.zeros(config.vocab_size, config.vector_size)
    seen = []
    for token, row in w2v.wv.key_to_index.items():
        i = tokenizer.token_to_id(token)
        if i is None:  # cannot happen: gensim saw only the tokenizer's own strings
            continue
        weight[i] = torch.from_numpy(np.array(w2v.wv.vectors[row], dtype=np.float32))
        seen.append(i)
    with torch.no_grad():
        model.embeddings.weight.copy_(weight)
    model.eval()
    return model, seen


def run_pretraining(shards, tokenizer, config: Word2VecConfig, out_dir: str | Path):
    """Train word2vec with gensim on the shards' train split and write the model folder.

    Args:
        shards: an opened :class:`lmforge.data.shards.Shards` (or its folder).
        tokenizer: the shards' tokenizer; sentences are fed to gensim as its token strings.
        config: the word2vec config (``vocab_size`` is replaced by the tokenizer's).
        out_dir: the model folder to write (config.json, model.safetensors, vectors.txt, tokenizer,
            training_summary.json).
    Returns:
        A :class:`lmforge.families.result.PretrainResult` whose ``val`` holds the training speed
        (``words_per_sec`` as gensim reports it) and the share of the vocabulary that got a vector.
    """
    gensim_w2v = require("gensim.models.word2vec", "w2v")
    if isinstance(shards, (str, Path)):
        shards = Shards.open(shards)
    shards.check_tokenizer(tokenizer)
    config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size)
    if config.workers > 1:
        logger.warning("word2vec with workers=%d is faster but not reproducible run to run", config.workers)
    sentences = _ShardSentences(shards, tokenizer)
    if len(sentences) == 0:
        raise LmforgeError("the shards' train split has no sentences; prepare a larger corpus")
    w2v, effective, raw, elapsed, rate = _train_gensim(gensim_w2v, sentences, config)
    model, seen = _to_model(w2v, config, tokenizer)

    out = Path(out_dir)
    model.save_pretrained(out, tokenizer)
    model.save_word2vec_text(out / "vectors.txt", sorted(seen))
    val = {
        "words_per_sec": float(rate),
        "raw_words": float(raw),
        "effective_words": float(effective),
        "vocab_coverage": len(seen) / config.vocab_size,
    }
    save_json(
        {"architecture": config.architecture, "epochs": config.epochs, "elapsed_s": elapsed, **val},
        out / "training_summary.json",
    )
    return PretrainResult(
        family="word2vec", out_dir=out, val=val, stop_reason="done", tokens_seen=int(raw), elapsed=elapsed
    )
