"""word2vec: one static vector per token, trained with gensim (skip-gram or CBOW, negative sampling).

Mikolov et al. 2013.  The baseline of the four generations: the vector of *python* is the same in
"He got bit by Python." and "Python is my favorite programming language.", so it cannot tell the
snake from the language.  lmforge trains it on the same shards (the same corpus and tokenisation)
as the other families, with gensim doing the training (:func:`lmforge.families.word2vec.train.run_pretraining`),
and stores it as a model folder like the others: ``model.safetensors`` holds an ``nn.Embedding`` indexed by token
id (tokens gensim never saw get zeros), ``vectors.txt`` the same vectors in the word2vec text
format for other tools, plus ``config.json`` and the tokenizer.

Determinism: with ``workers=1`` (the default) a run is a function of (config, shards): gensim's
initial vectors come from its seeded generator, and lmforge passes a stable hash function, so
Python's per-process string-hash randomisation does not enter.  ``workers > 1`` trains faster but
thread scheduling changes the order of updates, so the vectors differ from run to run.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...errors import ConfigError, LmforgeError
from ...models.base import ModelOutput, PretrainedModel, TokenLayers
from ...storage.files import atomic_write_lines
from ...text import is_cjk
from ...utils import SEED_MAX

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Word2VecConfig:
    """word2vec settings (``model_type: "word2vec"``); the training knobs are gensim's.

    Attributes:
        vocab_size: V, the tokenizer's vocabulary (set by :func:`lmforge.families.word2vec.train.run_pretraining`).
        vector_size: width of the vectors.
        architecture: ``"skipgram"`` (predict the context from the word) or ``"cbow"`` (the word from
            the mean of its context).
        window: largest distance between the word and a context word.
        negative: negative samples per positive pair.
        min_count: tokens seen fewer times get no vector (zeros).
        sample: down-sampling threshold of frequent tokens.
        epochs: passes over the corpus.
        alpha, min_alpha: learning rate, decayed linearly from ``alpha`` to ``min_alpha``.
        seed: seeds gensim's initial vectors and sampling.
        workers: gensim worker threads; 1 keeps runs reproducible (see the module docstring).
    """

    vocab_size: int = 8192
    vector_size: int = 100
    architecture: str = "skipgram"
    window: int = 5
    negative: int = 5
    min_count: int = 1
    sample: float = 1e-3
    epochs: int = 5
    alpha: float = 0.025
    min_alpha: float = 1e-4
    seed: int = 0
    workers: int = 1

    def __post_init__(self) -> None:
        if self.architecture not in ("skipgram", "cbow"):
            raise ConfigError(f"architecture must be 'skipgram' or 'cbow', got {self.architecture!r}")
        for name in ("vocab_size", "vector_size", "window", "negative", "min_count", "epochs", "workers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.min_alpha <= self.alpha:
            raise ConfigError(f"need 0 < min_alpha <= alpha, got {self.min_alpha} and {self.alpha}")
        if not 0 <= self.seed <= SEED_MAX:
            raise ConfigError(f"seed must be a whole number from 0 to {SEED_MAX}, got {self.seed}")


_WORD_CHAR = re.compile(r"\w")


def word_index(text: str, offsets: list[tuple[int, int]]) -> list[int]:
    """Group subword pieces into words: piece i gets the index of the word it belongs to.

    A piece continues the previous piece's word when it starts exactly where that one ended and
    both touching characters are word characters (letters, digits), not CJK (each CJK character
    is a word of its own).  This needs only the text and the offsets, so it works for WordPiece
    (``py ##thon``) and byte-level BPE (``Py thon``) alike; punctuation is always its own word.
    """
    out: list[int] = []
    word = -1
    prev_end = None
    for start, end in offsets:
        joined = (
            prev_end is not None
            and start == prev_end
            and 0 < start < len(text)
            and _WORD_CHAR.match(text[start - 1]) is not None
            and _WORD_CHAR.match(text[start]) is not None
            and not is_cjk(text[start - 1])
            and not is_cjk(text[start])
        )
        if not joined:
            word += 1
        out.append(word)
        prev_end = end
    return out


class Word2Vec(PretrainedModel):
    """Static token vectors in an ``nn.Embedding`` (``embeddings.weight``: (V, vector_size)).

    ``forward(input_ids)`` returns the vectors as the only hidden state; there is no language-model
    loss (gensim trains it; see :func:`lmforge.families.word2vec.train.run_pretraining`).
    """

    config_class = Word2VecConfig
    model_type = "word2vec"
    contextual = False

    def __init__(self, config: Word2VecConfig):
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.vector_size)
        nn.init.zeros_(self.embeddings.weight)

    @property
    def hidden_size(self) -> int:
        return self.config.vector_size

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> ModelOutput:
        """input_ids: (B, T) -> ModelOutput with hidden_states ((B, T, C),); labels are not used."""
        return ModelOutput(hidden_states=tuple(self.hidden_states(input_ids, attention_mask)))

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """The one layer: each token's vector, (B, T, C); padding positions are zero."""
        h = self.embeddings(input_ids)  # (B, T, C)
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1).to(h.dtype)
        return [h]

    def transfer_layers(self) -> list[nn.Module]:
        return [self.embeddings]

    def layer_names(self) -> list[str]:
        return ["word2vec"]

    @torch.no_grad()
    def embed(self, texts: list[str]) -> list[TokenLayers]:
        """Static vectors of every token, one layer.

        A word split into several pieces gets the mean of its pieces' vectors on every one of its
        pieces (see :func:`word_index`), so a word's vector never depends on its sentence.
        """
        tok = self.tokenizer
        if tok is None:
            raise LmforgeError("this word2vec model has no tokenizer attached; load it with lmforge.load(model_dir)")
        out = []
        weight = self.embeddings.weight
        for text in texts:
            ids, tokens, offsets = tok.encode_with_offsets(text)
            vecs = weight[torch.tensor(ids, dtype=torch.long, device=weight.device)].float().cpu()  # (n, C)
            if ids:
                group = torch.tensor(word_index(text, offsets))  # (n,)
                n_words = int(group.max()) + 1
                sums = torch.zeros(n_words, vecs.shape[1]).index_add_(0, group, vecs)
                counts = torch.bincount(group, minlength=n_words).unsqueeze(1).float()
                vecs = (sums / counts)[group]  # (n, C)
            out.append(
                TokenLayers(
                    tokens=list(tokens),
                    offsets=[tuple(o) for o in offsets],
                    layers=vecs.unsqueeze(0),
                    layer_names=self.layer_names(),
                )
            )
        return out

    def save_word2vec_text(self, path: str | Path, token_ids: list[int] | None = None) -> None:
        """Write ``vectors.txt`` in the word2vec text format (``n dim`` then ``token v1 v2 ...``).

        Args:
            path: the file to write (atomically).
            token_ids: which tokens to write (default: every token whose vector is not all zero).
        """
        if self.tokenizer is None:
            raise LmforgeError("writing word2vec text needs the tokenizer (for the token strings)")
        w = self.embeddings.weight.detach().float().cpu().numpy()
        if token_ids is None:
            token_ids = [i for i in range(w.shape[0]) if np.any(w[i])]
        rows = (self.tokenizer.id_to_token(i) + " " + " ".join(f"{x:.6g}" for x in w[i]) for i in token_ids)
        atomic_write_lines(path, itertools.chain([f"{len(token_ids)} {w.shape[1]}"], rows))
