"""Benchmark the micro-batching of ``lmforge serve``: embed throughput with batching on and off, in one run.

    python bench/bench_serve.py [--requests 192] [--clients 16] [--max-batch 16] [--hidden 128] [--layers 4]

Builds a randomly initialised BERT (``--hidden``, ``--layers``) with a WordPiece tokenizer trained on a
slice of the built-in corpus, then serves it twice in this process (FastAPI app, httpx over ASGI, no
socket): once with ``max_batch=1`` (every request its own forward pass) and once with ``--max-batch``.
``--clients`` concurrent clients send ``--requests`` ``/v1/embed`` requests in all (two sentences and
the word of each: the polysemy query of the playground), alternating the two settings over three
rounds so that machine noise hits both alike.  Every batched answer is checked against the unbatched
one first.  Prints requests/s of each setting, forward passes per request, and the ratio batched /
unbatched.  Never run by the tests.
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
    from lmforge.models.bert import BertConfig, BertForPreTraining
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


async def run_round(app, queries, clients: int) -> tuple[float, list]:
    import httpx

    transport = httpx.ASGITransport(app=app)
    answers: list = [None] * len(queries)
    todo = iter(range(len(queries)))
    async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=600) as c:

        async def client():
            for i in todo:
                s, w = queries[i]
                other = f"Here the word {w} stands alone."
                r = await c.post("/v1/embed", json={"model": "bert", "texts": [s, other], "word": w})
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
    args = ap.parse_args()

    from lmforge.serve import ServeLimits, create_app
    from lmforge.serve.registry import open_entries

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build_model(folder, args.hidden, args.layers)
        entries = open_entries([folder / "bert"])
        queries = sentences_with_words(args.requests)
        apps = {
            "unbatched": create_app(entries, ServeLimits(max_batch=1, batch_wait_ms=0)),
            "batched": create_app(entries, ServeLimits(max_batch=args.max_batch, batch_wait_ms=2)),
        }
        # warm-up, and the batched answers must equal the unbatched ones
        _, want = asyncio.run(run_round(apps["unbatched"], queries[:32], args.clients))
        _, got = asyncio.run(run_round(apps["batched"], queries[:32], args.clients))
        worst = max(abs(a - b) for x, y in zip(want, got) for a, b in zip(x, y))
        assert worst < 1e-4, f"batched answers differ from unbatched ones by {worst}"
        times: dict[str, list[float]] = {k: [] for k in apps}
        for _ in range(args.rounds):
            for name, app in apps.items():
                took, _ = asyncio.run(run_round(app, queries, args.clients))
                times[name].append(took)
        print(
            f"BERT hidden {args.hidden} x {args.layers} layers; {len(queries)} /v1/embed requests (2 texts + word) "
            f"from {args.clients} concurrent clients; median of {args.rounds} rounds; max |diff| {worst:.1e}"
        )
        print(f"{'setting':<10} {'req/s':>8} {'forward passes/request':>24}")
        rate = {}
        for name, app in apps.items():
            b = app.state.server.batchers[("bert", "embed")]
            rate[name] = len(queries) / statistics.median(times[name])
            print(f"{name:<10} {rate[name]:8.1f} {b.calls / max(1, b.items / 2):24.2f}")
        print(f"ratio batched / unbatched: {rate['batched'] / rate['unbatched']:.2f}x")


if __name__ == "__main__":
    main()
