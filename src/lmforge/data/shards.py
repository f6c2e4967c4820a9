"""Token shards: a corpus streamed once through a tokenizer into memory-mapped arrays.

A shard folder holds, per split (``train``, ``val``):

- ``<split>.tokens.bin``: the token ids, ``uint16`` (or ``uint32`` when the vocabulary has more
  than 65,536 ids), one flat stream. For byte-level BPE, ``eot_id`` follows each document.
- ``<split>.sentences.bin``: ``int64`` sentence start offsets into the token stream, plus the end
  (length ``n_sentences + 1``). The end-of-text token of BPE belongs to no sentence: it sits
  between a document's last sentence and the next document's first, so the slice
  ``tokens[s[i]:s[i+1]]`` of a document's last sentence ends with it (and a document's slice
  ``tokens[s[d[j]]:s[d[j+1]]]`` ends with it).
- ``<split>.documents.bin``: ``int64`` document start offsets into the sentence array, plus the
  end (length ``n_documents + 1``).

plus ``meta.json`` (tokenizer hash and kind, vocabulary size, dtype, counts, sources; every field
checked on read by :mod:`lmforge.data.shard_meta`) and the tokenizer itself in ``tokenizer/``.

:func:`prepare` streams: the corpus (any format, :mod:`lmforge.data.sources`) is read in chunks of
documents that a pool of processes splits into sentences and encodes (:mod:`lmforge.data.chunks`);
the results are appended to the files in order, so memory does not grow with the corpus and the
shards do not depend on the number of processes. Documents go to ``val`` by a deterministic hash of
their index (at least one document when there are two or more). Everything is written into a
temporary folder that is renamed into place at the end: a failed run leaves no folder that looks valid.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..storage.files import atomic_write_text, swap_into_place
from ..storage.folders import user_files
from ..tokenization import Tokenizer
from .chunks import ChunkEncoder, Encoded, default_workers, read_chunks
from .shard_check import check_shard_arrays
from .shard_meta import FORMAT, SPLITS, VERSION, check_meta
from .sources import Corpus, CorpusOptions

logger = logging.getLogger(__name__)

TOKENIZER_SUBDIR = "tokenizer"
# Text per chunk handed to a worker: about a second of one core's encoding, so handing it over costs
# little next to encoding it, and a few chunks in flight bound the memory.
CHUNK_CHARS = 1 << 21


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits (vocab <= 65,536), else ``uint32``."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def is_val_document(index: int, val_fraction: float) -> bool:
    """Deterministic split: document ``index`` goes to val when its hash falls below ``val_fraction``."""
    if val_fraction <= 0:
        return False
    h = hashlib.blake2b(index.to_bytes(8, "little"), digest_size=8, person=b"lmforge-split").digest()
    return int.from_bytes(h, "little") / 2**64 < val_fraction


# --- writing side -------------------------------------------------------------------------------


class _SplitWriter:
    """Appends one split's tokens, sentence offsets and document offsets to its three files."""

    def __init__(self, folder: Path, split: str, dtype: np.dtype, eot_id: int | None):
        self.split = split
        self.dtype = dtype
        self.eot_id = eot_id
        self.paths = {k: folder / f"{split}.{k}.bin" for k in ("tokens", "sentences", "documents")}
        self.files = {k: open(p, "wb") for k, p in self.paths.items()}
        self.n_tokens = 0
        self.n_sentences = 0
        self.n_documents = 0
        self.doc_open = False  # a document has sentences written but no end yet
        self.files["sentences"].write(np.zeros(1, np.int64).tobytes())
        self.files["documents"].write(np.zeros(1, np.int64).tobytes())

    def add(self, ids: np.ndarray, lengths: np.ndarray, ends_doc: np.ndarray) -> None:
        """Append sentences: their ids concatenated, ``lengths`` per sentence (none zero), and
        ``ends_doc`` True on each document's last sentence (BPE: ``eot_id`` is written after it)."""
        step = lengths
        if self.eot_id is not None:
            ids = np.insert(ids, np.cumsum(lengths)[ends_doc], self.eot_id)
            step = lengths + ends_doc
        # Entry i+1 is where sentence i+1 starts: after sentence i and, for BPE, its document's eot.
        starts = self.n_tokens + np.cumsum(step)
        self.files["tokens"].write(ids.astype(self.dtype, copy=False).tobytes())
        self.files["sentences"].write(starts.astype(np.int64).tobytes())
        doc_ends = self.n_sentences + np.nonzero(ends_doc)[0] + 1
        self.files["documents"].write(doc_ends.astype(np.int64).tobytes())
        self.n_tokens += len(ids)
        self.n_sentences += len(lengths)
        self.n_documents += len(doc_ends)
        self.doc_open = not bool(ends_doc[-1])

    def close_open_document(self) -> None:
        """End the open document here (its remaining sentences turned out to have no tokens)."""
        if not self.doc_open:
            return
        self.files["documents"].write(np.array([self.n_sentences], np.int64).tobytes())
        self.n_documents += 1
        if self.eot_id is not None:
            self.files["tokens"].write(np.array([self.eot_id], self.dtype).tobytes())
            self.n_tokens += 1
            f = self.files["sentences"]  # the next sentence now starts after the eot
            f.seek(self.n_sentences * 8)
            f.write(np.array([self.n_tokens], np.int64).tobytes())
        self.doc_open = False

    def close(self) -> None:
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()

    def take_last_document(self) -> tuple[np.ndarray, np.ndarray]:
        """Remove the last document; return its tokens (without BPE eot) and its sentence lengths."""
        docs = self._flushed("documents")
        return self._cut_from(int(docs[-2]), docs)

    def take_last_sentences(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Remove the last ``k`` sentences of the last document (which keeps the ones before them and
        still ends there); return their tokens and lengths. Reads only those ``k`` sentences."""
        docs = self._flushed("documents")
        s0 = int(docs[-1]) - k
        if not int(docs[-2]) < s0 < int(docs[-1]):
            raise ValueError(f"cannot take {k} sentences from a document of {int(docs[-1] - docs[-2])}")
        out = self._cut_from(s0, docs)
        self.doc_open = True  # the document now ends after sentence s0 - 1: end it again (BPE: a new eot)
        self.close_open_document()
        return out

    def _flushed(self, key: str) -> np.ndarray:
        for f in self.files.values():
            f.flush()
        return np.fromfile(self.paths[key], dtype=np.int64)

    def _cut_from(self, s0: int, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cut the files before sentence ``s0`` of the last document, dropping that document's end;
        return the tokens (without BPE eot) and lengths of the sentences cut off."""
        offsets = self._flushed("sentences")
        s1 = int(docs[-1])
        t0, t1 = int(offsets[s0]), int(offsets[s1])  # t0: no eot inside a document
        eot = 1 if self.eot_id is not None else 0
        tokens = np.fromfile(self.paths["tokens"], dtype=self.dtype, count=t1 - t0 - eot,
                             offset=t0 * self.dtype.itemsize)
        lengths = np.diff(offsets[s0:s1 + 1])
        lengths[-1] -= eot
        for key, size in (("tokens", t0 * self.dtype.itemsize), ("sentences", (s0 + 1) * 8),
                          ("documents", (len(docs) - 1) * 8)):
            self.files[key].truncate(size)
            self.files[key].seek(size)
        self.n_tokens, self.n_sentences = t0, s0
        self.n_documents -= 1
        return tokens, lengths

    def counts(self) -> dict[str, int]:
        return {"documents": self.n_documents, "sentences": self.n_sentences, "tokens": self.n_tokens}


def _resolve_tokenizer(tokenizer):
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    return Tokenizer.load(tokenizer)


def _prepare_out_dir(out_dir: Path) -> None:
    if out_dir.exists():
        if not out_dir.is_dir():
            raise DataError(f"--out {out_dir} exists and is a file; choose a folder name")
        if any(out_dir.iterdir()) and not (out_dir / "meta.json").is_file():
            raise DataError(f"--out {out_dir} exists and is not a shard folder; choose another folder or empty it")


def uncompressed_size(path: Path) -> int:
    """Size of the text in ``path``: the file size, or for ``.gz`` the size its trailer records."""
    size = path.stat().st_size
    if path.suffix == ".gz" and size >= 18:
        with open(path, "rb") as f:
            f.seek(-4, os.SEEK_END)
            return int.from_bytes(f.read(4), "little")  # ISIZE: exact below 4 GiB
    return size


def prepare(
    corpus: Corpus | Iterable[str | Path],
    tokenizer_dir,
    out_dir: str | Path,
    val_fraction: float = 0.05,
    encoding_errors: str = "strict",
    layout: str = "auto",
    workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    overwrite: bool = False,
) -> dict:
    """Tokenize a corpus into a shard folder (streaming: memory does not grow with the corpus).

    Args:
        corpus: a :class:`~lmforge.data.sources.Corpus` (any format; its own options apply), or files
            and folders read with ``layout`` and ``encoding_errors``.
        tokenizer_dir: a tokenizer folder (or a :class:`~lmforge.tokenization.Tokenizer`).
        out_dir: the shard folder to write; an existing shard folder there is replaced.
        val_fraction: share of documents for the validation split, in [0, 1).
        encoding_errors: ``"strict"`` or ``"replace"`` for bytes that are not UTF-8.
        layout: ``"auto"``, ``"lines"`` or ``"paragraphs"``.
        workers: processes that split and encode (default: the cores this process may use); the
            shards are the same whatever the number.
        progress: called with the number of stored input bytes read since the last call (the calls
            add up to ``corpus.total_bytes``).
        overwrite: replace ``out_dir`` even when it is not a shard folder (the files lmforge did not write stay).
    Returns:
        The ``meta.json`` dict.
    Raises:
        DataError: bad inputs, an empty corpus, or an ``out_dir`` that is not a shard folder (unless ``overwrite``).
    """
    if not 0 <= val_fraction < 1:
        raise DataError(f"val_fraction must be in [0, 1), not {val_fraction}")
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise DataError(f"workers must be 1 or more, not {workers}")
    if not isinstance(corpus, Corpus):
        corpus = Corpus.open(list(corpus), options=CorpusOptions(layout=layout, encoding_errors=encoding_errors))
    out_dir = Path(out_dir)
    if not overwrite:
        _prepare_out_dir(out_dir)
    tok = _resolve_tokenizer(tokenizer_dir)
    dtype = dtype_for_vocab(tok.vocab_size)
    eot = tok.eot_id if tok.kind == "bpe" else None
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        writers = {s: _SplitWriter(tmp, s, dtype, eot) for s in SPLITS}
        _encode_into(writers, corpus, tok, workers, val_fraction, progress)
        tok_dir = tok.save(tmp / TOKENIZER_SUBDIR)
        if Tokenizer.load(tok_dir).hash != tok.hash:
            raise RuntimeError("internal error: the saved tokenizer does not reload to the same hash")
        meta = _meta(tok, writers, val_fraction, corpus)
        atomic_write_text(tmp / "meta.json", json.dumps(meta, indent=2) + "\n")
        swap_into_place(tmp, out_dir, keep=user_files(out_dir))  # the old shards stay, or are put back, after a kill
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.debug("prepared %s: %s", out_dir, meta["splits"])
    return meta


def _meta(tok: Tokenizer, writers: dict[str, _SplitWriter], val_fraction: float, corpus: Corpus) -> dict:
    """What ``meta.json`` says of the shards (checked on read by :mod:`lmforge.data.shard_meta`)."""
    return {
        "format": FORMAT, "version": VERSION, "tokenizer_hash": tok.hash, "tokenizer_kind": tok.kind,
        "vocab_size": tok.vocab_size, "dtype": writers["train"].dtype.name, "eot_id": writers["train"].eot_id,
        "val_fraction": val_fraction, "encoding_errors": corpus.options.encoding_errors,
        "splits": {s: w.counts() for s, w in writers.items()}, "sources": [src.meta() for src in corpus.sources],
    }


def _encode_into(writers: dict[str, _SplitWriter], corpus: Corpus, tok: Tokenizer, workers: int,
                 val_fraction: float, progress: Callable[[int], None] | None) -> None:
    """Read, encode and append the whole corpus to the split writers, balance the splits and close the files."""
    read = _ByteCounter()
    chunks = read_chunks(corpus.unit_blocks(on_bytes=read.add), read.take, CHUNK_CHARS)
    bpe = writers["train"].eot_id is not None
    for enc in ChunkEncoder(tok.backend, workers, bpe, writers["train"].dtype).encode(chunks):
        if len(enc.lengths):
            _write_encoded(enc, writers, val_fraction)
        if progress is not None:
            progress(enc.bytes_read)
    if writers["train"].doc_open or writers["val"].doc_open:
        raise RuntimeError("internal error: a document was left open")
    if writers["train"].n_tokens + writers["val"].n_tokens == 0:
        raise DataError(f"the corpus is empty: no tokens in {corpus.describe()}")
    if val_fraction > 0:
        _balance_splits(writers, val_fraction)
    for w in writers.values():
        w.close()


class _ByteCounter:
    def __init__(self):
        self.n = 0

    def add(self, n: int) -> None:
        self.n += n

    def take(self) -> int:
        n, self.n = self.n, 0
        return n


def _balance_splits(writers: dict[str, _SplitWriter], val_fraction: float) -> None:
    """Give both splits something when the hash split left one empty (small or one-document corpora).

    Train empty, val with several documents: val's last document moves to train. One document in all
    (a 'lines' file without blank lines is one document): it becomes train, and its last sentences
    (``val_fraction`` of them, at least one) become the val document. Val empty, train with several
    documents: train's last document moves to val.
    """
    train, val = writers["train"], writers["val"]

    def move_document(src: _SplitWriter, dst: _SplitWriter) -> None:
        tokens, lengths = src.take_last_document()
        dst.add(tokens, lengths, np.arange(len(lengths)) == len(lengths) - 1)

    if train.n_documents == 0 and val.n_documents >= 2:
        move_document(val, train)
    elif train.n_documents + val.n_documents == 1:
        if val.n_documents == 1:  # swap the two writers' files (open files rename fine): no data is copied
            for key in train.paths:
                tmp = train.paths[key].with_name(train.paths[key].name + ".swap")
                os.replace(train.paths[key], tmp)
                os.replace(val.paths[key], train.paths[key])
                os.replace(tmp, val.paths[key])
            train.paths, val.paths = val.paths, train.paths
            train.split, val.split = val.split, train.split
            writers["train"], writers["val"] = train, val = val, train
        if train.n_sentences >= 2:
            k = min(train.n_sentences - 1, max(1, round(train.n_sentences * val_fraction)))
            tokens, lengths = train.take_last_sentences(k)
            val.add(tokens, lengths, np.arange(len(lengths)) == len(lengths) - 1)
            logger.warning(
                "the corpus is one document (a 'lines' file needs blank lines between documents): its last %d "
                "sentences are the validation split", k
            )
    elif val.n_documents == 0 and train.n_documents >= 2:
        move_document(train, val)


def _write_encoded(enc: Encoded, writers: dict[str, _SplitWriter], val_fraction: float) -> None:
    lengths, ids, doc_index, ends_doc = enc.lengths, enc.ids, enc.doc_index, enc.ends_doc
    # Sentences with no tokens (e.g. only control characters) are dropped; a document's end moves
    # to its last kept sentence, and a document with none kept disappears.
    keep = lengths > 0
    if not keep.all():
        ends_doc, lost = _move_ends(ends_doc, keep, doc_index)
        first = int(doc_index[0])
        if first in lost:  # the document began in an earlier chunk and ends with empty sentences here
            writers["val" if is_val_document(first, val_fraction) else "train"].close_open_document()
        lengths, doc_index, ends_doc = lengths[keep], doc_index[keep], ends_doc[keep]
    if len(lengths) == 0:
        return
    starts = np.concatenate([[0], np.cumsum(lengths)])
    # Runs of consecutive sentences that go to the same split (documents are contiguous).
    first = int(doc_index[0])
    in_val = np.array([is_val_document(d, val_fraction) for d in range(first, int(doc_index[-1]) + 1)], dtype=bool)
    doc_split = in_val[doc_index - first]
    bounds = np.nonzero(np.diff(doc_split.astype(np.int8)))[0] + 1
    for a, b in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(lengths)]])):
        split = "val" if doc_split[a] else "train"
        writers[split].add(ids[starts[a]:starts[b]], lengths[a:b], ends_doc[a:b])


