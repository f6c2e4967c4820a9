"""``lmforge prepare``: stream text files through a tokenizer into token shards."""

from __future__ import annotations

import argparse

EPILOG = """\
examples:
  lmforge prepare --tokenizer tok-wp --out shards-wp corpus.txt
  lmforge prepare --tokenizer tok-bpe --out shards-bpe --val-fraction 0.01 books/*.txt.gz

Layouts: "lines" = one sentence per line, a blank line between documents (BERT's format);
"paragraphs" = free text split into sentences (English . ! ?, Chinese 。！？；…). "auto" looks at
the first lines of each file. The folder gets train/val token arrays (uint16, or uint32 for large
vocabularies), sentence and document offsets, meta.json and a copy of the tokenizer. It is written
beside --out and renamed into place when complete; what a killed run left there is removed by the
next one. A line longer than 1 MiB is read in pieces cut at white space (each piece then counts as
a line of its own), so memory stays bounded: a 50 MB single-line file peaks at about 240 MB.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "prepare", help="tokenize text files into memory-mapped shards for pretraining", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Tokenize text files into token shards (streaming: memory does not grow with the corpus).",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="UTF-8 text files (.txt or .gz)")
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="tokenizer folder (lmforge tokenizer train)")
    p.add_argument("--out", required=True, metavar="DIR", help="shard folder to write (replaces an old shard folder)")
    p.add_argument("--val-fraction", type=float, default=0.05, metavar="F",
                   help="share of documents held out for validation (default 0.05; at least one document). 0 makes "
                        "shards for `evaluate lm --split train` only: pretraining refuses shards without a val split")
    p.add_argument("--encoding-errors", choices=["strict", "replace"], default="strict",
                   help="strict: stop at bytes that are not UTF-8 (naming file and line); replace: use U+FFFD")
    p.add_argument("--layout", choices=["auto", "lines", "paragraphs"], default="auto",
                   help="how the files are laid out (default: detect per file)")
    p.add_argument("--workers", type=int, default=2, metavar="N", help="encoding threads (default 2)")
    p.set_defaults(func=run)


def run(args) -> int:
    import sys
    from pathlib import Path

    from tqdm import tqdm

    from ..data.corpus import check_file
    from ..data.shards import prepare, uncompressed_size
    from ..errors import DataError
    from ..folders import output_folder, write_marker

    if not 0 <= args.val_fraction < 1:
        raise DataError(f"--val-fraction must be in [0, 1), not {args.val_fraction}")
    total = sum(uncompressed_size(check_file(f)) for f in args.files)
    # the shards are written beside --out and renamed into place: lock and check writability there
    with output_folder(args.out, "shards", inputs=[args.tokenizer], beside=True, hint=None) as out:
        with tqdm(total=total, unit="B", unit_scale=True, desc="prepare", file=sys.stderr,
                  disable=True if args.quiet else None, dynamic_ncols=True, leave=False) as bar:
            meta = prepare(
                args.files, args.tokenizer, args.out, val_fraction=args.val_fraction,
                encoding_errors=args.encoding_errors, layout=args.layout, workers=args.workers, progress=bar.update,
            )
        write_marker(out, "shards")
    print(format_summary(Path(args.out), meta))
    if meta["splits"]["val"]["tokens"] == 0:
        print("note: no validation split (--val-fraction 0): these shards can be scored with `lmforge evaluate lm "
              "--split train` but not pretrained on", file=sys.stderr)
    return 0


def format_summary(out, meta: dict) -> str:
    """A few lines describing a shard folder's meta.json."""
    s = meta["splits"]
    layouts = sorted({src["layout"] for src in meta["sources"]})
    lines = [
        f"wrote {out}: {meta['tokenizer_kind']} tokens ({meta['dtype']}, vocab {meta['vocab_size']}, "
        f"tokenizer {meta['tokenizer_hash'][:12]}) from {len(meta['sources'])} file(s), layout {'/'.join(layouts)}",
    ]
    for split in ("train", "val"):
        c = s[split]
        lines.append(f"  {split:<5} {c['documents']:>9,} documents {c['sentences']:>11,} sentences "
                     f"{c['tokens']:>13,} tokens")
    return "\n".join(lines)
