"""Tokenizers for lmforge, built on HF ``tokenizers``: WordPiece (BERT) and byte-level BPE (GPT).

WordPiece follows BERT: ``BertNormalizer`` (clean text, every CJK character split on its own,
lower-casing with accent stripping on or off), ``BertPreTokenizer`` (whitespace + punctuation),
``##`` continuation pieces, special tokens ``[PAD] [UNK] [CLS] [SEP] [MASK]`` and a post-processor
``[CLS] $A [SEP] $B:1 [SEP]:1`` that HF ``transformers`` applies when it loads the folder. Because
each CJK character is a word of its own, a ``##<CJK>`` piece could never be used; none is kept.

Byte-level BPE follows GPT-2: ``ByteLevel`` pre-tokenizer (no prefix space), the 256 byte symbols
as base alphabet (so there is no unknown token) and ``<|endoftext|>`` as the one special token,
which doubles as padding.

lmforge's own :meth:`Tokenizer.encode` never adds special tokens; the models and samplers place
them where they belong.
"""

from __future__ import annotations

import hashlib
import json
import logging
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HFTokenizer

from .data.sources import Corpus
from .errors import ConfigError, DataError
from .folders import recover_folder
from .utils import finish_together, write_together

logger = logging.getLogger(__name__)

KINDS = ("wordpiece", "bpe")
WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
EOT = "<|endoftext|>"
BPE_SPECIALS = [EOT]
BYTE_ALPHABET = 256
# Large enough for any sequence lmforge builds; HF uses it only to warn about long inputs.
MODEL_MAX_LENGTH = 1_000_000
MAX_VOCAB = 2**31 - 1  # ids are 32-bit in ``tokenizers`` (and in the shards' uint32 arrays)


def is_cjk(ch: str) -> bool:
    """The CJK ranges BERT's ``handle_chinese_chars`` isolates (CJK Unified Ideographs and extensions)."""
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


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


