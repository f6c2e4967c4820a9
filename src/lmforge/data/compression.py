"""Compressed inputs: gzip, bzip2, xz and zstandard, recognised by their signature bytes, not their suffix.

:func:`open_binary` gives the decompressed byte stream of any input file together with a function
returning how many bytes of the stored (compressed) file have been read, which is what progress bars
count: it is known for every format before reading, where the decompressed size is not.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import DataError, require

# name -> how the file starts; bzip2's signature is checked further in _kind_of
_MAGIC = {"gzip": b"\x1f\x8b", "bzip2": b"BZh", "xz": b"\xfd7zXZ\x00", "zstd": b"\x28\xb5\x2f\xfd"}
#: suffix -> the compression it promises (a file with one of these suffixes must start with its signature)
SUFFIXES = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}
# bzip2: "BZh", the block size digit, then the first block's magic (pi) or an empty stream's end (sqrt pi)
_BZ2_BLOCKS = (b"\x31\x41\x59\x26\x53\x59", b"\x17\x72\x45\x38\x50\x90")


def _kind_of(head: bytes) -> str | None:
    for name, magic in _MAGIC.items():
        if head.startswith(magic):
            if name == "bzip2" and not (head[3:4].isdigit() and head[4:10] in _BZ2_BLOCKS):
                continue
            return name
    return None


def compression_of(path: Path) -> str | None:
    """The compression of ``path`` read from its first bytes (None: stored as is).

    Raises:
        DataError: the suffix promises a compression (``.gz``, ``.bz2``, ``.xz``, ``.zst``) that the
            content does not have.
    """
    with open(path, "rb") as f:
        head = f.read(10)
    kind = _kind_of(head)
    promised = SUFFIXES.get(path.suffix.lower())
    if kind is None and promised is not None:
        raise DataError(f"{path} is not a valid {promised} file (it does not start with the {promised} signature); "
                        f"check the download or drop the {path.suffix} suffix")
    return kind


def stripped_suffix(path: Path) -> str:
    """The suffix that says what is inside: ``.csv`` for ``data.csv.gz``, ``.txt`` for ``a.txt``."""
    suffixes = [s.lower() for s in path.suffixes]
    while suffixes and suffixes[-1] in SUFFIXES:
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def _zstd_reader(raw: BinaryIO) -> BinaryIO:
    zstandard = require("zstandard", "data")
    return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True))


_OPENERS: dict[str, Callable[[BinaryIO], BinaryIO]] = {
    "gzip": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    "bzip2": lambda raw: bz2.BZ2File(raw, "rb"),
    "xz": lambda raw: lzma.LZMAFile(raw, "rb"),
    "zstd": _zstd_reader,
}


def decompress_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a corrupt compressed stream raises while it is read."""
    errors: list[type[BaseException]] = [gzip.BadGzipFile, zlib.error, EOFError, lzma.LZMAError]
    with contextlib.suppress(ImportError):
        import zstandard  # optional (the data extra): only its error class is needed here

        errors.append(zstandard.ZstdError)
    return tuple(errors)


def corrupt(path: Path, kind: str | None, e: BaseException) -> DataError:
    """The one-line error for a compressed file that breaks off or holds garbage."""
    return DataError(f"{path} is not a valid {kind or 'compressed'} file ({e}); check the download or "
                     "decompress it and pass the plain file")


@contextlib.contextmanager
def open_binary(path: Path) -> Iterator[tuple[BinaryIO, Callable[[], int]]]:
    """Open ``path`` for reading, decompressed when it is compressed.

    Yields:
        ``(stream, stored_position)``: the decompressed bytes, and a function giving how many bytes
        of the file on disk have been consumed so far (for progress).
    Raises:
        DataError: a suffix promising a compression the file does not have, or (while reading) a
            corrupt compressed stream.
    """
    kind = compression_of(path)
    with open(path, "rb") as raw:
        if kind is None:
            yield raw, raw.tell
            return
        try:
            with _OPENERS[kind](raw) as stream:
                yield stream, raw.tell
        except decompress_errors() as e:
            raise corrupt(path, kind, e) from None
        except OSError as e:  # bz2 reports a corrupt stream as a plain OSError without a file name
            if e.filename is not None or e.errno is not None:
                raise
            raise corrupt(path, kind, e) from None
