"""Benchmark the micro-batching of ``lmforge serve``: embed throughput with batching on and off, in one run.

    python bench/bench_serve.py [--requests 192] [--clients 16] [--max-batch 16] [--hidden 128] [--layers 4]
                                [--model DIR] [--bf16]

Builds a randomly initialised BERT (``--hidden``, ``--layers``) with a WordPiece tokenizer trained on a
slice of the built-in corpus, then serves it twice in this process (FastAPI app, httpx over ASGI, no
socket): once with ``max_batch=1`` (every request its own forward pass) and once with ``--max-batch``.
``--clients`` concurrent clients send ``--requests`` ``/v1/embed`` requests in all (two sentences and
the word of each: the polysemy query of the playground), alternating the two settings over three
rounds so that machine noise hits both alike.  Every batched answer is checked against the unbatched
one first.  Prints requests/s of each setting, forward passes per request, and the ratio batched /
unbatched.  ``--model DIR`` serves a trained model folder instead; ``--bf16`` adds the batched setting served
with ``--precision bf16`` (its cosines must stay within 0.02 of fp32's) and its ratio to fp32.  Never run by
the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import re
import statistics
import tempfile
import time
from pathlib import Path


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


async def run_round(app, queries, clients: int, model: str) -> tuple[float, list]:
    import httpx

    transport = httpx.ASGITransport(app=app)
    answers: list = [None] * len(queries)
    todo = iter(range(len(queries)))
    async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=600) as c:

        async def client():
            for i in todo:
                s, w = queries[i]
                other = f"Here the word {w} stands alone."
                r = await c.post("/v1/embed", json={"model": model, "texts": [s, other], "word": w})
                r.raise_for_status()
                answers[i] = [row["pairs"][0]["cosine"] for row in r.json()["rows"]]

        t0 = time.perf_counter()
        await asyncio.gather(*[client() for _ in range(clients)])
        return time.perf_counter() - t0, answers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=192)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", type=Path, default=None, help="a model folder to serve (default: a random BERT)")
    ap.add_argument("--bf16", action="store_true", help="also serve batched in bf16 (serve --precision bf16)")
    args = ap.parse_args()

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
        apps = {
            "unbatched": create_app(entries, ServeLimits(max_batch=1, batch_wait_ms=0)),
            "batched": create_app(entries, ServeLimits(max_batch=args.max_batch, batch_wait_ms=2)),
        }
        if args.bf16:
            apps["batched bf16"] = create_app(open_entries([folder], precision="bf16"),
                                              ServeLimits(max_batch=args.max_batch, batch_wait_ms=2))
        # warm-up, and the batched answers must equal the unbatched ones (bf16's be close to them)
        _, want = asyncio.run(run_round(apps["unbatched"], queries[:32], args.clients, name))
        worst = {}
        for setting in [k for k in apps if k != "unbatched"]:
            _, got = asyncio.run(run_round(apps[setting], queries[:32], args.clients, name))
            worst[setting] = max(abs(a - b) for x, y in zip(want, got) for a, b in zip(x, y))
        assert worst["batched"] < 1e-4, f"batched answers differ from unbatched ones by {worst['batched']}"
        assert worst.get("batched bf16", 0) < 0.02, f"bf16 cosines differ from fp32's by {worst['batched bf16']}"
        times: dict[str, list[float]] = {k: [] for k in apps}
        for _ in range(args.rounds):
            for setting, app in apps.items():
                took, _ = asyncio.run(run_round(app, queries, args.clients, name))
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


if __name__ == "__main__":
    main()
