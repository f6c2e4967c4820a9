"""``lmforge serve MODEL_OR_RUN_DIR... [--host 127.0.0.1] [--port 8000]``: an HTTP API and a web playground."""

from __future__ import annotations

import argparse

EPILOG = """\
endpoints (JSON; errors are {"error": "..."} with a 4xx status; OpenAPI docs at /docs):
  GET  /                      the playground page (polysemy, fill-mask, generation, predictions, curves)
  GET  /health, /v1/models
  POST /v1/fill-mask          {"model", "text", "top_k"}
  POST /v1/generate           {"model", "prompt", "max_new_tokens", "temperature", "top_k", "top_p",
                               "stop", "seed", "stream"}   (stream: server-sent events)
  POST /v1/embed              {"model", "texts", "word"}
  POST /v1/projection         {"model", "texts", "word", "layer"}
  POST /v1/predict            {"model", "text", "text_pair", "choices"}
  GET  /v1/curves/NAME        training events of NAME's metrics.jsonl

example:
  lmforge serve models/w2v models/elmo models/gpt models/bert runs/ft --port 8000
  curl -s localhost:8000/v1/fill-mask -d '{"model": "bert", "text": "the python is a large [MASK] ."}'
"""


def register(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve model folders and fine-tuned runs over HTTP, with a web playground at /",
        description="Load model folders (any family), runs from `lmforge finetune`, and folders being pretrained, "
        "and serve them over HTTP on 127.0.0.1 unless --host says otherwise. Each folder is named after its "
        "directory. Needs the serve extra: pip install 'lmforge[serve]'.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="MODEL_OR_RUN_DIR", help="model folders, runs, or training folders")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--max-body-bytes", type=int, default=64 * 1024, metavar="N", help="largest request body")
    p.add_argument("--max-text-chars", type=int, default=2000, metavar="N", help="longest text in a request")
    p.add_argument("--max-texts", type=int, default=32, metavar="N", help="most texts in one embed request")
    p.add_argument("--max-new-tokens", type=int, default=256, metavar="N", help="cap on max_new_tokens")
    p.add_argument(
        "--max-generations", type=int, default=2, metavar="N", help="generations at once; more get 429 (default 2)"
    )
    p.add_argument(
        "--max-batch", type=int, default=16, metavar="N", help="texts per batched forward pass (1 = no batching)"
    )
    p.add_argument(
        "--batch-wait-ms", type=float, default=2.0, metavar="MS", help="how long a request waits to share a batch"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    import ipaddress
    import logging

    from ..errors import LmforgeError

    if not 0 < args.port < 65536:
        raise LmforgeError(f"--port must be in 1..65535, got {args.port}")
    _check_port_free(args.host, args.port)
    from ..serve import ServeLimits, create_app

    limits = ServeLimits(
        max_body_bytes=args.max_body_bytes,
        max_text_chars=args.max_text_chars,
        max_texts=args.max_texts,
        max_new_tokens=args.max_new_tokens,
        max_generations=args.max_generations,
        max_batch=args.max_batch,
        batch_wait_ms=args.batch_wait_ms,
    )
    app = create_app(args.paths, limits)
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback:
        logging.getLogger("lmforge").warning(
            "binding %s: the server has no authentication; anyone who can reach this address can use it", args.host
        )
    import uvicorn

    host = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"lmforge serve: {len(app.state.server.entries)} folder(s) at http://{host}:{args.port}/ (Ctrl-C stops)",
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


def _check_port_free(host: str, port: int) -> None:
    """A one-line error before any model is loaded when the address cannot be bound."""
    import socket

    from ..errors import LmforgeError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise LmforgeError(
                f"cannot listen on {host}:{port} ({e.strerror}); pick another --port or --host"
            ) from None
