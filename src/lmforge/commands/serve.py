"""``lmforge serve MODEL_OR_RUN_DIR... [--host 127.0.0.1] [--port 8000] [--api-key KEY]``: an HTTP API (lmforge's
own and OpenAI-compatible routes) and a web playground."""

from __future__ import annotations

import argparse

from ..errors import LmforgeError
from . import command_help
from ._common import add_device_arg, add_inference_precision_arg

EPILOG = """\
endpoints (JSON; errors are one line with a 4xx/5xx status; OpenAPI docs at /docs):
  GET  /                      the playground page (polysemy, fill-mask, generation, predictions, curves)
  GET  /health                (never needs the API key)
  POST /v1/fill-mask          {"model", "text", "top_k"}
  POST /v1/generate           {"model", "prompt", "max_new_tokens", "temperature", "top_k", "top_p",
                               "stop", "seed", "stream"}   (stream: server-sent events)
  POST /v1/embed              {"model", "texts", "word"}
  POST /v1/projection         {"model", "texts", "word", "layer"}
  POST /v1/predict            {"model", "text", "text_pair", "choices"}
  GET  /v1/curves/NAME        training events of NAME's metrics.jsonl
OpenAI-compatible (for the openai client, LangChain, LlamaIndex ...; base URL http://HOST:PORT/v1):
  POST /v1/completions        {"model", "prompt", "max_tokens", "temperature", "top_p", "stop", "seed", "n",
                               "stream"}   (GPT models)
  POST /v1/embeddings         {"model", "input", "encoding_format"}   (any model; unit-length mean vectors;
                               concurrent requests share forward passes)
  GET  /v1/models             the loaded folders, in OpenAI's list shape

examples:
  lmforge serve models/w2v models/elmo models/gpt models/bert runs/ft --port 8000
  curl -s localhost:8000/v1/fill-mask -d '{"model": "bert", "text": "the python is a large [MASK] ."}'
  curl -s localhost:8000/v1/completions -d '{"model": "gpt", "prompt": "The python", "max_tokens": 20}'
  curl -s localhost:8000/v1/embeddings -d '{"model": "bert", "input": ["a large snake", "a language"]}'
  lmforge serve runs/ft models/minilm --backend onnx   # predictions and sentence embeddings on ONNX Runtime
  LMFORGE_API_KEY=change-me lmforge serve models/bert --host 0.0.0.0 --allowed-host lab.example.org
"""


