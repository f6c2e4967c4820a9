"""Benchmark ``lmforge prepare``: peak memory and throughput next to raw ``tokenizers`` batch encoding.

    python bench/bench_prepare.py [--sizes 50,500] [--kind wordpiece|bpe] [--workdir DIR]

For each size, generates that many MB of text (documents of the built-in corpus, shuffled and
repeated; BERT layout) in a temporary folder, then in separate subprocesses (so each one's peak RSS
is measured alone, with ``os.wait4``):

1. ``raw``: ``tokenizers.Tokenizer.encode_batch`` over the same sentences, read in the same chunk
   size; only the time inside ``encode_batch`` is counted (the most favourable baseline);
2. ``prepare``: ``lmforge prepare`` end to end (reading, layout, encoding, writing the shards).

Prints a table: MB, seconds, MB/s, ratio prepare/raw (target >= 0.8), peak RSS (target < 1 GB).
Never run by the tests.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RAW_SCRIPT = r"""
import sys, time
from tokenizers import Tokenizer
path, tok_json, chunk_chars = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = Tokenizer.from_file(tok_json)
busy = 0.0
n_tokens = 0
batch, chars = [], 0
def run(batch):
    global busy, n_tokens
    t = time.perf_counter()
    encs = tok.encode_batch(batch, add_special_tokens=False)
    busy += time.perf_counter() - t
    n_tokens += sum(len(e.ids) for e in encs)
with open(path, encoding="utf-8") as f:
    for line in f:
        s = line.strip()
        if not s:
            continue
        batch.append(s)
        chars += len(s)
        if chars >= chunk_chars:
            run(batch)
            batch, chars = [], 0
if batch:
    run(batch)
print(f"{busy} {n_tokens}")
"""


def generate(path: Path, megabytes: int, seed: int = 0) -> int:
    """Write ``megabytes`` MB of shuffled built-in-corpus documents to ``path``; return the byte count."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from lmforge.data import builtin_corpus_path

    with gzip.open(builtin_corpus_path(), "rt", encoding="utf-8") as f:
        docs = [d.encode("utf-8") + b"\n\n" for d in f.read().split("\n\n") if d.strip()]
    rng = random.Random(seed)
    target = megabytes * 1_000_000
    written = 0
    with open(path, "wb") as out:
        while written < target:
            rng.shuffle(docs)
            for d in docs:
                out.write(d)
                written += len(d)
                if written >= target:
                    break
    return written


def measured(cmd: list[str]) -> tuple[float, int, str]:
    """Run ``cmd`` under a wrapper that reports the child's own peak RSS (``os.wait4``).

    Returns:
        (wall seconds, peak RSS in bytes, the command's stdout).
    """
    wrapper = (
        "import os, subprocess, sys, time\n"
        "t = time.perf_counter()\n"
        "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE)\n"
        "out = p.stdout.read()\n"
        "_, status, ru = os.wait4(p.pid, 0)\n"
        "sys.stdout.write(out.decode())\n"
        "print(f'\\n@@ {time.perf_counter() - t} {ru.ru_maxrss * 1024} {status}')\n"
    )
    r = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True)
    if r.returncode != 0 or "@@" not in r.stdout:
        raise SystemExit(f"{cmd[:4]} failed:\n{r.stderr[-2000:]}")
    body, tail = r.stdout.rsplit("@@", 1)
    wall, rss, status = tail.split()
    if int(status) != 0:
        raise SystemExit(f"{cmd[:4]} exited with status {status}:\n{r.stderr[-2000:]}")
    return float(wall), int(rss), body


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="50", help="comma-separated sizes in MB (default 50; e.g. 50,500)")
    ap.add_argument("--kind", choices=["wordpiece", "bpe"], default="wordpiece")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--workdir", type=Path, default=None, help="where to put the generated text (default: a temp dir)")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from lmforge.data import builtin_corpus_path
    from lmforge.data.shards import CHUNK_CHARS
    from lmforge.tokenization import Tokenizer

    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmpdir:
        tmp = Path(tmpdir)
        tok_dir = Tokenizer.train([builtin_corpus_path()], kind=args.kind, vocab_size=args.vocab_size).save(tmp / "tok")
        print(f"lmforge prepare vs raw tokenizers encode_batch ({args.kind}, vocab {args.vocab_size}, "
              f"{os.cpu_count()} CPUs)")
        hdr = (f"{'MB':>5} {'tokens':>12} {'raw s':>8} {'raw MB/s':>9} {'prep s':>8} {'prep MB/s':>10} "
               f"{'ratio':>6} {'raw RSS':>9} {'prep RSS':>9}")
        print(hdr)
        print("-" * len(hdr), flush=True)
        for mb in [int(s) for s in args.sizes.split(",")]:
            text = tmp / f"text_{mb}mb.txt"
            nbytes = generate(text, mb)
            raw_wall, raw_rss, raw_out = measured(
                [sys.executable, "-c", RAW_SCRIPT, str(text), str(tok_dir / "tokenizer.json"), str(CHUNK_CHARS)])
            raw_busy, raw_tokens = raw_out.split()
            raw_busy, raw_tokens = float(raw_busy), int(raw_tokens)
            prep_wall, prep_rss, _ = measured(
                [sys.executable, "-m", "lmforge.cli", "-q", "prepare", "--tokenizer", str(tok_dir), "--out",
                 str(tmp / f"shards_{mb}"), "--workers", "2", str(text)])
            meta = json.loads((tmp / f"shards_{mb}" / "meta.json").read_text())
            n_tokens = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
            if args.kind == "wordpiece":
                assert n_tokens == raw_tokens, (n_tokens, raw_tokens)
            shutil.rmtree(tmp / f"shards_{mb}")
            text.unlink()
            raw_tp, prep_tp = nbytes / 1e6 / raw_busy, nbytes / 1e6 / prep_wall
            print(f"{mb:>5} {n_tokens:>12,} {raw_busy:>8.1f} {raw_tp:>9.2f} {prep_wall:>8.1f} {prep_tp:>10.2f} "
                  f"{prep_tp / raw_tp:>6.2f} {raw_rss / 2**20:>7.0f}MB {prep_rss / 2**20:>7.0f}MB", flush=True)
    print("raw s = time inside encode_batch only; prep s = whole `lmforge prepare` process (targets: ratio >= 0.8, "
          "prep RSS < 1 GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
