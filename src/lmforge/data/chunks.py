"""A corpus cut into chunks of documents and tokenized by a pool of processes, in order, in bounded memory.

:func:`read_chunks` runs in the calling process: it reads the sources and cuts their units of text
(:meth:`lmforge.data.sources.Corpus.units`) into chunks of about the same number of characters,
each unit carrying its document's index and whether it starts or ends that document (a document
may span chunks). :class:`ChunkEncoder` hands the chunks to ``workers`` processes (forked on Linux,
spawned elsewhere), each holding its own single-threaded copy of the tokenizer, which split the
units into sentences and encode them; the results come back in the order of the chunks, with at
most ``workers + 2`` chunks in flight, so memory does not grow with the corpus. The output depends
only on the chunks, never on the number of workers: shards are byte-identical whatever it is.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from ..errors import LmforgeError
from .corpus import unit_sentences
from .sentences import _CJK

logger = logging.getLogger(__name__)


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclasses.dataclass
class Chunk:
    """Units of text of consecutive documents (see :func:`read_chunks`)."""

    units: list[str] = dataclasses.field(default_factory=list)
    modes: list[int] = dataclasses.field(default_factory=list)  # how each unit splits into sentences
    doc_index: list[int] = dataclasses.field(default_factory=list)  # the corpus-wide index of its document
    starts_doc: list[bool] = dataclasses.field(default_factory=list)
    ends_doc: list[bool] = dataclasses.field(default_factory=list)
    chars: int = 0
    bytes_read: int = 0  # bytes of the stored inputs read for this chunk (progress)


@dataclasses.dataclass
class Encoded:
    """A chunk's sentences, tokenized: ``ids`` concatenated, and per sentence its length (none is
    dropped here: a sentence may have no tokens), its document's index and whether it ends it."""

    ids: np.ndarray
    lengths: np.ndarray
    doc_index: np.ndarray
    ends_doc: np.ndarray
    bytes_read: int


def read_chunks(units: Iterable[tuple[int, str | None]], take_bytes: Callable[[], int],
                chunk_chars: int) -> Iterator[Chunk]:
    """Cut a stream of ``(mode, unit)`` (``unit`` None ends a document) into chunks.

    Args:
        units: e.g. :meth:`lmforge.data.sources.Corpus.units`.
        take_bytes: returns the stored bytes read since its last call (for each chunk's ``bytes_read``).
        chunk_chars: characters per chunk.
    """
    chunk = Chunk()
    doc = 0
    starting = True
    for mode, unit in units:
        if unit is None:  # the document's last unit is still in ``chunk``: chunks are cut before a unit
            chunk.ends_doc[-1] = True
            doc += 1
            starting = True
            continue
        if chunk.chars >= chunk_chars:
            chunk.bytes_read = take_bytes()
            yield chunk
            chunk = Chunk()
        chunk.units.append(unit)
        chunk.modes.append(mode)
        chunk.doc_index.append(doc)
        chunk.starts_doc.append(starting)
        chunk.ends_doc.append(False)
        chunk.chars += len(unit)
        starting = False
    chunk.bytes_read += take_bytes()
    if chunk.units or chunk.bytes_read:
        yield chunk


def encode_chunk(chunk: Chunk, tokenizer, bpe_spacing: bool, dtype: np.dtype) -> Encoded:
    """Split a chunk's units into sentences and encode them with a ``tokenizers.Tokenizer``.

    ``bpe_spacing``: a sentence after the first of its document gets a leading space (unless it starts
    with a CJK character), so that byte-level BPE's stream decodes to the document's text.
    """
    sentences: list[str] = []
    doc_index: list[int] = []
    ends: list[bool] = []
    for unit, mode, d, start, end in zip(chunk.units, chunk.modes, chunk.doc_index, chunk.starts_doc,
                                         chunk.ends_doc):
        sents = unit_sentences(unit, mode) or [""]  # "" has no tokens: its document end moves back
        for i, s in enumerate(sents):
            if bpe_spacing and s and (i > 0 or not start) and not _CJK.match(s[0]):
                s = " " + s
            sentences.append(s)
        doc_index.extend([d] * len(sents))
        ends.extend([False] * (len(sents) - 1) + [end])
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # no offsets: they are not needed
    ids_of = [e.ids for e in encode(sentences, add_special_tokens=False)]
    lengths = np.fromiter(map(len, ids_of), dtype=np.int64, count=len(ids_of))
    ids = np.fromiter(itertools.chain.from_iterable(ids_of), dtype=dtype, count=int(lengths.sum()))
    return Encoded(ids, lengths, np.asarray(doc_index, dtype=np.int64), np.asarray(ends, dtype=bool),
                   chunk.bytes_read)


