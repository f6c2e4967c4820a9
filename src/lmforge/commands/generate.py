"""``lmforge generate MODEL_DIR --prompt "..."``: continue a prompt with a GPT, streaming the text (``--json``: the
prompt, the new text and its token count as one JSON record once it is done)."""

from __future__ import annotations

import sys
import time

from ..errors import LmforgeError
from ..families import FAMILIES, get_family, load
from ..generation import check_generation_args, generate_text
from ..train.precision import autocast, for_inference, resolve_compute
from . import command_help
from ._common import add_device_arg, add_inference_precision_arg, add_json_arg, fmt, show

#: the most tokens one `lmforge generate` adds (more is capped, with a message)
MAX_NEW_TOKENS = 4096


def register(sub) -> None:
    p = sub.add_parser("generate", help=command_help("generate"))
    p.add_argument("model_dir", help="GPT model folder (from `lmforge pretrain gpt` or `lmforge import-hf`)")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument(
        "--max-new-tokens", type=int, default=100, help=f"tokens to add at most (default 100, at most {MAX_NEW_TOKENS})"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--top-k", type=int, default=None, help="sample only from the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="sample only from the nucleus of this probability")
    p.add_argument(
        "--stop",
        action="append",
        default=None,
        metavar="STR",
        help="stop when the generated text contains STR (repeatable; STR is not printed)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed for sampling (same seed, same text)")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole context every step (slow)")
    add_device_arg(p)
    add_inference_precision_arg(p)
    add_json_arg(p)
    p.set_defaults(func=run, reads=("model_dir",))


def run(args) -> int:
    check_generation_args(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed)
    max_new = args.max_new_tokens
    if max_new > MAX_NEW_TOKENS:
        print(f"lmforge generate: --max-new-tokens {max_new} is capped at {MAX_NEW_TOKENS} (a longer text takes "
              f"many minutes on a CPU); generate again from the end for more", file=sys.stderr)
        max_new = MAX_NEW_TOKENS
    model = load(args.model_dir)
    if not get_family(model.model_type).generates:
        makers = ", ".join(f.label for f in FAMILIES.values() if f.generates)
        raise LmforgeError(f"{args.model_dir} holds a '{model.model_type}' model; generate needs a {makers}")
    if model.tokenizer is None:
        raise LmforgeError(f"{args.model_dir} has no tokenizer files; generate needs tokenizer.json beside the model")
    compute = resolve_compute(args.device, args.precision)  # once: where and in which precision the model runs
    device = compute.device
    precision = for_inference(compute, model.to(device)).precision
    stream = None if args.json else sys.stdout  # --json: one record at the end, nothing streamed
    if stream is not None:
        stream.write(args.prompt)
        stream.flush()

    def on_text(piece: str) -> None:
        if stream is not None:
            stream.write(piece)
            stream.flush()

    tokens = []
    start = time.perf_counter()
    with autocast(device, precision):
        text = generate_text(
            model,
            args.prompt,
            max_new_tokens=max_new,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            stop=args.stop,
            seed=args.seed,
            use_cache=not args.no_cache,
            on_text=on_text,
            on_token=tokens.append,
        )
    seconds = time.perf_counter() - start
    if stream is not None:
        stream.write("\n")
        stream.flush()
    record = {"model": str(args.model_dir), "prompt": args.prompt, "text": text, "new_tokens": len(tokens),
              "seconds": seconds, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
              "seed": args.seed, "precision": precision}
    if args.json:
        show(args, record, [])
    elif not args.quiet:  # the text is the output; how long it took goes beside it, on stderr
        print(f"({len(tokens)} new tokens in {fmt(seconds)} s)", file=sys.stderr)
    return 0
