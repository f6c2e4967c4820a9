"""Reading text files: plain or compressed, checked to be UTF-8 text, streamed line by line in bounded memory.

User errors (missing file, a directory, binary data, UTF-16 text, bytes that are not UTF-8) raise
:class:`lmforge.errors.DataError` with one line naming the file (and line).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import DataError
from .compression import open_binary

ENCODING_ERRORS = ("strict", "replace")


def check_file(path: str | Path) -> Path:
    """Return ``path`` as a Path after checking it is an existing, readable, non-binary file.

    Raises:
        DataError: the path does not exist, is a directory, holds binary data (NUL bytes) or UTF-16 text,
            or its suffix promises a compression it does not have.
    """
    p = Path(path)
    if not p.exists():
        raise DataError(f"file not found: {p}")
    if p.is_dir():
        raise DataError(f"{p} is a directory; pass it where directories are read (lmforge prepare, tokenizer train)")
    if not p.is_file():
        raise DataError(f"{p} is not a regular file")
    head = read_head(p)
    utf16 = utf16_name(head)
    if utf16:
        raise DataError(f"{p} is {utf16} text, not UTF-8; convert it first, e.g. iconv -f {utf16.split()[0]} "
                        f"-t UTF-8 {p} > {p.stem}.utf8{p.suffix}")
    if b"\x00" in head:
        raise DataError(f"{p} looks like a binary file (it contains NUL bytes); pass UTF-8 text (plain or compressed), "
                        "JSONL, CSV or Parquet")
    return p


def read_head(p: Path, n: int = 8192) -> bytes:
    """The first ``n`` bytes of ``p``, decompressed (DataError when it cannot be read)."""
    try:
        with open_binary(p) as (f, _):
            return f.read(n)
    except OSError as e:
        raise DataError(f"cannot read {p}: {e}") from None


def utf16_name(head: bytes) -> str | None:
    """"UTF-16 (little-endian, with BOM)" and the like when ``head`` is UTF-16/32 text, else None."""
    for bom, name in ((b"\xff\xfe\x00\x00", "UTF-32 (little-endian, with BOM)"),
                      (b"\x00\x00\xfe\xff", "UTF-32 (big-endian, with BOM)"),
                      (b"\xff\xfe", "UTF-16 (little-endian, with BOM)"),
                      (b"\xfe\xff", "UTF-16 (big-endian, with BOM)")):
        if head.startswith(bom):
            return name
    n = len(head) // 2 * 2
    if n >= 8:  # text of mostly ASCII characters: every other byte is NUL
        even, odd = head[0:n:2].count(0), head[1:n:2].count(0)
        if odd > 0.9 * n / 2 and even == 0:
            return "UTF-16 (little-endian, no BOM)"
        if even > 0.9 * n / 2 and odd == 0:
            return "UTF-16 (big-endian, no BOM)"
    return None


#: the longest piece of a line handed on at once; a longer line is cut at white space into pieces
MAX_LINE_BYTES = 1 << 20


def _bounded_lines(f, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of a binary file, a line longer than ``limit`` bytes coming in pieces.

    A piece ends at the last white space (or, with none, at the last UTF-8 character boundary)
    of ``limit`` bytes, so memory stays bounded however long a line is (one 50 MB line of a
    dumped corpus) and no word or character is cut; each piece then reads as a line of its own.
    """
    lineno, carry = 1, b""
    while True:
        chunk = carry + f.readline(limit - len(carry))
        if not chunk:
            return
        if chunk.endswith(b"\n") or len(chunk) < limit:  # a whole line (or the file's last)
            yield lineno, chunk
            lineno, carry = lineno + 1, b""
            continue
        cut = max(chunk.rfind(b" "), chunk.rfind(b"\t")) + 1
        if cut <= 0:
            cut = len(chunk)
            while cut > 1 and (chunk[cut - 1] & 0xC0) == 0x80:  # back off over continuation bytes
                cut -= 1
            if chunk[cut - 1] >= 0xC0:  # and over the lead byte of the cut character
                cut -= 1
            cut = max(cut, 1)
        yield lineno, chunk[:cut]
        carry = chunk[cut:]


def read_lines(path: str | Path, encoding_errors: str = "strict",
               on_bytes: Callable[[int], None] | None = None) -> Iterator[str]:
    """Stream the lines of a UTF-8 text file (plain or compressed), without their line endings.

    Args:
        path: the file (gzip, bzip2, xz and zstandard files are decompressed on the fly).
        encoding_errors: ``"strict"`` (bytes that are not UTF-8 raise DataError naming file and line)
            or ``"replace"`` (they become U+FFFD).
        on_bytes: called every 4096 lines (and at the end) with the number of bytes of the stored
            file read since the last call; the calls add up to the file's size.
    Yields:
        Each line as ``str`` (a leading BOM is dropped).
    """
    if encoding_errors not in ENCODING_ERRORS:
        raise DataError(f"encoding_errors must be one of {ENCODING_ERRORS}, not {encoding_errors!r}")
    p = check_file(path)
    reported = 0
    with open_binary(p) as (f, stored):
        for lineno, raw in _bounded_lines(f):
            if on_bytes is not None and lineno % 4096 == 0:
                now = stored()
                on_bytes(now - reported)
                reported = now
            if b"\x00" in raw:
                raise DataError(f"{p} line {lineno}: NUL byte; this looks like a binary file, not text")
            try:
                line = raw.decode("utf-8", errors=encoding_errors)
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{p} line {lineno}: bytes that are not UTF-8 ({raw[e.start:e.start + 4]!r}); "
                    "convert the file to UTF-8 or pass --encoding-errors replace"
                ) from None
            if lineno == 1 and line.startswith("\ufeff"):
                line = line[1:]
            yield line.rstrip("\r\n")
    if on_bytes is not None and p.stat().st_size > reported:
        on_bytes(p.stat().st_size - reported)