# --- the pool -----------------------------------------------------------------------------------

_WORKER: dict = {}


def _init_worker(tokenizer_file: str, bpe_spacing: bool, dtype: str) -> None:
    # one thread per process: the processes are the parallelism (read by tokenizers at each batch)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer as HFTokenizer

    _WORKER.update(tokenizer=HFTokenizer.from_file(tokenizer_file), bpe_spacing=bpe_spacing, dtype=np.dtype(dtype))


def _encode_in_worker(chunk: Chunk) -> Encoded:
    return encode_chunk(chunk, _WORKER["tokenizer"], _WORKER["bpe_spacing"], _WORKER["dtype"])


def _context():
    """The way worker processes start: fork on Linux, spawn elsewhere.

    A forked worker is a copy of this process, so a script that calls ``prepare`` needs no
    ``if __name__ == "__main__":`` guard and one read from stdin works; a worker runs none of the
    parent's threads and uses nothing of it but the chunk function (its tokenizer is read from a
    file, single-threaded). Where fork is unsafe or missing (macOS, Windows), workers are spawned.
    """
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def _can_spawn() -> bool:
    """Spawned processes import the parent's main script again, which a script read from stdin is not."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return getattr(main, "__spec__", None) is not None or path is None or os.path.isfile(path)


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


class ChunkEncoder:
    """Encodes chunks in ``workers`` processes, yielding the results in order (see the module docstring).

    Args:
        tokenizer: the ``tokenizers.Tokenizer`` (the workers get a copy; a corpus of one chunk is
            encoded here with it, without starting processes).
        workers: processes, at least 1.
        bpe_spacing, dtype: see :func:`encode_chunk`.
    """

    def __init__(self, tokenizer, workers: int, bpe_spacing: bool, dtype: np.dtype):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, not {workers}")
        self.tokenizer = tokenizer
        self.workers = workers
        self.bpe_spacing = bpe_spacing
        self.dtype = np.dtype(dtype)

    def encode(self, chunks: Iterable[Chunk]) -> Iterator[Encoded]:
        """The encoded chunks, in order; at most ``workers + 2`` are read ahead."""
        it = iter(chunks)
        head = list(itertools.islice(it, 2))
        if len(head) < 2:  # starting processes would cost more than encoding one chunk
            for chunk in head:
                yield encode_chunk(chunk, self.tokenizer, self.bpe_spacing, self.dtype)
            return
        with tempfile.TemporaryDirectory(prefix="lmforge-prepare-") as tmp:
            pool, work = self._pool(Path(tmp))
            try:
                # tokenizers warns in each forked worker when this process used its threads before; the workers
                # run single-threaded (they set the variable again), so say so while they start (at the first chunk)
                with _environ("TOKENIZERS_PARALLELISM", "false"):
                    pending: collections.deque = collections.deque([pool.submit(work, head[0])])
                for chunk in itertools.chain(head[1:], it):
                    pending.append(pool.submit(work, chunk))
                    if len(pending) > self.workers + 1:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            except BrokenProcessPool:
                guard = "" if _context().get_start_method() == "fork" else (
                    "; a script that calls prepare must do so under `if __name__ == \"__main__\":`, since spawned "
                    "workers import it again")
                raise LmforgeError(f"a worker process of prepare died (killed, or out of memory?){guard}") from None
            finally:
                pool.shutdown(wait=True, cancel_futures=True)

    def _pool(self, tmp: Path):
        """The executor and the function it runs on a chunk."""
        context = _context()
        if context.get_start_method() == "spawn" and not _can_spawn():
            # threads: tokenizers encodes without holding the GIL, the rest waits on it
            logger.info("worker processes cannot import the main script (read from stdin?): encoding in threads")
            work = functools.partial(encode_chunk, tokenizer=self.tokenizer, bpe_spacing=self.bpe_spacing,
                                     dtype=self.dtype)
            return ThreadPoolExecutor(self.workers), work
        # The tokenizer goes to the workers as a file: what the parent writes to a spawned worker stays small,
        # so one that dies while starting is reported (BrokenProcessPool) instead of blocking the write.
        path = tmp / "tokenizer.json"
        self.tokenizer.save(str(path))
        pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_init_worker,
                                   initargs=(str(path), self.bpe_spacing, self.dtype.name))
        return pool, _encode_in_worker
