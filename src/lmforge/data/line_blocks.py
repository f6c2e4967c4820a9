"""Text files of one sentence a line, read a block at a time: what ``prepare`` reads most, at C speed.

A block is ``(units, ends)``: the non-empty stripped lines of about a MiB of the file, and where
documents end, each as the number of the block's units before the end (0: the end belongs to the last
unit of an earlier block). Read unit by unit, the same file gives the same units and ends through
:func:`lmforge.data.textfiles.read_lines` and the ``lines`` layout of :mod:`lmforge.data.corpus`
(``tests/test_line_blocks.py`` holds the two side by side); a block costs a handful of calls into C
(decode, split, strip) instead of several Python steps per line.

What the line reader does differently goes to it: on a NUL byte, bytes that are not UTF-8 (strict)
or a line longer than :data:`~lmforge.data.textfiles.MAX_LINE_BYTES`, the rest of the file is read
by :func:`~lmforge.data.textfiles.read_lines` from the first line of the block on, so its errors
(naming the line) and its pieces of long lines are what comes out.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import DataError
from .compression import open_binary
from .textfiles import ENCODING_ERRORS, MAX_LINE_BYTES, check_file, read_lines

# below MAX_LINE_BYTES, so that a block holds an over-long line only when one is carried over
BLOCK_BYTES = 1 << 19

Block = tuple[list[str], list[int]]


def line_blocks(path: str | Path, encoding_errors: str = "strict", on_bytes: Callable[[int], None] | None = None,
                block_bytes: int = BLOCK_BYTES) -> Iterator[Block]:
    """The units of a ``lines``-layout text file (plain or compressed) and its document ends, in blocks.

    Args:
        path: the file.
        encoding_errors: ``"strict"`` or ``"replace"``.
        on_bytes: called after each block with the bytes of the stored file read since the last call
            (the calls add up to the file's size).
        block_bytes: bytes read at a time.
    Raises:
        DataError: what :func:`~lmforge.data.textfiles.read_lines` raises.
    """
    if encoding_errors not in ENCODING_ERRORS:
        raise DataError(f"encoding_errors must be one of {ENCODING_ERRORS}, not {encoding_errors!r}")
    p = check_file(path)
    state = _State()
    with open_binary(p) as (f, stored):
        carry = b""
        while True:
            data = f.read(block_bytes)
            buf = carry + data
            cut = len(buf) if not data else buf.rfind(b"\n") + 1  # whole lines; at the end, the last one too
            if cut == 0 and len(buf) < MAX_LINE_BYTES:
                if not data:
                    break
                carry = buf  # no line ends yet: read on
                continue
            raw, carry = buf[:cut], buf[cut:]
            text = None if cut == 0 else _decoded(raw, encoding_errors, state.lines == 0)
            if text is None:  # the line reader's business from here on
                yield from _rest_by_lines(p, encoding_errors, on_bytes, state)
                return
            lines = text.split("\n")
            if raw.endswith(b"\n"):
                lines.pop()  # what follows the last newline is the next block's
            yield state.block(lines)
            if on_bytes is not None:
                now = stored()
                on_bytes(now - state.reported)
                state.reported = now
            if not data:
                break
    if state.in_doc:
        yield [], [0]
    if on_bytes is not None and p.stat().st_size > state.reported:
        on_bytes(p.stat().st_size - state.reported)


class _State:
    """Where reading stands: lines read, whether a document is open, stored bytes reported."""

    def __init__(self):
        self.lines = 0
        self.in_doc = False
        self.reported = 0

    def block(self, lines: list[str]) -> Block:
        """Units and document ends of whole lines (as the ``lines`` layout: a blank line ends an open document)."""
        stripped = [line.strip() for line in lines]
        units = list(filter(None, stripped))
        ends = []
        for k, i in enumerate(i for i, s in enumerate(stripped) if not s):  # the k-th blank line, at line i
            if stripped[i - 1] if i else self.in_doc:
                ends.append(i - k)  # the units before it
        if stripped:
            self.in_doc = bool(stripped[-1])
        self.lines += len(lines)
        return units, ends


def _decoded(raw: bytes, encoding_errors: str, first: bool) -> str | None:
    """The text of whole lines, or None when the line reader must read them (see the module docstring)."""
    if b"\x00" in raw or len(raw) >= MAX_LINE_BYTES and _longest_line(raw) >= MAX_LINE_BYTES:
        return None
    try:
        text = raw.decode("utf-8", errors=encoding_errors)
    except UnicodeDecodeError:
        return None
    return text[1:] if first and text.startswith("\ufeff") else text


def _longest_line(raw: bytes) -> int:
    return max(map(len, raw.split(b"\n"))) + 1


def _rest_by_lines(p: Path, encoding_errors: str, on_bytes, state: _State) -> Iterator[Block]:
    """The blocks of the rest of the file, read by the line reader from the first line not yet read."""
    def report(n: int) -> None:  # the line reader counts from the file's start: pass on only what is new
        nonlocal seen
        seen += n
        if seen > state.reported:
            on_bytes(seen - state.reported)
            state.reported = seen

    seen = 0
    lines = itertools.islice(read_lines(p, encoding_errors, report if on_bytes is not None else None),
                             state.lines, None)
    while batch := list(itertools.islice(lines, 4096)):
        yield state.block(batch)
    if state.in_doc:
        state.in_doc = False
        yield [], [0]
