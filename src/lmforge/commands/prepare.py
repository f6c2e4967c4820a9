"""``lmforge prepare``: stream a corpus (any format) through a tokenizer into token shards."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from ..data.shards import prepare
from ..errors import DataError
from ..storage.folders import write_marker
from ..storage.writing import output_folder
from . import command_help
from ._common import add_json_arg, add_overwrite_arg, show
from ._corpus import INPUTS_HELP, add_corpus_args, corpus_from_args

EPILOG = """\
examples:
  lmforge prepare --tokenizer tok-wp --out shards-wp corpus.txt
  lmforge prepare --tokenizer tok-bpe --out shards-bpe --val-fraction 0.01 books/
  lmforge prepare --tokenizer tok-wp --out shards-wp --text-field body posts.jsonl.zst
  lmforge prepare --tokenizer tok-wp --out shards-wp --dataset my_saved_dataset --text-field content

""" + INPUTS_HELP + """

Layouts: "lines" = one sentence per line, a blank line between documents (BERT's format);
"paragraphs" = free text split into sentences (English . ! ?, Chinese 。！？；…). "auto" looks at
the first lines of each file. The folder gets train/val token arrays (uint16, or uint32 for large
vocabularies), sentence and document offsets, meta.json and a copy of the tokenizer. It is written
beside --out and renamed into place when complete; what a killed run left there is removed by the
next one. An existing --out is refused; --overwrite replaces it (files that are not shards stay).
A line longer than 1 MiB is read in pieces cut at white space (each piece then counts as
a line of its own), so memory stays bounded. --workers processes split and encode chunks of
documents in parallel; the shards are byte-identical whatever their number.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "prepare", help=command_help("prepare"), epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Tokenize a corpus into token shards (streaming: memory does not grow with the corpus).",
    )
    add_corpus_args(p)
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="tokenizer folder (lmforge tokenizer train)")
    p.add_argument("--out", required=True, metavar="DIR", help="shard folder to write")
    add_overwrite_arg(p)
    p.add_argument("--val-fraction", type=float, default=0.05, metavar="F",
                   help="share of documents held out for validation (default 0.05; at least one document). 0 makes "
                        "shards for `evaluate lm --split train` only: pretraining refuses shards without a val split")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="processes that split and encode the text (default: the cores this machine gives lmforge)")
    add_json_arg(p)
    p.set_defaults(func=run, reads=("files", "--dataset", "--tokenizer"), writes=("--out",))


def run(args) -> int:
    if not 0 <= args.val_fraction < 1:
        raise DataError(f"--val-fraction must be in [0, 1), not {args.val_fraction}")
    if args.workers is not None and args.workers < 1:
        raise DataError(f"--workers must be 1 or more, not {args.workers}")
    corpus = corpus_from_args(args)
    # the shards are written beside --out and renamed into place: lock and check writability there
    with output_folder(args.out, "shards", args.overwrite, inputs=[args.tokenizer], beside=True) as out:
        with tqdm(total=corpus.total_bytes, unit="B", unit_scale=True, desc="prepare", file=sys.stderr,
                  disable=True if args.quiet else None, dynamic_ncols=True, leave=False) as bar:
            meta = prepare(corpus, args.tokenizer, args.out, val_fraction=args.val_fraction, workers=args.workers,
                           progress=bar.update, overwrite=args.overwrite)
        write_marker(out, "shards")
    show(args, {"out": str(args.out), **meta}, [format_summary(Path(args.out), meta)])
    if meta["splits"]["val"]["tokens"] == 0:
        print("note: no validation split (--val-fraction 0): these shards can be scored with `lmforge evaluate lm "
              "--split train` but not pretrained on", file=sys.stderr)
    return 0


def format_summary(out, meta: dict) -> str:
    """A few lines describing a shard folder's meta.json."""
    s = meta["splits"]
    kinds: dict[str, set[str]] = {}
    for src in meta["sources"]:  # a record's text is split in the layout given; "auto" goes without saying
        kinds.setdefault(src.get("format", "text"), set()).update({src["layout"]} - {"auto"})
    read = ", ".join(fmt + (f" (layout {'/'.join(sorted(lay))})" if lay else "") for fmt, lay in sorted(kinds.items()))
    lines = [
        f"wrote {out}: {meta['tokenizer_kind']} tokens ({meta['dtype']}, vocab {meta['vocab_size']}, "
        f"tokenizer {meta['tokenizer_hash'][:12]}) from {len(meta['sources'])} source(s): {read}",
    ]
    for split in ("train", "val"):
        c = s[split]
        lines.append(f"  {split:<5} {c['documents']:>9,} documents {c['sentences']:>11,} sentences "
                     f"{c['tokens']:>13,} tokens")
    return "\n".join(lines)
