"""``lmforge neighbors MODEL WORD [--top-k 10] [--corpus FILE]``: the words nearest to a word by cosine."""

from __future__ import annotations

import argparse
import sys

from ..errors import LmforgeError
from ..families import load
from . import command_help
from ._common import add_device_arg, add_json_arg, add_text_file_args, on_device, show

EPILOG = """\
examples:
  lmforge neighbors models/w2v python --top-k 5
  lmforge neighbors models/bert python --corpus corpus.txt --layer -1
  lmforge neighbors models/bert python --corpus corpus.txt --backend onnx

word2vec: the cosine between the word's vector and every vocabulary token's (gensim's most_similar).
BERT, GPT, ELMo: every word of --corpus (one text per line) gets the mean of its vectors over its
occurrences there; the neighbours are the corpus words nearest to the word's mean (docs/vectors.md).
"""


def register(sub) -> None:
    p = sub.add_parser(
        "neighbors", help=command_help("neighbors"),
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Print the words whose vectors are nearest to WORD's by cosine similarity.",
    )
    p.add_argument("model_dir", metavar="MODEL", help="model folder (any family)")
    p.add_argument("word", metavar="WORD", help="the word to look up")
    p.add_argument("--top-k", type=int, default=10, metavar="K", help="how many neighbours (default 10)")
    p.add_argument("--corpus", metavar="FILE", help="texts whose words and contexts give BERT, GPT and ELMo their "
                   "word vectors (required for them; word2vec does not need it): one per line, or the records of "
                   "a JSON Lines, JSON, CSV/TSV or Parquet file or a `datasets` folder; blank ones are left out")
    add_text_file_args(p, "--corpus")
    p.add_argument("--layer", type=int, default=None, metavar="L",
                   help="layer of a contextual model: 0 = the token embedding, -1 = the top (default: the top)")
    p.add_argument("--min-count", type=int, default=1, metavar="N",
                   help="contextual models: only words seen at least N times in --corpus (default 1)")
    p.add_argument("--batch-size", type=int, default=32, metavar="N", help="corpus texts per forward pass")
    p.add_argument("--backend", choices=["torch", "onnx", "auto"], default="torch",
                   help="what runs a contextual model over --corpus: torch, ONNX Runtime (the onnx extra; the top "
                        "layer), or auto: the faster on this machine, measured once per model (default torch)")
    add_device_arg(p)
    add_json_arg(p)
    p.set_defaults(func=run, reads=("model_dir", "--corpus"))


def run(args) -> int:
    from ..models.neighbors import neighbors  # imports torch: only when run
    from ..models.vectors import read_texts  # imports torch too

    if args.batch_size < 1:
        raise LmforgeError(f"--batch-size must be >= 1, not {args.batch_size}")
    model = on_device(load(args.model_dir), args.device)
    if model.contextual and args.corpus is None:
        raise LmforgeError(f"{model.model_type} vectors depend on the sentence: give --corpus FILE (texts using "
                           f"'{args.word}'); each word's neighbours come from its mean vector over the corpus")
    bar = sys.stderr.isatty() and not args.quiet
    corpus = None
    if args.corpus is not None:
        corpus = read_texts(args.corpus, args.text_field, args.format, args.split, skip_blank=True)
    found = neighbors(model, args.word, args.top_k, corpus, layer=args.layer, min_count=args.min_count,
                      batch_size=args.batch_size, progress=bar, backend=args.backend)
    record = {"model": str(args.model_dir), "model_type": model.model_type, "word": args.word,
              "backend": args.backend, "neighbors": [{"word": w, "cosine": score} for w, score in found]}
    width = max(len(w) for w, _ in found) if found else 0
    show(args, record, [f"{w:<{width}}  {score:.4f}" for w, score in found])
    return 0
