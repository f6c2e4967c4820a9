"""The corpus inputs of ``prepare`` and ``tokenizer train``: files, folders, datasets and how to read them."""

from __future__ import annotations

from ..data.sources import Corpus, CorpusOptions
from ..errors import DataError

INPUTS_HELP = """\
inputs: text (.txt, any suffix; gzip/bzip2/xz/zstandard compressed is fine), JSON Lines, JSON, CSV, TSV,
Parquet, a folder written by datasets' save_to_disk, and folders of any of these (read recursively).
The format is told from each file's content (a JSON Lines file is never read as text); every record
of a record format is one document, its text in --text-field.
"""


def add_corpus_args(p) -> None:
    """Positional FILE... and the flags saying how to read them (one group in --help)."""
    p.add_argument("files", nargs="*", metavar="PATH",
                   help="files and folders (any format below; folders are read recursively)")
    g = p.add_argument_group("corpus inputs")
    g.add_argument("--dataset", action="append", default=[], metavar="NAME_OR_PATH",
                   help="also read this dataset: a save_to_disk folder, a folder of data files, or a dataset in the "
                   "local datasets cache (loaded offline; repeatable)")
    g.add_argument("--split", default="train", help="the split of a dataset that has several (default train)")
    g.add_argument("--text-field", "--text-column", dest="text_field", action="append", default=None, metavar="NAME",
                   help="the field (JSON, Parquet, datasets) or column (CSV/TSV) holding the text (default text); "
                   "repeated: each input reads the first of them it has; a 0-based number reads a CSV/TSV file "
                   "without a header row")
    g.add_argument("--format", default="auto",
                   choices=["auto", "text", "jsonl", "json", "csv", "tsv", "parquet"],
                   help="read every file as this format instead of telling it from the content")
    g.add_argument("--glob", default=None, metavar="PATTERN",
                   help="in folders, read only the files matching PATTERN (without /: the file name at any depth, "
                   "e.g. '*.jsonl'; with /: the path inside the folder)")
    g.add_argument("--layout", choices=["auto", "lines", "paragraphs"], default="auto",
                   help="text files: lines = one sentence per line, paragraphs = free text (default: detect per "
                   "file); records: how a record's text is split into sentences")
    g.add_argument("--encoding-errors", choices=["strict", "replace"], default="strict",
                   help="strict: stop at bytes that are not UTF-8 (naming file and line); replace: use U+FFFD")


def corpus_from_args(args):
    """The :class:`~lmforge.data.sources.Corpus` the flags describe (inputs checked, nothing read yet)."""
    if not args.files and not args.dataset:
        raise DataError("no input given; pass files or folders, or --dataset NAME_OR_PATH")
    options = CorpusOptions(text_field=tuple(args.text_field or ["text"]), format=args.format, glob=args.glob,
                            layout=args.layout, encoding_errors=args.encoding_errors, split=args.split)
    return Corpus.open(args.files, args.dataset, options)
