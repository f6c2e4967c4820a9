"""``lmforge fill-mask MODEL_DIR "my dog is [MASK] ."``: the top-k fillers of each ``[MASK]`` (BERT; ELECTRA's
generator); the registry says which families fill masks."""

from __future__ import annotations

from ..errors import LmforgeError
from ..families import FAMILIES, get_family, load
from . import command_help
from ._common import add_device_arg, add_json_arg, on_device, show


def register(sub) -> None:
    p = sub.add_parser("fill-mask", help=command_help("fill-mask"))
    p.add_argument("model_dir", help="BERT or ELECTRA model folder (from `lmforge pretrain` or `lmforge import-hf`)")
    p.add_argument("text", help='text with one or more [MASK], e.g. "my dog is [MASK] ."')
    p.add_argument("--top-k", type=int, default=5, help="candidates to show per [MASK] (default 5)")
    add_device_arg(p)
    add_json_arg(p)
    p.set_defaults(func=run, reads=("model_dir",))


def run(args) -> int:

    model = on_device(load(args.model_dir), args.device)
    if not get_family(model.model_type).fills_mask:
        which = " or ".join(f.label for f in FAMILIES.values() if f.fills_mask)
        raise LmforgeError(f"{args.model_dir} holds a '{model.model_type}' model; fill-mask needs a {which} model")
    results = model.fill_mask(args.text, top_k=args.top_k)
    record = {"model": str(args.model_dir), "text": args.text,
              "masks": [[{"token": t, "prob": p} for t, p in candidates] for candidates in results]}
    show(args, record, lambda: _lines(results))
    return 0


def _lines(results: list[list[tuple[str, float]]]) -> list[str]:
    """Each [MASK]'s candidates, most likely first, with their probabilities."""
    lines = []
    for i, candidates in enumerate(results, 1):
        if len(results) > 1:
            lines.append(f"[MASK] #{i}")
        width = max(len(t) for t, _ in candidates)
        lines += [f"  {token:<{width}}  {prob:.4f}" for token, prob in candidates]
    return lines
