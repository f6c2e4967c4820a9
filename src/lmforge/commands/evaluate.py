"""``lmforge evaluate wic MODEL_DIR... [--max-pairs N] [--reference minilm]``: the WordNet word-in-context table."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="evaluate word representations (wic: WordNet word-in-context)")
    tasks = p.add_subparsers(dest="task", metavar="TASK", required=True)
    w = tasks.add_parser(
        "wic",
        help="same sense or not? cosine-threshold accuracy per model and layer on WordNet example pairs",
        description=(
            "Builds balanced same-sense / different-sense sentence pairs from WordNet's examples, picks a "
            "cosine threshold per model and layer on the dev split and reports test accuracy (chance 50%%)."
        ),
    )
    w.add_argument("model_dirs", nargs="*", metavar="MODEL_DIR", help="lmforge model folders")
    w.add_argument("--max-pairs", type=int, default=2000, help="pairs to build (default 2000; 0 = all)")
    w.add_argument("--reference", choices=["minilm"], help="add the real all-MiniLM-L6-v2 as a reference row")
    w.set_defaults(func=run_wic)


def run_wic(args) -> int:
    from ..errors import LmforgeError
    from ..evaluate import load_models
    from ..evaluate.wic import format_wic, wic_table

    if args.max_pairs < 0:
        raise LmforgeError(f"--max-pairs must be >= 0, got {args.max_pairs}")
    models = load_models(args.model_dirs, args.reference)
    rows, info = wic_table(models, max_pairs=args.max_pairs or None)
    print(format_wic(rows, info))
    return 0
