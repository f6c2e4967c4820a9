"""Tokenizers for lmforge, built on HF ``tokenizers``: WordPiece (BERT) and byte-level BPE (GPT).

:class:`Tokenizer` is lmforge's small, stable interface to either; the pipelines themselves and how they are
trained are :mod:`lmforge.tokenizer_pipelines`'.  A tokenizer folder is written so that HF ``transformers``
loads it too.

lmforge's own :meth:`Tokenizer.encode` never adds special tokens; the models and samplers place
them where they belong.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from .errors import ConfigError, DataError
from .storage.files import finish_together, write_together
from .storage.writing import recover_folder
from .tokenizer_pipelines import EOT, WORDPIECE_SPECIALS, check_train_args, train_backend, wordpiece_from_vocab
from .utils import check_unicode

logger = logging.getLogger(__name__)

# Large enough for any sequence lmforge builds; HF uses it only to warn about long inputs.
MODEL_MAX_LENGTH = 1_000_000


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
        check_train_args(kind, vocab_size, min_frequency)
        if lowercase is None:
            lowercase = kind == "wordpiece"
        hf = train_backend(files_or_iter, kind, vocab_size, lowercase, min_frequency, layout, encoding_errors,
                           show_progress)
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
            return cls(wordpiece_from_vocab(p / "vocab.txt", lowercase, strip_accents), "wordpiece", lowercase)
        raise DataError(f"no tokenizer in {p}: expected tokenizer.json or vocab.txt (lmforge tokenizer train)")

    def save(self, path: str | Path) -> Path:
        """Write the tokenizer so that lmforge and HF ``AutoTokenizer`` both load the folder.

        Writes ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json`` and, for
        WordPiece, ``vocab.txt`` (one token per line in id order), and deletes the files of another
        tokenizer kind (a WordPiece ``vocab.txt`` beside a BPE tokenizer, HF's ``vocab.json`` /
        ``merges.txt``), all as one change (:func:`lmforge.storage.files.write_together`): a kill leaves the old
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
        """Token ids of ``text`` without special tokens (a DataError if it is not valid Unicode)."""
        return self._tok.encode(check_unicode(text), add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of several texts (encoded in parallel by ``tokenizers``), no special tokens."""
        texts = [check_unicode(t) for t in texts]
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[str], list[tuple[int, int]]]:
        """Ids, token strings and ``(start, end)`` character offsets into ``text`` (no special tokens).

        For byte-level BPE the offsets exclude the leading space a token carries (``Ġ``).
        """
        enc = self._tok.encode(check_unicode(text), add_special_tokens=False)
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
