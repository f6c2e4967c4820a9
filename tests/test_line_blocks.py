"""Text of one sentence a line read a block at a time gives what the line reader gives: the same units,
document ends, errors (naming the line) and progress, whatever the block size; and chunks cut from
blocks hold the same sentences, documents and document ends as the units one by one."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from lmforge.data import line_blocks as lb
from lmforge.data.chunks import chunk_sentences, read_chunks
from lmforge.data.corpus import PARAGRAPH, SENTENCE, iter_units, unit_sentences
from lmforge.data.textfiles import MAX_LINE_BYTES
from lmforge.errors import DataError

TRICKY = (
    "\ufeffFirst line, after a BOM.\r\nSecond line.\r\n\r\n"  # CRLF, a document of two lines
    "   \n\t\n"  # blank lines of white space only, no document open
    "  Indented line.  \nno blank line after this one\n\n\n\n"
    "A line with a form feed\x0c inside and a \u2028 line separator.\n"
    "中文的一行。\n\nlast line without a newline"
)


def flatten(blocks) -> list[str | None]:
    """Blocks back into the unit stream, None ending each document."""
    out: list[str | None] = []
    for units, ends in blocks:
        j = 0
        for k in range(len(units) + 1):
            while j < len(ends) and ends[j] == k:
                out.append(None)
                j += 1
            if k < len(units):
                out.append(units[k])
    return out


def by_lines(path, errors="strict") -> list[str | None]:
    mode, units = iter_units(path, "lines", errors)
    assert mode == SENTENCE
    return list(units)


@pytest.mark.parametrize("block_bytes", [1, 7, 64, 1 << 19])
@pytest.mark.parametrize("text", [TRICKY, TRICKY + "\n\n", "\n\n\nonly one\n", "", "\n \n"])
def test_blocks_give_the_units_of_the_line_reader(tmp_path, text, block_bytes):
    f = tmp_path / "c.txt"
    f.write_bytes(text.encode("utf-8"))
    got = []
    blocks = lb.line_blocks(f, on_bytes=got.append, block_bytes=block_bytes)
    assert flatten(blocks) == by_lines(f)
    assert sum(got) == f.stat().st_size


def test_compressed_and_replaced_bytes(tmp_path):
    raw = TRICKY.encode("utf-8").replace(b"Second", b"Sec\xffond\xc3") + b"\n\xe2\x82\n"
    f = tmp_path / "c.txt.gz"
    f.write_bytes(gzip.compress(raw))
    assert flatten(lb.line_blocks(f, "replace", block_bytes=16)) == by_lines(f, "replace")
    with pytest.raises(DataError) as blocks_err:
        list(lb.line_blocks(f, block_bytes=16))
    with pytest.raises(DataError) as lines_err:
        by_lines(f)
    assert str(blocks_err.value) == str(lines_err.value) and "line 2" in str(lines_err.value)


@pytest.mark.parametrize("bad", [b"a NUL \x00 here", b"not UTF-8 \xc3\x28"])
def test_errors_name_the_line_as_the_line_reader_does(tmp_path, bad):
    f = tmp_path / "c.txt"
    f.write_bytes(b"ok\n" * 5000 + b"\n" + bad + b"\nmore\n")
    with pytest.raises(DataError) as blocks_err:
        list(lb.line_blocks(f, block_bytes=4096))
    with pytest.raises(DataError) as lines_err:
        by_lines(f)
    assert str(blocks_err.value) == str(lines_err.value) and "line 5002" in str(lines_err.value)


def test_an_overlong_line_comes_in_the_line_readers_pieces(tmp_path):
    f = tmp_path / "c.txt"
    long = " ".join(["word"] * (MAX_LINE_BYTES // 5 + 100))  # longer than MAX_LINE_BYTES
    f.write_text("before\n\n" * 100 + long + "\nafter\n\nend\n")
    got = []
    assert flatten(lb.line_blocks(f, on_bytes=got.append, block_bytes=4096)) == by_lines(f)
    assert sum(got) == f.stat().st_size and len(by_lines(f)) > 203  # the long line came in pieces


def test_chunks_from_blocks_hold_the_units_one_by_one():
    rng = np.random.default_rng(0)
    stream: list[tuple[int, str | None]] = []
    for d in range(60):  # documents of sentences and of paragraphs, some long enough to span chunks
        mode = SENTENCE if d % 3 else PARAGRAPH
        for _ in range(int(rng.integers(1, 12))):
            stream.append((mode, "Some words here. And more!" if mode == PARAGRAPH else f"sentence {d}"))
        stream.append((mode, None))
    want_sents, want_docs, want_ends = [], [], []
    doc, sents = 0, []
    for mode, unit in stream:
        if unit is None:
            want_sents += sents
            want_docs += [doc] * len(sents)
            want_ends += [False] * (len(sents) - 1) + [True]
            doc, sents = doc + 1, []
        else:
            sents += unit_sentences(unit, mode)
    for size in (1, 5, 40):  # blocks of up to 1, 5 and 40 stream items (an end may open a block)
        blocks = list(_blocks(stream, size))
        for chunk_chars in (1, 30, 200, 10**6):
            got = [chunk_sentences(c, bpe_spacing=False) for c in read_chunks(blocks, lambda: 0, chunk_chars)]
            assert sum((g[0] for g in got), []) == want_sents
            assert np.concatenate([g[1] for g in got]).tolist() == want_docs
            assert np.concatenate([g[2] for g in got]).tolist() == want_ends


def _blocks(stream, size):
    """``(mode, units, ends)`` of up to ``size`` stream items, one mode a block (as a source gives them)."""
    i = 0
    while i < len(stream):
        mode = stream[i][0]
        part = []
        while i < len(stream) and len(part) < size and stream[i][0] == mode:
            part.append(stream[i][1])
            i += 1
        units = [u for u in part if u is not None]
        ends, n = [], 0
        for u in part:
            if u is None:
                ends.append(n)
            else:
                n += 1
        yield mode, units, ends
