"""Benchmark ``lmforge prepare``: throughput and peak memory next to raw ``tokenizers`` batch encoding on one core.

    python bench/bench_prepare.py [--sizes 50,200] [--workers 1,2] [--kind wordpiece|bpe] [--workdir DIR]

For each size, generates that many MB of text (documents of the built-in corpus, shuffled and
repeated; BERT layout) in a temporary folder, then runs, each in its own subprocess, on the same text:

1. ``raw``: ``tokenizers.Tokenizer.encode_batch`` on one core (``RAYON_RS_NUM_CPUS=1``) over the same
   sentences, one call per chunk of the size ``prepare`` uses; only the time inside ``encode_batch``
   counts (reading the text is left out: the most favourable baseline); then the same on each
   ``--workers`` setting's number of cores (tokenizers' own threads), which shows what the machine
   gives in parallel under the same conditions;
2. ``prepare --workers N`` for each N of ``--workers``: what ``lmforge prepare`` runs, in a fresh
   process end to end (imports, reading, sentence splitting, encoding in N worker processes, writing
   the shards); the CLI's own start-up (argument parsing) is timed apart and printed once.

Prints, per size and setting: seconds, CPU seconds, MB/s, the speed relative to raw on one core (target: >= 1.0
with one worker), the scaling over one worker as a share of linear (target: >= 0.8 at the machine's
cores), peak RSS of the largest process (``os.wait4``) and the sampled peak of all its processes
together (the parent and its workers; psutil), and the load average before each run: the figures
are only comparable on an otherwise quiet machine. Never run by the tests.
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
import threading
import time
from pathlib import Path

RAW_SCRIPT = r"""
import sys, time
from tokenizers import Tokenizer
path, tok_json, chunk_chars = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = Tokenizer.from_file(tok_json)
busy = cpu = 0.0
n_tokens = 0
batch, chars = [], 0
def run(batch):
    global busy, cpu, n_tokens
    t, c = time.perf_counter(), time.process_time()
    encs = tok.encode_batch(batch, add_special_tokens=False)
    busy += time.perf_counter() - t
    cpu += time.process_time() - c
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
print(f"{busy} {cpu} {n_tokens}")
"""


# what `lmforge prepare FILE --tokenizer DIR --out OUT --workers N` runs, without the CLI's argument parsing (whose
# start-up is timed on its own: it imports every command's modules)
PREPARE_SCRIPT = r"""
import sys
from lmforge.data.shards import prepare
prepare([sys.argv[1]], sys.argv[2], sys.argv[3], workers=int(sys.argv[4]))
"""


def cli_startup() -> float:
    """Seconds `lmforge prepare --help` takes: the CLI's start-up, on top of every prepare row."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lmforge.cli", "prepare", "--help"], capture_output=True, check=True)
    return time.perf_counter() - t


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


def _descendants_rss(pid: int) -> int:
    """RSS of every descendant of process ``pid`` together (0 when there are none)."""
    import psutil

    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.Error:
            pass
    return total


WRAPPER = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE)\n"
    "out = p.stdout.read()\n"
    "_, status, ru = os.wait4(p.pid, 0)\n"
    "sys.stdout.write(out.decode())\n"
    "print(f'\\n@@ {ru.ru_maxrss * 1024} {ru.ru_utime + ru.ru_stime} {status}')\n"
)