def register(sub) -> None:
    p = sub.add_parser(
        "serve",
        help=command_help("serve"),
        description="Load model folders (any family), runs from `lmforge finetune`, and folders being pretrained, "
        "and serve them over HTTP on 127.0.0.1 unless --host says otherwise. Each folder is named after its "
        "directory; a folder replaced on disk is reopened by the next request. Needs the serve extra: "
        "pip install 'lmforge[serve]'.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="MODEL_OR_RUN_DIR", help="model folders, runs, or training folders")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    add_device_arg(p, help="where every folder computes: cpu, cuda, cuda:N or auto (default: auto = cuda when torch "
                           "sees a GPU, else cpu)")
    add_inference_precision_arg(
        p, default=None,
        help="what every folder computes in: fp32, bf16, fp16 (CUDA only) or auto (bf16 where the device computes it "
             "natively and the model is wide enough to gain). Default: a model folder in fp32, a run in the "
             "precision it was fine-tuned in. /v1/models lists each folder's")
    p.add_argument("--backend", choices=["torch", "onnx", "auto"], default="torch",
                   help="what runs /v1/predict of the fine-tuned runs (frozen and finetune runs) and /v1/embeddings "
                        "where a sentence pipeline reads the texts (a request's own backend wins): torch, ONNX "
                        "Runtime (the onnx extra), or auto: the faster on this machine, measured once per model "
                        "(default torch)")
    p.add_argument("--quantize", choices=["none", "int8"], default="none",
                   help="int8: ONNX Runtime's dynamic int8 for the same (with --backend onnx or auto), faster but "
                        "approximate (default none: exact fp32)")
    access = p.add_argument_group("access")
    access.add_argument(
        "--api-key",
        metavar="KEY",
        default=None,
        help="every route but /health needs 'Authorization: Bearer KEY' (default: $LMFORGE_API_KEY, which other "
        "users cannot read from the process list)",
    )
    access.add_argument(
        "--insecure", action="store_true", help="allow binding an address other than loopback without an API key"
    )
    access.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests whose Host header is NAME (repeatable; '*' = any, e.g. behind a proxy that "
        "checks it); by default only the bound address and, on loopback, localhost",
    )
    access.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages of ORIGIN (e.g. https://app.example.org) call the server: CORS headers for it "
        "(repeatable); pages of other origins are refused",
    )
    limits = p.add_argument_group("limits")
    limits.add_argument("--max-body-bytes", type=int, default=64 * 1024, metavar="N", help="largest request body")
    limits.add_argument("--max-text-chars", type=int, default=2000, metavar="N", help="longest text in a request")
    limits.add_argument(
        "--max-texts", type=int, default=32, metavar="N", help="most texts in one embed request / completions in one"
    )
    limits.add_argument("--max-new-tokens", type=int, default=256, metavar="N", help="cap on max_new_tokens")
    limits.add_argument(
        "--max-generations", type=int, default=2, metavar="N", help="generations at once; more get 429 (default 2)"
    )
    limits.add_argument(
        "--max-batch", type=int, default=16, metavar="N", help="texts per batched forward pass (1 = no batching)"
    )
    limits.add_argument(
        "--batch-wait-ms", type=float, default=2.0, metavar="MS", help="how long a request waits to share a batch"
    )
    p.set_defaults(func=run, reads=("paths",))


def run(args) -> int:
    import logging

    if not 0 < args.port < 65536:
        raise LmforgeError(f"--port must be in 1..65535, got {args.port}")
    key = _api_key(args.api_key)
    origins = tuple(_origin(o, key) for o in args.allow_origin)
    hosts = tuple(_host_name(h) for h in args.allowed_host)
    from ..serve.guard import is_loopback

    loopback = is_loopback(args.host)
    if not loopback and key is None and not args.insecure:
        raise LmforgeError(
            f"binding {args.host} lets other machines reach the server: give --api-key KEY (or set LMFORGE_API_KEY), "
            f"or --insecure to serve without authentication"
        )
    _check_port_free(args.host, args.port)
    from ..serve import ServeLimits, access_for, create_app, serve

    limits = ServeLimits(
        max_body_bytes=args.max_body_bytes,
        max_text_chars=args.max_text_chars,
        max_texts=args.max_texts,
        max_new_tokens=args.max_new_tokens,
        max_generations=args.max_generations,
        max_batch=args.max_batch,
        batch_wait_ms=args.batch_wait_ms,
    )
    if args.backend == "torch" and args.quantize != "none":
        raise LmforgeError("int8 runs on ONNX Runtime: use --backend onnx (or auto) with --quantize int8")
    app = create_app(args.paths, limits, access_for(args.host, key, hosts, origins), device=args.device,
                     precision=args.precision, backend=args.backend, quantize=args.quantize)
    if not loopback and key is None:
        logging.getLogger("lmforge").warning(
            "binding %s without an API key (--insecure): anyone who can reach this address can use it", args.host
        )
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"lmforge serve: {len(app.state.server.entries)} folder(s) at http://{host}:{args.port}/ "
        f"(OpenAI base URL http://{host}:{args.port}/v1{', API key required' if key else ''}; Ctrl-C stops)",
        flush=True,
    )
    serve(app, args.host, args.port)
    print("lmforge serve: stopped", flush=True)
    return 0


def _api_key(flag: str | None) -> str | None:
    """The key from --api-key, else $LMFORGE_API_KEY (unset or empty: no key)."""
    import os

    if flag is None:
        return os.environ.get("LMFORGE_API_KEY", "").strip() or None
    if not flag.strip():
        raise LmforgeError("--api-key is empty; give a key (e.g. a random one: python -c 'import secrets; "
                           "print(secrets.token_hex(16))')")
    return flag.strip()


def _origin(value: str, key: str | None) -> str:
    from urllib.parse import urlsplit

    if value == "*":
        if key is None:
            raise LmforgeError("--allow-origin '*' lets every web page use the server; it needs --api-key as well")
        return value
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/") or parts.query:
        raise LmforgeError(f"--allow-origin {value!r} is not an origin; write it as https://app.example.org[:port]")
    return f"{parts.scheme}://{parts.netloc}".lower()


def _host_name(value: str) -> str:
    """The host name of ``--allowed-host``: a name or address, with or without a port, or a URL's host."""
    from urllib.parse import urlsplit

    from ..serve.guard import host_name

    given = value.strip()
    if "://" in given:  # a URL pasted from a browser: its host, not the scheme ("http")
        try:
            given = urlsplit(given).hostname or ""
        except ValueError:
            given = ""
    name = host_name(given)  # a port is ignored: the Host check compares names
    if not name or any(c in name for c in "/ @?#") or name in ("http", "https"):
        raise LmforgeError(f"--allowed-host {value!r} is not a host name; give a name such as lab.example.org")
    return name


def _check_port_free(host: str, port: int) -> None:
    """A one-line error before any model is loaded when the address cannot be bound."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise LmforgeError(
                f"cannot listen on {host}:{port} ({e.strerror}); pick another --port or --host"
            ) from None
