"""``lmforge fill-mask MODEL_DIR "my dog is [MASK] ."``: the top-k fillers of each ``[MASK]`` with BERT."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("fill-mask", help="predict the tokens behind [MASK] with a BERT model")
    p.add_argument("model_dir", help="BERT model folder (from `lmforge pretrain bert` or `lmforge import-hf`)")
    p.add_argument("text", help='text with one or more [MASK], e.g. "my dog is [MASK] ."')
    p.add_argument("--top-k", type=int, default=5, help="candidates to show per [MASK] (default 5)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import LmforgeError
    from ..models import load

    model = load(args.model_dir)
    if model.model_type != "bert":
        raise LmforgeError(f"{args.model_dir} holds a '{model.model_type}' model; fill-mask needs a BERT")
    results = model.fill_mask(args.text, top_k=args.top_k)
    for i, candidates in enumerate(results, 1):
        if len(results) > 1:
            print(f"[MASK] #{i}")
        width = max(len(t) for t, _ in candidates)
        for token, prob in candidates:
            print(f"  {token:<{width}}  {prob:.4f}")
    return 0
