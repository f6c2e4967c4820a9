"""``lmforge tokenizer train`` (WordPiece for BERT, byte-level BPE for GPT) and ``lmforge tokenizer encode``."""

from __future__ import annotations

import argparse
import sys

from ..storage.writing import output_folder, staged_folder
from ..tokenization import Tokenizer
from . import command_help
from ._common import add_json_arg, add_overwrite_arg, show
from ._corpus import INPUTS_HELP, add_corpus_args, corpus_from_args

EPILOG_TRAIN = """\
examples:
  lmforge tokenizer train --kind wordpiece --vocab-size 8000 --out tok-wp corpus.txt
  lmforge tokenizer train --kind bpe --vocab-size 8000 --out tok-bpe books/
  lmforge tokenizer train --kind wordpiece --vocab-size 8000 --out tok-wp --text-column review reviews.csv

""" + INPUTS_HELP + """
The folder holds tokenizer.json (+ vocab.txt for WordPiece), tokenizer_config.json and
special_tokens_map.json: HF transformers' AutoTokenizer loads it unchanged. Inputs are read as
`lmforge prepare` reads them.
"""


def register(sub) -> None:
    p = sub.add_parser("tokenizer", help=command_help("tokenizer"),
                       description="Train or try out tokenizers.")
    tsub = p.add_subparsers(dest="tokenizer_command", metavar="ACTION")
    t = tsub.add_parser(
        "train", help="train a tokenizer on text files", epilog=EPILOG_TRAIN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a tokenizer on a corpus and save it to a folder; prints the final vocabulary size.",
    )
    add_corpus_args(t)
    t.add_argument("--kind", choices=["wordpiece", "bpe"], required=True,
                   help="wordpiece: BERT ([PAD] [UNK] [CLS] [SEP] [MASK], CJK split per character); "
                        "bpe: GPT byte-level BPE with <|endoftext|>")
    t.add_argument("--vocab-size", type=int, required=True, metavar="N",
                   help="target vocabulary size incl. special tokens (the result may be smaller on a small corpus)")
    t.add_argument("--out", required=True, metavar="DIR", help="tokenizer folder to write")
    add_overwrite_arg(t)
    case = t.add_mutually_exclusive_group()
    case.add_argument("--no-lowercase", dest="lowercase", action="store_false", default=None,
                      help="keep case and accents (WordPiece lower-cases and strips accents by default)")
    case.add_argument("--lowercase", dest="lowercase", action="store_true", help="lower-case (default for WordPiece)")
    t.add_argument("--min-frequency", type=int, default=2, metavar="K", help="keep pieces seen K times (default 2)")
    add_json_arg(t)
    t.set_defaults(func=run_train, reads=("files", "--dataset"), writes=("--out",))

    e = tsub.add_parser("encode", help="show how a tokenizer splits some text",
                        description="Print tokens, ids and character offsets of TEXT (no special tokens).")
    e.add_argument("--tokenizer", required=True, metavar="DIR", help="tokenizer folder")
    e.add_argument("text", nargs="+", help="text to encode")
    add_json_arg(e)
    e.set_defaults(func=run_encode, reads=("--tokenizer",))
    p.set_defaults(func=lambda args: (p.print_help(), 1)[1])


def run_train(args) -> int:
    corpus = corpus_from_args(args)
    # written beside --out and renamed into place when complete: a failure or a kill leaves --out as it was
    with output_folder(args.out, "tokenizer", args.overwrite, beside=True) as out:
        tok = Tokenizer.train(
            corpus, kind=args.kind, vocab_size=args.vocab_size, lowercase=args.lowercase,
            min_frequency=args.min_frequency, show_progress=sys.stderr.isatty(),
        )
        with staged_folder(out, "tokenizer") as tmp:
            tok.save(tmp)
    record = {"out": str(out), "kind": tok.kind, "vocab_size": tok.vocab_size, "asked_vocab_size": args.vocab_size,
              "lowercase": tok.lowercase, "hash": tok.hash}
    show(args, record, [f"trained {tok.kind} tokenizer: final vocabulary size {tok.vocab_size} (asked for "
                        f"{args.vocab_size}), lowercase={tok.lowercase}, hash {tok.hash[:12]}", f"saved to {out}"])
    return 0


def run_encode(args) -> int:
    tok = Tokenizer.load(args.tokenizer)
    text = " ".join(args.text)
    ids, tokens, offsets = tok.encode_with_offsets(text)
    record = {"text": text, "ids": list(ids), "tokens": list(tokens), "offsets": [[a, b] for a, b in offsets]}
    lines = [f"{i:>7}  {t!r:<20} {a}:{b} {text[a:b]!r}" for i, t, (a, b) in zip(ids, tokens, offsets)]
    show(args, record, [*lines, f"{len(ids)} tokens"])
    return 0