def _move_ends(ends_doc: np.ndarray, keep: np.ndarray, doc_index: np.ndarray) -> tuple[np.ndarray, set[int]]:
    """Move each document-end flag from a dropped sentence to the document's last kept sentence.

    Returns:
        The new flags, and the documents whose end found no kept sentence in this chunk.
    """
    ends = ends_doc.copy()
    lost: set[int] = set()
    for i in np.nonzero(ends_doc & ~keep)[0]:
        ends[i] = False
        j = i - 1
        while j >= 0 and doc_index[j] == doc_index[i] and not keep[j]:
            j -= 1
        if j >= 0 and doc_index[j] == doc_index[i]:
            ends[j] = True
        else:
            lost.add(int(doc_index[i]))
    return ends, lost


# --- reading shards -----------------------------------------------------------------------------


class Shards:
    """An opened shard folder (read-only memory maps)."""

    def __init__(self, path: Path, meta: dict):
        self.path = path
        self.meta = meta
        self.dtype = np.dtype(meta["dtype"])
        self._tokenizer = None
        self._cache: dict[tuple[str, str], np.ndarray] = {}

    @classmethod
    def open(cls, path: str | Path) -> Shards:
        """Open a folder written by :func:`prepare`.

        Raises:
            DataError: the folder or its ``meta.json`` is missing, unreadable, or not lmforge shards.
        """
        p = Path(path)
        if p.is_file():  # a text corpus given where its shards go: tokenize it first, into a folder of its own
            shards = p.with_name(f"{p.name.split('.')[0] or 'corpus'}-shards")
            raise DataError(f"{p} is a file; this reads token shards: make them from it with lmforge prepare "
                            f"--tokenizer TOKENIZER --out {shards} {p}, then give {shards}")
        if not p.is_dir():
            raise DataError(f"shard folder not found: {p} (make one with: lmforge prepare --out {p} ...)")
        mp = p / "meta.json"
        if not mp.is_file():
            raise DataError(f"{p} has no meta.json; it is not a finished shard folder (run lmforge prepare again)")
        try:
            meta = json.loads(mp.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise DataError(f"{mp} is corrupt ({e}); run lmforge prepare again") from None
        check_meta(meta, mp)
        shards = cls(p, meta)
        for split in SPLITS:
            c = meta["splits"][split]
            for name, n, itemsize in (("tokens", c["tokens"], shards.dtype.itemsize),
                                      ("sentences", c["sentences"] + 1, 8), ("documents", c["documents"] + 1, 8)):
                f = p / f"{split}.{name}.bin"
                if not f.is_file() or f.stat().st_size != n * itemsize:
                    raise DataError(f"{f} is missing or truncated ({n} {name} entries expected); "
                                    "run lmforge prepare again")
        shards._check_vocab(mp)
        return shards

    def _check_vocab(self, meta_path: Path) -> None:
        """meta.json's vocabulary agrees with the tokens: the dtype its size takes, and no id at or above it
        (:mod:`lmforge.data.shard_check` reads every array once, offsets included)."""
        v = self.vocab_size
        if self.dtype != dtype_for_vocab(v):
            raise DataError(f"{meta_path} says vocab_size {v} and dtype {self.dtype.name}, which disagree; "
                            "run lmforge prepare again")
        check_shard_arrays(self.path, self.meta, self.dtype)

    @property
    def tokenizer_hash(self) -> str:
        return self.meta["tokenizer_hash"]

    @property
    def kind(self) -> str:
        return self.meta["tokenizer_kind"]

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    def tokenizer(self):
        """The Tokenizer that made these shards (copied into the folder by :func:`prepare`)."""
        if self._tokenizer is None:
            self._tokenizer = Tokenizer.load(self.path / TOKENIZER_SUBDIR)
        return self._tokenizer

    def check_tokenizer(self, tok) -> None:
        """Raise DataError unless ``tok`` is the tokenizer that made these shards (same hash)."""
        if tok.hash != self.tokenizer_hash:
            raise DataError(
                f"shards in {self.path} were made by tokenizer {self.tokenizer_hash[:12]}, not {tok.hash[:12]}; "
                "prepare the corpus again with this tokenizer, or use the tokenizer that made the shards"
            )

    def _check_split(self, split: str) -> None:
        if split not in SPLITS:
            raise DataError(f"split must be one of {SPLITS}, not {split!r}")

    def _array(self, split: str, name: str, dtype: np.dtype, n: int) -> np.ndarray:
        key = (split, name)
        if key not in self._cache:
            f = self.path / f"{split}.{name}.bin"
            if n == 0:
                arr = np.zeros(0, dtype=dtype)
            else:
                try:
                    arr = np.memmap(f, dtype=dtype, mode="r", shape=(n,))
                except (OSError, ValueError) as e:
                    raise DataError(f"{f} is missing or truncated ({e}); run lmforge prepare again") from None
            self._cache[key] = arr
        return self._cache[key]

    def tokens(self, split: str = "train") -> np.ndarray:
        """1-D memmap of the token ids of ``split`` (``self.dtype``)."""
        self._check_split(split)
        return self._array(split, "tokens", self.dtype, self.meta["splits"][split]["tokens"])

    def sentences(self, split: str = "train") -> np.ndarray:
        """int64 sentence start offsets into :meth:`tokens`, length ``n_sentences + 1``."""
        self._check_split(split)
        return self._array(split, "sentences", np.dtype(np.int64), self.meta["splits"][split]["sentences"] + 1)

    def documents(self, split: str = "train") -> np.ndarray:
        """int64 document start offsets into :meth:`sentences`, length ``n_documents + 1``."""
        self._check_split(split)
        return self._array(split, "documents", np.dtype(np.int64), self.meta["splits"][split]["documents"] + 1)

    def counts(self, split: str = "train") -> dict[str, int]:
        """``{"documents", "sentences", "tokens"}`` of ``split``."""
        return dict(self.meta["splits"][split])

    def __repr__(self) -> str:
        c = self.meta["splits"]
        return (f"Shards({str(self.path)!r}, kind={self.kind}, train={c['train']['tokens']} tokens, "
                f"val={c['val']['tokens']} tokens)")