def measured(cmd: list[str], env: dict | None = None) -> tuple[float, float, int, int, str]:
    """Run ``cmd`` under a wrapper that reports its peak RSS (``os.wait4``), sampling its processes' RSS meanwhile.

    Returns:
        (wall seconds, CPU seconds of all its processes (``os.wait4``: a process's own and its waited-for
        children's), peak RSS of the largest of them, sampled peak RSS of all of them together (0 without
        psutil), the command's stdout).
    """
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", WRAPPER, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        try:
            import psutil  # noqa: F401  (optional: only the sampled peak of all processes needs it)
        except ImportError:
            return
        while not done.is_set():
            peak[0] = max(peak[0], _descendants_rss(p.pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = p.communicate()
    wall = time.perf_counter() - t
    done.set()
    sampler.join()
    text = out.decode()
    if p.returncode != 0 or "@@" not in text:
        raise SystemExit(f"{cmd[:4]} failed:\n{err.decode()[-2000:]}")
    body, tail = text.rsplit("@@", 1)
    rss, cpu, status = tail.split()
    if int(status) != 0:
        raise SystemExit(f"{cmd[:4]} exited with status {status}:\n{err.decode()[-2000:]}")
    return wall, float(cpu), int(rss), peak[0], body


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="50,200", help="comma-separated sizes in MB (default 50,200)")
    ap.add_argument("--workers", default=None, help="comma-separated --workers settings (default 1 and the cores)")
    ap.add_argument("--kind", choices=["wordpiece", "bpe"], default="wordpiece")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--workdir", type=Path, default=None, help="where to put the generated text (default: a temp dir)")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from lmforge.data import builtin_corpus_path
    from lmforge.data.chunks import default_workers
    from lmforge.data.shards import CHUNK_CHARS
    from lmforge.tokenization import Tokenizer

    cores = default_workers()
    settings = [int(w) for w in args.workers.split(",")] if args.workers else sorted({1, cores})
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmpdir:
        tmp = Path(tmpdir)
        tok_dir = Tokenizer.train([builtin_corpus_path()], kind=args.kind, vocab_size=args.vocab_size).save(tmp / "tok")
        print(f"lmforge prepare vs raw tokenizers encode_batch on one core ({args.kind}, vocab {args.vocab_size}, "
              f"{cores} cores, --workers {', '.join(map(str, settings))}); the CLI's start-up adds "
              f"{cli_startup():.1f} s to each prepare")
        hdr = (f"{'MB':>5} {'run':<12} {'tokens':>12} {'s':>7} {'cpu s':>6} {'MB/s':>6} {'vs raw':>7} {'of linear':>9} "
               f"{'RSS max':>8} {'RSS all':>8} {'load':>5}")
        print(hdr)
        print("-" * len(hdr), flush=True)
        for mb in [int(s) for s in args.sizes.split(",")]:
            text = tmp / f"text_{mb}mb.txt"
            nbytes = generate(text, mb)
            load = os.getloadavg()[0]
            env = {**os.environ, "RAYON_RS_NUM_CPUS": "1"}
            _, _, raw_rss, raw_all, raw_out = measured(
                [sys.executable, "-c", RAW_SCRIPT, str(text), str(tok_dir / "tokenizer.json"), str(CHUNK_CHARS)], env)
            raw_busy, raw_cpu, raw_tokens = raw_out.split()
            raw_busy, raw_cpu, raw_tokens = float(raw_busy), float(raw_cpu), int(raw_tokens)
            raw_tp = nbytes / 1e6 / raw_busy
            print(f"{mb:>5} {'raw, 1 core':<12} {raw_tokens:>12,} {raw_busy:>7.1f} {raw_cpu:>6.1f} {raw_tp:>6.2f} "
                  f"{1.0:>7.2f} {'':>9} {raw_rss / 2**20:>6.0f}MB {raw_all / 2**20:>6.0f}MB {load:>5.1f}", flush=True)
            for n in [n for n in settings if n > 1]:  # what the cores give tokenizers itself, in the same conditions
                load = os.getloadavg()[0]
                _, _, rss, rss_all, out = measured(
                    [sys.executable, "-c", RAW_SCRIPT, str(text), str(tok_dir / "tokenizer.json"), str(CHUNK_CHARS)],
                    {**os.environ, "RAYON_RS_NUM_CPUS": str(n)})
                busy, cpu, _ = out.split()
                busy, cpu = float(busy), float(cpu)
                print(f"{mb:>5} {f'raw, {n} cores':<12} {raw_tokens:>12,} {busy:>7.1f} {cpu:>6.1f} "
                      f"{nbytes / 1e6 / busy:>6.2f} {raw_busy / busy:>7.2f} {raw_busy / busy / n:>9.2f} "
                      f"{rss / 2**20:>6.0f}MB {rss_all / 2**20:>6.0f}MB {load:>5.1f}", flush=True)
            one = None
            for n in settings:
                out = tmp / f"shards_{mb}_{n}"
                load = os.getloadavg()[0]
                wall, cpu, rss, rss_all, _ = measured([sys.executable, "-c", PREPARE_SCRIPT, str(text), str(tok_dir),
                                                  str(out), str(n)])
                meta = json.loads((out / "meta.json").read_text())
                n_tokens = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
                if args.kind == "wordpiece":
                    assert n_tokens == raw_tokens, (n_tokens, raw_tokens)
                shutil.rmtree(out)
                one = wall if n == 1 else one
                linear = f"{one / wall / n:>9.2f}" if one is not None and n > 1 else f"{'':>9}"
                tp = nbytes / 1e6 / wall
                print(f"{mb:>5} {f'prepare -w {n}':<12} {n_tokens:>12,} {wall:>7.1f} {cpu:>6.1f} {tp:>6.2f} "
                      f"{tp / raw_tp:>7.2f} {linear} {rss / 2**20:>6.0f}MB {rss_all / 2**20:>6.0f}MB {load:>5.1f}",
                      flush=True)
            text.unlink()
    print("raw s = time inside encode_batch only, one core; prepare s = the whole process; cpu s = CPU time (raw: "
          "inside encode_batch; prepare: all its processes); vs raw = speed over raw "
          "(target >= 1.0 with -w 1); of linear = speed over -w 1, divided by the workers (target >= 0.8); "
          "RSS max = the largest process, RSS all = the process and its workers together (sampled); load = the "
          "1-minute load average before the run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
