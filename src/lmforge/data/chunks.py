"""A corpus cut into chunks of documents and tokenized by a pool of processes, in order, in bounded memory.

:func:`read_chunks` runs in the calling process: it cuts the blocks of units of text that the sources
give (:meth:`lmforge.data.sources.Corpus.unit_blocks`) into chunks of about the same number of
characters, each noting where its documents end and whether its first one began earlier (a document
may span chunks). :class:`ChunkEncoder` hands the chunks to ``workers`` processes (forked on Linux,
spawned elsewhere), each holding its own single-threaded copy of the tokenizer, which split the
units into sentences and encode them; the results come back in the order of the chunks, with at
most ``workers + 2`` chunks in flight, so memory does not grow with the corpus. The output depends
only on the chunks, never on the number of workers: shards are byte-identical whatever it is.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import ctypes
import dataclasses
import functools
import itertools
import logging
import multiprocessing
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from ..errors import LmforgeError
from ..text import is_cjk_or_punct
from .corpus import SENTENCE, unit_sentences

logger = logging.getLogger(__name__)


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclasses.dataclass
class Chunk:
    """Units of text of consecutive documents (see :func:`read_chunks`).

    Only what changes rarely is stored beside the units (where the mode changes, where documents
    end), so cutting a corpus into chunks costs one append per unit.
    """

    units: list[str] = dataclasses.field(default_factory=list)
    modes: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (first unit, mode) at each change
    doc_ends: list[int] = dataclasses.field(default_factory=list)  # the units that end their document, ascending
    first_doc: int = 0  # the corpus-wide index of the first unit's document
    continues: bool = False  # the first unit's document began in an earlier chunk
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


def read_chunks(blocks: Iterable[tuple[int, list[str], list[int]]], take_bytes: Callable[[], int],
                chunk_chars: int) -> Iterator[Chunk]:
    """Cut a stream of blocks of units into chunks of about ``chunk_chars`` characters.

    Args:
        blocks: ``(mode, units, ends)`` as :meth:`lmforge.data.sources.Corpus.unit_blocks` gives them.
        take_bytes: returns the stored bytes read since its last call (for each chunk's ``bytes_read``).
        chunk_chars: characters per chunk: a chunk is cut before the first unit that finds it full.
    """
    chunk = Chunk()
    doc = 0
    starting = True  # the next unit starts a document
    for mode, units, ends in blocks:
        j = 0
        while j < len(ends) and ends[j] == 0:  # the end of an earlier block's last unit, still in ``chunk``
            chunk.doc_ends.append(len(chunk.units) - 1)
            doc, starting, j = doc + 1, True, j + 1
        cum = list(itertools.accumulate(map(len, units)))
        start = 0
        while start < len(units):
            if chunk.chars >= chunk_chars:
                chunk.bytes_read = take_bytes()
                yield chunk
                chunk = Chunk(first_doc=doc, continues=not starting)
            base = cum[start - 1] if start else 0
            stop = min(bisect.bisect_left(cum, base + chunk_chars - chunk.chars, lo=start) + 1, len(units))
            if not chunk.modes or chunk.modes[-1][1] != mode:
                chunk.modes.append((len(chunk.units), mode))
            chunk.units.extend(units[start:stop])
            chunk.chars += cum[stop - 1] - base
            starting = False
            while j < len(ends) and ends[j] <= stop:
                chunk.doc_ends.append(len(chunk.units) - 1 - (stop - ends[j]))
                doc, starting, j = doc + 1, ends[j] == stop, j + 1
            start = stop
    chunk.bytes_read += take_bytes()
    if chunk.units or chunk.bytes_read:
        yield chunk


def chunk_sentences(chunk: Chunk, bpe_spacing: bool) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Split a chunk's units into sentences.

    ``bpe_spacing``: a sentence after the first of its document gets a leading space (unless it starts
    with a CJK character), so that byte-level BPE's stream decodes to the document's text.

    Returns:
        The sentences, and per sentence its document's index and whether it ends that document.
    """
    n = len(chunk.units)
    sentences: list[str] = []
    per_unit = np.ones(n, dtype=np.int64)
    for (a, mode), (b, _) in zip(chunk.modes, [*chunk.modes[1:], (n, None)]):
        if mode == SENTENCE:  # a unit is a sentence: no Python step per unit
            sentences.extend(chunk.units[a:b])
            continue
        for i in range(a, b):
            sents = unit_sentences(chunk.units[i], mode) or [""]  # "" has no tokens: its document end moves back
            sentences.extend(sents)
            per_unit[i] = len(sents)
    unit_ends = np.zeros(n, dtype=bool)
    unit_ends[chunk.doc_ends] = True
    unit_doc = chunk.first_doc + np.cumsum(unit_ends) - unit_ends  # documents ended before each unit
    last = np.cumsum(per_unit) - 1  # each unit's last sentence
    ends = np.zeros(len(sentences), dtype=bool)
    ends[last[unit_ends]] = True
    if bpe_spacing:
        first = np.ones(len(sentences), dtype=bool)  # the first sentence of its document
        first[1:] = ends[:-1]
        first[0] = not chunk.continues
        sentences = [s if f or not s or is_cjk_or_punct(s[0]) else " " + s for s, f in zip(sentences, first.tolist())]
    return sentences, np.repeat(unit_doc, per_unit), ends


def encode_chunk(chunk: Chunk, tokenizer, bpe_spacing: bool, dtype: np.dtype) -> Encoded:
    """Split a chunk's units into sentences (:func:`chunk_sentences`) and encode them with a
    ``tokenizers.Tokenizer``, the ids flattened into one array of ``dtype``."""
    sentences, doc_index, ends = chunk_sentences(chunk, bpe_spacing)
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # no offsets: they are not needed
    ids_of = [e.ids for e in encode(sentences, add_special_tokens=False)]
    lengths = np.fromiter(map(len, ids_of), dtype=np.int64, count=len(ids_of))
    ids = np.fromiter(itertools.chain.from_iterable(ids_of), dtype=dtype, count=int(lengths.sum()))
    return Encoded(ids, lengths, doc_index, ends, chunk.bytes_read)


# --- the pool -----------------------------------------------------------------------------------

_WORKER: dict = {}


def _init_worker(tokenizer_file: str, bpe_spacing: bool, dtype: str, parent: int) -> None:
    _die_with_parent(parent)
    # one thread per process: the processes are the parallelism (read by tokenizers at each batch)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer as HFTokenizer

    _WORKER.update(tokenizer=HFTokenizer.from_file(tokenizer_file), bpe_spacing=bpe_spacing, dtype=np.dtype(dtype))


def _die_with_parent(parent: int) -> None:
    """End this worker when the process that started it ends, however it ends.

    A worker waits for chunks on a queue: once its parent is killed (SIGKILL, or a crash) nothing would ever
    come, and it would wait forever, holding the pipe a caller reads the command's output from.  Linux's
    ``PR_SET_PDEATHSIG`` sends it SIGKILL when the parent dies; Ctrl-C and SIGTERM reach the parent, which ends
    its workers itself (:meth:`ChunkEncoder.encode`), so the worker ignores SIGINT and takes SIGTERM's default.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # no prctl in this C library: the parent's own cleanup remains
            pass
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def _end_workers(pool) -> None:
    """Stop ``pool``'s worker processes now (the command is stopping: their chunks are no longer wanted).

    Python 3.14's ``ProcessPoolExecutor.terminate_workers`` does this; before it, the executor's process table."""
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:
        terminate()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()


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
            except BaseException as e:  # a stop (Ctrl-C, SIGTERM, the generator closed) or an error: end the workers
                if isinstance(pool, ProcessPoolExecutor):
                    _end_workers(pool)
                if not isinstance(e, BrokenProcessPool):
                    raise
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
                                   initargs=(str(path), self.bpe_spacing, self.dtype.name, os.getpid()))
        return pool, _encode_in_worker
