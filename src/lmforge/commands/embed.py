"""``lmforge embed MODEL_DIR... SENTENCE... --word WORD``: one word's similarity across sentences, per layer."""

from __future__ import annotations

from pathlib import Path

from ..errors import LmforgeError
from ..evaluate import load_models
from ..evaluate.polysemy import format_polysemy, polysemy_table
from . import command_help
from ._common import add_device_arg, add_json_arg, show


def register(sub) -> None:
    p = sub.add_parser(
        "embed",
        help=command_help("embed"),
        description=(
            "Embed the sentences with every model and print, for each layer, the cosine similarity of "
            "--word between the sentences. Arguments that are model folders are models; the rest are "
            'sentences. Example: lmforge embed models/elmo models/w2v "He got bit by Python." '
            '"Python is my favorite programming language." --word python'
        ),
    )
    p.add_argument("items", nargs="+", metavar="MODEL_DIR_OR_SENTENCE", help="model folders, then sentences")
    p.add_argument("--word", required=True, help="the word to compare (whole word, case-insensitive; found inside "
                   "unsegmented Chinese/Japanese text too, e.g. --word 苹果)")
    p.add_argument("--reference", choices=["minilm"], help="add the real all-MiniLM-L6-v2 as a reference row")
    add_device_arg(p)
    add_json_arg(p)
    p.set_defaults(func=run, reads=("items",))


def _is_model_dir(item: str) -> bool:
    return Path(item).is_dir() and (Path(item) / "config.json").is_file()


def run(args) -> int:

    if not args.word.strip():
        raise LmforgeError('--word is empty; give the word to compare, e.g. --word python')
    model_dirs = [i for i in args.items if _is_model_dir(i)]
    sentences = [i for i in args.items if not _is_model_dir(i)]
    if len(sentences) < 2:
        raise LmforgeError(f"give at least two sentences after the model folders (got {len(sentences)})")
    models = load_models(model_dirs, args.reference, device=args.device)
    rows = polysemy_table(models, sentences, args.word)
    record = {"word": args.word, "sentences": sentences, "rows": [
        {"model": r.model, "layer": r.layer, "mean": r.mean,
         "cosines": [{"a": i + 1, "b": j + 1, "cosine": c} for (i, j), c in sorted(r.pairs.items())]}
        for r in rows]}
    lines = [f"[{k}] {s}" for k, s in enumerate(sentences, 1)]
    show(args, record, [*lines, format_polysemy(rows, args.word, len(sentences))])
    return 0