class Tokenizer:
    """A WordPiece or byte-level BPE tokenizer with lmforge's small, stable interface.

    Attributes:
        kind: ``"wordpiece"`` or ``"bpe"``.
        vocab_size: number of ids (including special tokens).
        pad_id, unk_id, cls_id, sep_id, mask_id: WordPiece special ids (None where absent;
            for BPE ``pad_id`` is ``eot_id``).
        eot_id: id of ``<|endoftext|>`` (BPE; None for WordPiece).
        special_ids: set of all special-token ids.
        lowercase: whether text is lower-cased (and accents stripped) before tokenising.
    """

    def __init__(self, hf_tokenizer, kind: str | None = None, lowercase: bool | None = None):
        """Wrap a ``tokenizers.Tokenizer`` (truncation and padding are switched off)."""
        hf_tokenizer.no_truncation()
        hf_tokenizer.no_padding()
        self._tok = hf_tokenizer
        model_type = json.loads(hf_tokenizer.to_str())["model"]["type"]
        detected = {"WordPiece": "wordpiece", "BPE": "bpe"}.get(model_type)
        if detected is None:
            raise DataError(f"unsupported tokenizer model {model_type!r}; lmforge uses WordPiece or BPE")
        if kind is not None and kind != detected:
            raise DataError(f"tokenizer is {detected}, not {kind}")
        self.kind = detected
        if lowercase is None:
            lowercase = self._normalizer_lowercases()
        self.lowercase = bool(lowercase)
        tid = hf_tokenizer.token_to_id
        if self.kind == "wordpiece":
            self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (tid(t) for t in WORDPIECE_SPECIALS)
            self.eot_id = None
            missing = [t for t in WORDPIECE_SPECIALS if tid(t) is None and t != "[MASK]"]
            if missing:
                raise DataError(f"WordPiece vocabulary lacks the special tokens {missing}")
        else:
            self.eot_id = tid(EOT)
            self.pad_id = self.eot_id
            self.unk_id = self.cls_id = self.sep_id = self.mask_id = None
        self.special_ids = {
            tid(t.content) for t in hf_tokenizer.get_added_tokens_decoder().values() if t.special
        } | {i for i in (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id, self.eot_id)
             if i is not None}
        self._hash: str | None = None

    # --- construction --------------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        files_or_iter,
        kind: str = "wordpiece",
        vocab_size: int = 30522,
        lowercase: bool | None = None,
        min_frequency: int = 2,
        layout: str = "auto",
        encoding_errors: str = "strict",
        show_progress: bool = False,
    ) -> Tokenizer:
        """Train a tokenizer.

        Args:
            files_or_iter: a :class:`~lmforge.data.sources.Corpus`, a list/tuple of files and folders
                (any format, read like ``prepare`` reads them), or any other iterable of text strings.
            kind: ``"wordpiece"`` (BERT) or ``"bpe"`` (GPT, byte level).
            vocab_size: target vocabulary size including special tokens; the result may be smaller
                when the corpus has fewer distinct pieces (see :attr:`vocab_size`).
            lowercase: lower-case and strip accents (default: True for WordPiece, False for BPE).
            min_frequency: pieces seen fewer times are not merged.
            layout, encoding_errors: how files are read (see :mod:`lmforge.data.corpus`).
            show_progress: let ``tokenizers`` draw its progress bar on stderr (for the CLI).
        Returns:
            The trained Tokenizer.
        Raises:
            ConfigError: unknown kind, or a vocab_size too small for the special tokens and alphabet.
            DataError: unreadable files or no text.
        """
        if kind not in KINDS:
            raise ConfigError(f"tokenizer kind must be one of {KINDS}, not {kind!r}")
        if lowercase is None:
            lowercase = kind == "wordpiece"
        specials = WORDPIECE_SPECIALS if kind == "wordpiece" else BPE_SPECIALS
        minimum = len(specials) + 1 if kind == "wordpiece" else len(specials) + BYTE_ALPHABET
        if vocab_size > MAX_VOCAB:
            raise ConfigError(f"vocab_size {vocab_size} is too large; the most a tokenizer takes is {MAX_VOCAB:,}")
        if min_frequency < 0:
            raise ConfigError(f"min_frequency must be 0 or more, got {min_frequency}")
        if vocab_size < minimum:
            raise ConfigError(
                f"vocab_size {vocab_size} is too small for {kind}: the special tokens"
                f"{'' if kind == 'wordpiece' else ' and the 256 byte symbols'} alone need {minimum}"
            )

        texts = _training_texts(files_or_iter, layout, encoding_errors)
        if kind == "wordpiece":
            if not isinstance(texts, _Replayable):
                texts = list(texts)  # read twice below: the alphabet first, then the training pass
            hf = HFTokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
            hf.normalizer = normalizers.BertNormalizer(
                clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
            )
            hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            hf.decoder = decoders.WordPiece(prefix="##")
            # tokenizers' trainer gives "##x" pieces ids in hash-map order, and ties between equally
            # frequent merges are broken by id, so the result would change from run to run. Registering
            # the "##x" alphabet up front (sorted) fixes every id and makes training deterministic;
            # these helper entries lose their "special" status below.
            continuation = _continuation_alphabet(texts, hf.normalizer)
            trainer = trainers.WordPieceTrainer(
                vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials + continuation,
                continuing_subword_prefix="##", show_progress=show_progress,
            )
        else:
            hf = HFTokenizer(models.BPE())
            if lowercase:
                hf.normalizer = normalizers.Lowercase()
            hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            hf.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=show_progress,
            )
        seen = _Counter(texts)
        hf.train_from_iterator(_batched(seen), trainer=trainer)
        if seen.n == 0:
            raise DataError("no text to train the tokenizer on (the corpus is empty)")

        if kind == "wordpiece":
            hf = _drop_unusable_pieces(hf)  # also fixes the ids, which the trainer leaves random
        _set_post_processor(hf, kind)
        tok = cls(hf, kind=kind, lowercase=lowercase)
        if tok.vocab_size > vocab_size:
            raise ConfigError(
                f"vocab_size {vocab_size} is too small: the special tokens and the corpus's characters need "
                f"{tok.vocab_size}; use --vocab-size {tok.vocab_size} or more"
            )
        logger.debug("trained %s tokenizer: %d ids (asked for %d)", kind, tok.vocab_size, vocab_size)
        return tok

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load a tokenizer folder: ``tokenizer.json`` (lmforge or HF), or a BERT folder with only ``vocab.txt``.

        For a ``vocab.txt``-only folder the casing comes from ``tokenizer_config.json``'s
        ``do_lower_case`` (default True, as in BERT uncased).

        The files are checked against each other (:func:`check_tokenizer_files`), and a save that was
        cut short after its commit point is completed first.

        Raises:
            DataError: no tokenizer files, unreadable ones, or files of two different tokenizers.
        """
        p = Path(path)
        if p.is_file() and p.name == "tokenizer.json":
            p = p.parent
        if not p.exists():
            recover_folder(p)
        if not p.is_dir():
            raise DataError(f"tokenizer folder not found: {p}")
        try:
            finish_together(p)
        except OSError as e:
            raise DataError(f"a tokenizer save in {p} was cut short and cannot be completed ({e.strerror}); make "
                            f"the folder writable and run again") from None
        config = _read_json(p / "tokenizer_config.json") if (p / "tokenizer_config.json").is_file() else {}
        if (p / "tokenizer.json").is_file():
            try:
                hf = HFTokenizer.from_file(str(p / "tokenizer.json"))
            except Exception as e:  # tokenizers raises plain Exception subclasses on bad JSON
                raise DataError(f"{p / 'tokenizer.json'} is not a readable tokenizer ({e})") from None
            tok = cls(hf)
            check_tokenizer_files(p, tok, config)
            return tok
        if (p / "vocab.txt").is_file():
            lowercase = bool(config.get("do_lower_case", True))
            strip_accents = config.get("strip_accents")
            return cls(_wordpiece_from_vocab(p / "vocab.txt", lowercase, strip_accents), "wordpiece", lowercase)
        raise DataError(f"no tokenizer in {p}: expected tokenizer.json or vocab.txt (lmforge tokenizer train)")

    def save(self, path: str | Path) -> Path:
        """Write the tokenizer so that lmforge and HF ``AutoTokenizer`` both load the folder.

        Writes ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json`` and, for
        WordPiece, ``vocab.txt`` (one token per line in id order), and deletes the files of another
        tokenizer kind (a WordPiece ``vocab.txt`` beside a BPE tokenizer, HF's ``vocab.json`` /
        ``merges.txt``), all as one change (:func:`lmforge.utils.write_together`): a kill leaves the old
        tokenizer or the new one, never a mix.

        Returns:
            The folder.
        """
        p = Path(path)
        files = {"tokenizer.json": self._tok.to_str(pretty=True)}
        if self.kind == "wordpiece":
            vocab = self._tok.get_vocab(with_added_tokens=True)
            inv = sorted(vocab.items(), key=lambda kv: kv[1])
            if [i for _, i in inv] != list(range(len(inv))):
                raise DataError("WordPiece vocabulary ids are not contiguous; cannot write vocab.txt")
            files["vocab.txt"] = "".join(t + "\n" for t, _ in inv)
            specials = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                        "mask_token": "[MASK]"}
            config = {
                "tokenizer_class": "BertTokenizer",
                "do_lower_case": self.lowercase,
                "strip_accents": None,
                "tokenize_chinese_chars": True,
                "model_max_length": MODEL_MAX_LENGTH,
                "clean_up_tokenization_spaces": False,
                **specials,
            }
        else:
            specials = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT, "pad_token": EOT}
            config = {
                "tokenizer_class": "GPT2Tokenizer",
                "add_prefix_space": False,
                "add_bos_token": False,
                "model_max_length": MODEL_MAX_LENGTH,
                "clean_up_tokenization_spaces": False,
                **specials,
            }
        config["lmforge_kind"] = self.kind
        files["tokenizer_config.json"] = json.dumps(config, indent=2) + "\n"
        files["special_tokens_map.json"] = json.dumps(specials, indent=2) + "\n"
        stale = ("vocab.json", "merges.txt") + (("vocab.txt",) if self.kind == "bpe" else ())
        write_together(p, {k: v.encode("utf-8") for k, v in files.items()}, remove=stale)
        return p

    # --- properties ---------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def hash(self) -> str:
        """sha256 (hex) of the canonical JSON of the tokenizer (keys sorted, no whitespace)."""
        if self._hash is None:
            canonical = json.dumps(json.loads(self._tok.to_str()), sort_keys=True, separators=(",", ":"),
                                   ensure_ascii=False)
            self._hash = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
        return self._hash

    @property
    def backend(self):
        """The underlying ``tokenizers.Tokenizer`` (for callers that need HF features, e.g. pairs)."""
        return self._tok

    def _normalizer_lowercases(self) -> bool:
        norm = json.loads(self._tok.to_str()).get("normalizer") or {}
        stack = [norm]
        while stack:
            n = stack.pop()
            if n.get("type") == "Lowercase" or (n.get("type") == "BertNormalizer" and n.get("lowercase")):
                return True
            stack.extend(n.get("normalizers") or [])
        return False

    # --- encoding -----------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of several texts (encoded in parallel by ``tokenizers``), no special tokens."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[str], list[tuple[int, int]]]:
        """Ids, token strings and ``(start, end)`` character offsets into ``text`` (no special tokens).

        For byte-level BPE the offsets exclude the leading space a token carries (``Ġ``).
        """
        enc = self._tok.encode(text, add_special_tokens=False)
        return enc.ids, enc.tokens, [tuple(o) for o in enc.offsets]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (WordPiece joins ``##`` pieces; byte-level BPE restores bytes exactly)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(int(i))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def get_vocab(self) -> dict[str, int]:
        """Token -> id for the whole vocabulary (special tokens included)."""
        return self._tok.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, lowercase={self.lowercase})"


# --- helpers ------------------------------------------------------------------------------------


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


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is not readable JSON ({e})") from None


def check_tokenizer_files(folder: Path, tok: Tokenizer, config: dict) -> None:
    """Refuse a folder whose tokenizer files come from different tokenizers (DataError naming the pair).

    ``tokenizer.json`` is the reference; ``tokenizer_config.json`` (its kind and class), ``vocab.txt``
    (WordPiece: the same tokens at the same ids), ``vocab.json`` (BPE: the same ids) and
    ``special_tokens_map.json`` (tokens the vocabulary has) must agree with it.
    """
    vocab = tok.get_vocab()
    problem = None
    declared = config.get("lmforge_kind") or {"BertTokenizer": "wordpiece", "BertTokenizerFast": "wordpiece",
                                              "GPT2Tokenizer": "bpe", "GPT2TokenizerFast": "bpe"}.get(
        config.get("tokenizer_class"))
    if declared is not None and declared != tok.kind:
        problem = f"tokenizer_config.json describes a {declared} tokenizer but tokenizer.json holds a {tok.kind} one"
    elif (folder / "vocab.txt").is_file():
        if tok.kind != "wordpiece":
            problem = "vocab.txt (a WordPiece vocabulary) lies beside a BPE tokenizer.json"
        else:
            first: dict[str, int] = {}
            with open(folder / "vocab.txt", encoding="utf-8") as f:
                for i, line in enumerate(f):
                    first.setdefault(line.rstrip("\n"), i)
            if len(first) != len(vocab) or any(vocab.get(t) != i for t, i in first.items()):
                problem = f"vocab.txt holds {len(first)} tokens that differ from tokenizer.json's {len(vocab)}"
    if problem is None and (folder / "vocab.json").is_file():
        data = _read_json(folder / "vocab.json")
        if tok.kind != "bpe" or not isinstance(data, dict) or any(vocab.get(t) != i for t, i in data.items()):
            problem = f"vocab.json does not match tokenizer.json's {tok.kind} vocabulary"
    if problem is None and (folder / "special_tokens_map.json").is_file():
        specials = _read_json(folder / "special_tokens_map.json")
        values = specials.values() if isinstance(specials, dict) else []
        names = [v.get("content") if isinstance(v, dict) else v for v in values]
        absent = [n for n in names if isinstance(n, str) and n not in vocab]
        if absent:
            problem = f"special_tokens_map.json names {', '.join(sorted(set(absent)))}, which tokenizer.json lacks"
    if problem is not None:
        raise DataError(f"the tokenizer files in {folder} do not belong together: {problem} (a save that was cut "
                        f"short, or files copied in by hand); put back the files that came together, or train the "
                        f"tokenizer again")


def _set_post_processor(hf, kind: str) -> None:
    if kind == "wordpiece":
        hf.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", hf.token_to_id("[CLS]")), ("[SEP]", hf.token_to_id("[SEP]"))],
        )
    else:
        hf.post_processor = processors.ByteLevel(trim_offsets=True)


def _wordpiece_from_vocab(vocab_path: Path, lowercase: bool, strip_accents: bool | None):
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
    _set_post_processor(hf, "wordpiece")
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
