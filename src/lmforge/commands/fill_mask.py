"""``lmforge fill-mask MODEL_DIR "my dog is [MASK] ."``: the top-k fillers of each ``[MASK]`` (BERT; ELECTRA's
generator); the registry says which families fill masks."""

from __future__ import annotations

from ..errors import LmforgeError
from ..models import FAMILIES, get_family, load


def register(sub) -> None:
    p = sub.add_parser("fill-mask", help="predict the tokens behind [MASK] with a BERT or ELECTRA model")
    p.add_argument("model_dir", help="BERT or ELECTRA model folder (from `lmforge pretrain` or `lmforge import-hf`)")
    p.add_argument("text", help='text with one or more [MASK], e.g. "my dog is [MASK] ."')
    p.add_argument("--top-k", type=int, default=5, help="candidates to show per [MASK] (default 5)")
    p.set_defaults(func=run, reads=("model_dir",))


def run(args) -> int:

    model = load(args.model_dir)
    if not get_family(model.model_type).fills_mask:
        which = " or ".join(f.label for f in FAMILIES.values() if f.fills_mask)
        raise LmforgeError(f"{args.model_dir} holds a '{model.model_type}' model; fill-mask needs a {which} model")
    results = model.fill_mask(args.text, top_k=args.top_k)
    for i, candidates in enumerate(results, 1):
        if len(results) > 1:
            print(f"[MASK] #{i}")
        width = max(len(t) for t, _ in candidates)
        for token, prob in candidates:
            print(f"  {token:<{width}}  {prob:.4f}")
    return 0
