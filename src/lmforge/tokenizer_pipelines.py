"""The ``tokenizers`` pipelines behind :class:`lmforge.tokenization.Tokenizer`, and how each is trained.

WordPiece follows BERT: ``BertNormalizer`` (clean text, every CJK character split on its own,
lower-casing with accent stripping on or off), ``BertPreTokenizer`` (whitespace + punctuation),
``##`` continuation pieces, special tokens ``[PAD] [UNK] [CLS] [SEP] [MASK]`` and a post-processor
``[CLS] $A [SEP] $B:1 [SEP]:1`` that HF ``transformers`` applies when it loads the folder. Because
each CJK character is a word of its own, a ``##<CJK>`` piece could never be used; none is kept.

Byte-level BPE follows GPT-2: ``ByteLevel`` pre-tokenizer (no prefix space), the 256 byte symbols
as base alphabet (so there is no unknown token) and ``<|endoftext|>`` as the one special token,
which doubles as padding.

Training is deterministic: the same texts and settings give the same ids in every process.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HFTokenizer

from .data.sources import Corpus
from .errors import ConfigError, DataError
from .text import is_cjk
from .utils import check_memory

logger = logging.getLogger(__name__)

KINDS = ("wordpiece", "bpe")
WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
EOT = "<|endoftext|>"
BPE_SPECIALS = [EOT]
BYTE_ALPHABET = 256
BYTES_PER_VOCAB_ENTRY = 64
MAX_VOCAB = 2**31 - 1  # ids are 32-bit in ``tokenizers`` (and in the shards' uint32 arrays)


def _is_lone_piece(token: str) -> bool:
    """A ``##`` piece that BERT pre-tokenisation can never produce: a CJK char or a punctuation mark."""
    if not token.startswith("##") or len(token) != 3:
        return False
    ch = token[2]
    return is_cjk(ch) or unicodedata.category(ch).startswith("P")


def _batched(items: Iterable[str], n: int = 1000) -> Iterator[list[str]]:
    batch: list[str] = []
    for s in items:
        batch.append(s)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


def check_train_args(kind: str, vocab_size: int, min_frequency: int) -> None:
    """Refuse (ConfigError) an unknown kind, or a vocabulary too large or too small for the special tokens and
    the alphabet."""
    if kind not in KINDS:
        raise ConfigError(f"tokenizer kind must be one of {KINDS}, not {kind!r}")
    specials = WORDPIECE_SPECIALS if kind == "wordpiece" else BPE_SPECIALS
    minimum = len(specials) + 1 if kind == "wordpiece" else len(specials) + BYTE_ALPHABET
    if vocab_size > MAX_VOCAB:
        raise ConfigError(f"vocab_size {vocab_size} is too large; the most a tokenizer takes is {MAX_VOCAB:,}")
    # the trainers of ``tokenizers`` size their tables by vocab_size up front (an abort, not an error, when the
    # allocation fails): at least a token string, its id and its merge, some 64 bytes an entry
    check_memory(vocab_size * BYTES_PER_VOCAB_ENTRY, f"--vocab-size {vocab_size:,}",
                 "give a smaller --vocab-size (a corpus yields few more pieces than its distinct words; 30,000 to "
                 "50,000 is usual)")
    if min_frequency < 0:
        raise ConfigError(f"min_frequency must be 0 or more, got {min_frequency}")
    if vocab_size < minimum:
        raise ConfigError(
            f"vocab_size {vocab_size} is too small for {kind}: the special tokens"
            f"{'' if kind == 'wordpiece' else ' and the 256 byte symbols'} alone need {minimum}"
        )


def train_backend(
    files_or_iter,
    kind: str,
    vocab_size: int,
    lowercase: bool,
    min_frequency: int,
    layout: str,
    encoding_errors: str,
    show_progress: bool,
) -> HFTokenizer:
    """Train a ``tokenizers.Tokenizer`` of ``kind`` on a corpus.

    The arguments are :meth:`lmforge.tokenization.Tokenizer.train`'s, checked by :func:`check_train_args`.

    Raises:
        DataError: unreadable files or no text.
    """
    texts = _training_texts(files_or_iter, layout, encoding_errors)
    if kind == "wordpiece":
        if not isinstance(texts, _Replayable):
            texts = list(texts)  # read twice below: the alphabet first, then the training pass
        hf, trainer = _wordpiece_setup(texts, vocab_size, lowercase, min_frequency, show_progress)
    else:
        hf, trainer = _bpe_setup(vocab_size, lowercase, min_frequency, show_progress)
    seen = _Counter(texts)
    hf.train_from_iterator(_batched(seen), trainer=trainer)
    if seen.n == 0:
        raise DataError("no text to train the tokenizer on (the corpus is empty)")
    if kind == "wordpiece":
        hf = _drop_unusable_pieces(hf)  # also fixes the ids, which the trainer leaves random
    set_post_processor(hf, kind)
    return hf


def _wordpiece_setup(texts: Iterable[str], vocab_size: int, lowercase: bool, min_frequency: int,
                     show_progress: bool) -> tuple[HFTokenizer, trainers.WordPieceTrainer]:
    hf = HFTokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    hf.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    # tokenizers' trainer gives "##x" pieces ids in hash-map order, and ties between equally
    # frequent merges are broken by id, so the result would change from run to run. Registering
    # the "##x" alphabet up front (sorted) fixes every id and makes training deterministic;
    # these helper entries lose their "special" status afterwards (_drop_unusable_pieces).
    continuation = _continuation_alphabet(texts, hf.normalizer)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=WORDPIECE_SPECIALS + continuation,
        continuing_subword_prefix="##", show_progress=show_progress,
    )
    return hf, trainer


