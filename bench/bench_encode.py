"""Text vectors from a BERT folder: ``lmforge`` ``encode`` against the loop a ``transformers`` user writes.

Both sides read the same weights (the folder, and its ``export_hf`` copy) and the same real texts, and
mean-pool the top layer over each text's own tokens, 32 texts a batch:

* ``lmforge``: ``model.encode(texts)``, which batches texts shortest first;
* ``lmforge, input order``: ``model.encode`` called on 32 texts at a time in the order given, so every
  batch pads to its longest text;
* ``transformers``: ``AutoTokenizer`` + ``AutoModel`` on the export, batches in the order given, padded
  to the longest text of each batch (``padding=True``), mean over the tokens that are not special;
* with ``--bf16``, ``lmforge, bf16``: ``encode`` under bf16 autocast (``lmforge encode --precision bf16``);
  its vectors are compared by cosine with fp32's, not timed against them blind.

Texts longer than the model's positions are left out (``transformers`` would cut them, lmforge reads
them in windows), so both sides do the same work; the vectors must agree before anything is timed.
The three runs take turns, ``--rounds`` times; each figure is the median round.

    lmforge demo      # writes lmforge-demo/models/bert (English) and .../bert-peoples-daily (Chinese)
    python bench/bench_encode.py --model lmforge-demo/models/bert-peoples-daily --texts zh-sentiment   # reviews
    python bench/bench_encode.py --model lmforge-demo/models/bert --texts en-tweets
    python bench/bench_encode.py --model MODEL --texts my_texts.txt       # one text per line
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import malloc_setting  # noqa: E402
import numpy as np  # noqa: E402
import thread_setting  # noqa: E402
import torch  # noqa: E402


def read_texts(source: str) -> list[str]:
    """A benchmark's in-domain text (``lmforge.transfer.benchmarks.domain_text``) or a file, one text a line."""
    from lmforge.transfer.benchmarks import BENCHMARKS, domain_text

    if source in BENCHMARKS:
        return domain_text(source)
    return [line for line in Path(source).read_text(encoding="utf-8").splitlines() if line.strip()]


def hf_vectors(tok, model, texts: list[str], batch: int) -> np.ndarray:
    """Mean of the top layer over each text's non-special tokens, batches in the order given."""
    out = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch):
            enc = tok(texts[start : start + batch], padding=True, truncation=True, return_tensors="pt",
                      return_special_tokens_mask=True)
            special = enc.pop("special_tokens_mask").bool()
            keep = (enc["attention_mask"].bool() & ~special).unsqueeze(-1)
            top = model(**enc).last_hidden_state
            out.append(((top * keep).sum(1) / keep.sum(1)).numpy())
    return np.concatenate(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a BERT model folder (lmforge pretrain bert --out ...)")
    ap.add_argument("--texts", default="zh-sentiment",
                    help="a benchmark's in-domain text (zh-sentiment, en-tweets, zh-ner) or a file, one text a line")
    ap.add_argument("--n", type=int, default=2000, help="texts drawn at random (seed 0)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bf16", action="store_true", help="also time encode under bf16 autocast")
    thread_setting.add_flag(ap)
    ap.add_argument("--record", default=None, metavar="FILE", help="write the figures as a JSON run record")
    malloc_setting.add_flag(ap)
    args = ap.parse_args(argv)
    malloc = malloc_setting.apply(args.malloc)

    import transformers

    import lmforge
    from lmforge.interop import export_hf
    from lmforge.provenance import describe_machine, provenance

    args.threads, threads_line = thread_setting.apply(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    lines = read_texts(args.texts)
    random.Random(0).shuffle(lines)
    ours = lmforge.load(args.model)
    window = ours.embed_window()
    lengths = {t: len(ours.tokenizer.encode_with_offsets(t)[0]) for t in lines[: args.n]}
    texts = [t for t in lines[: args.n] if lengths[t] <= window]
    n_tok = [lengths[t] for t in texts]
    print(f"{describe_machine()}; transformers {transformers.__version__}; "
          f"load average {os.getloadavg()[0]:.2f}; allocator: {malloc}; threads: {threads_line}")
    print(f"{len(texts)} texts ({args.n - len(texts)} longer than {window} tokens left out); tokens per text: "
          f"mean {statistics.mean(n_tok):.1f}, median {statistics.median(n_tok):.0f}, max {max(n_tok)}")

    with tempfile.TemporaryDirectory() as tmp:
        export_hf(args.model, Path(tmp) / "hf")
        tok = transformers.AutoTokenizer.from_pretrained(Path(tmp) / "hf")
        hf = transformers.AutoModel.from_pretrained(Path(tmp) / "hf", attn_implementation="sdpa").eval()

    def input_order(texts):
        return np.concatenate([ours.encode(texts[s : s + args.batch], batch_size=args.batch)
                               for s in range(0, len(texts), args.batch)])

    runs = {
        "lmforge": lambda: ours.encode(texts, batch_size=args.batch),
        "lmforge, input order": lambda: input_order(texts),
        "transformers": lambda: hf_vectors(tok, hf, texts, args.batch),
    }
    check = {name: run() for name, run in runs.items()}
    gap = max(float(np.abs(v - check["transformers"]).max()) for v in check.values())
    cosine = None
    if args.bf16:
        def bf16():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return ours.encode(texts, batch_size=args.batch)

        a, b = check["lmforge"], bf16()
        cosine = float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
        print(f"bf16 against fp32 vectors: smallest cosine {cosine:.5f}")
        runs["lmforge, bf16"] = bf16
    print(f"largest difference between the three sets of vectors: {gap:.1e}")
    if gap > 1e-3:
        print("the vectors disagree; the comparison would be meaningless", file=sys.stderr)
        return 1
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.rounds):
        names = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for name in names:
            t0 = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - t0)
    tps = {name: len(texts) / statistics.median(v) for name, v in times.items()}
    for name in runs:
        print(f"  {name:<22} {tps[name]:8.0f} texts/s  ({statistics.median(times[name]):.2f} s)")
    thread_setting.check(args.threads)  # both sides ran on the same count throughout
    ratio = tps["lmforge"] / tps["transformers"]
    print(f"  ratio lmforge / transformers: {ratio:.2f}; lmforge sorted / input order: "
          f"{tps['lmforge'] / tps['lmforge, input order']:.2f}"
          + (f"; bf16 / fp32: {tps['lmforge, bf16'] / tps['lmforge']:.2f}" if args.bf16 else ""))
    if args.record:
        record = {"bench": "encode", "settings": {**vars(args), "allocator": malloc}, "texts": len(texts),
                  "tokens_per_text": {"mean": statistics.mean(n_tok), "max": max(n_tok)},
                  "texts_per_s": tps, "ratio": ratio, "max_vector_diff": gap, "bf16_min_cosine": cosine,
                  "provenance": provenance()}
        Path(args.record).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