def _bpe_setup(vocab_size: int, lowercase: bool, min_frequency: int,
               show_progress: bool) -> tuple[HFTokenizer, trainers.BpeTrainer]:
    hf = HFTokenizer(models.BPE())
    if lowercase:
        hf.normalizer = normalizers.Lowercase()
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=BPE_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=show_progress,
    )
    return hf, trainer


class _Counter:
    """Pass texts through, counting the non-empty ones (to detect an empty corpus after training)."""

    def __init__(self, texts: Iterable[str]):
        self._texts = texts
        self.n = 0

    def __iter__(self) -> Iterator[str]:
        for t in self._texts:
            if t and not t.isspace():
                self.n += 1
                yield t


def _training_texts(files_or_iter, layout: str, encoding_errors: str) -> Iterable[str]:
    if isinstance(files_or_iter, (str, Path)):
        files_or_iter = [files_or_iter]
    if isinstance(files_or_iter, (list, tuple)) and all(isinstance(f, (str, Path)) for f in files_or_iter):
        files_or_iter = Corpus.open(files_or_iter, layout=layout, encoding_errors=encoding_errors)
    if isinstance(files_or_iter, Corpus):
        return _Replayable(files_or_iter.sentences)
    return files_or_iter


class _Replayable:
    """An iterable that can be iterated more than once (files are simply read again)."""

    def __init__(self, make: Callable[[], Iterator[str]]):
        self._make = make

    def __iter__(self) -> Iterator[str]:
        return self._make()


# BERT treats every non-alphanumeric ASCII character as punctuation, whatever Unicode says.
def _is_bert_punct(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _continuation_alphabet(texts: Iterable[str], normalizer) -> list[str]:
    """Sorted ``##x`` for every normalised character that can follow another inside a word.

    A superset is fine (an unused ``##x`` costs one vocabulary slot); whitespace, punctuation and CJK
    characters are left out because BERT pre-tokenisation always makes them words of their own.
    """
    raw: set[str] = set()
    for t in texts:
        raw.update(t)
    out: set[str] = set()
    for c in raw:
        for n in normalizer.normalize_str(c):
            if not n.isspace() and not is_cjk(n) and not _is_bert_punct(n) and unicodedata.category(n)[0] != "C":
                out.add("##" + n)
    return sorted(out)


def set_post_processor(hf, kind: str) -> None:
    if kind == "wordpiece":
        hf.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", hf.token_to_id("[CLS]")), ("[SEP]", hf.token_to_id("[SEP]"))],
        )
    else:
        hf.post_processor = processors.ByteLevel(trim_offsets=True)


def wordpiece_from_vocab(vocab_path: Path, lowercase: bool, strip_accents: bool | None):
    """A BERT WordPiece ``tokenizers.Tokenizer`` from a ``vocab.txt`` (ids = line numbers)."""
    vocab: dict[str, int] = {}
    with open(vocab_path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            tok = line.rstrip("\n")
            vocab.setdefault(tok, i)
    if "[UNK]" not in vocab:
        raise DataError(f"{vocab_path} has no [UNK] token; is it a BERT vocabulary?")
    hf = HFTokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    hf.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=strip_accents, lowercase=lowercase
    )
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    hf.add_special_tokens([AddedToken(t, special=True) for t in WORDPIECE_SPECIALS if t in vocab])
    set_post_processor(hf, "wordpiece")
    return hf


def _drop_unusable_pieces(hf):
    """Rebuild a trained WordPiece in canonical order, without ``##`` pieces that can never be used.

    BERT pre-tokenisation makes every CJK character and punctuation mark a word of its own, so
    ``##<CJK>`` / ``##<punct>`` pieces can never be produced; dropping them keeps the vocabulary for
    pieces that are used. The ids are then renumbered in a fixed order — special tokens, whole-word
    pieces, then ``##`` pieces, each by (length, text) — because ``tokenizers``' trainer numbers the
    ``##`` alphabet in hash-map order, which changes from one process to the next. WordPiece encoding
    (greedy longest match) depends only on the set of pieces, never on their ids.
    """
    data = json.loads(hf.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    # Only the five BERT specials stay added tokens; the "##x" helpers registered for training are
    # ordinary pieces.
    data["added_tokens"] = [a for a in data.get("added_tokens", []) if a["content"] in WORDPIECE_SPECIALS]
    specials = [a["content"] for a in sorted(data["added_tokens"], key=lambda a: a["id"])]
    drop = {t for t in vocab if _is_lone_piece(t)}
    rest = [t for t in vocab if t not in drop and t not in specials]
    rest.sort(key=lambda t: (t.startswith("##"), len(t), t))
    new_vocab = {t: i for i, t in enumerate(specials + rest)}
    data["model"]["vocab"] = new_vocab
    for added in data.get("added_tokens", []):
        added["id"] = new_vocab[added["content"]]
    if drop:
        logger.debug("dropped %d unusable ## pieces (CJK characters / punctuation)", len(drop))
    return HFTokenizer.from_str(json.dumps(data))
