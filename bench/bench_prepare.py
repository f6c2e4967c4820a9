"""Benchmark ``lmforge prepare``: speed, CPU time and peak memory next to raw ``tokenizers`` batch encoding on one core.

    python bench/bench_prepare.py [--sizes 50] [--settings raw,1,2] [--rounds 3] [--memory-sizes 200,500]
                                  [--kind wordpiece|bpe] [--compare-src DIR] [--workdir DIR] [--record FILE]

For each size of ``--sizes``, generates that many MB of text (documents of the built-in corpus, shuffled
and repeated; BERT layout) and runs each setting of ``--settings`` on the same text, each run in its own
process, the settings taking turns over ``--rounds`` rounds (each round starts one setting later), so
that load from other jobs falls on all of them alike:

- ``raw``: ``tokenizers.Tokenizer.encode_batch`` on one core (``RAYON_RS_NUM_CPUS=1``) over the same
  sentences, one call per chunk of the size ``prepare`` uses; only the time and CPU time inside
  ``encode_batch`` count (reading the text is left out: the most favourable baseline);
- ``raw:N``: the same on N cores (tokenizers' own threads): what the machine gives in parallel;
- ``N``: what ``lmforge prepare --workers N`` runs, end to end in a fresh process (imports, reading,
  sentence splitting, encoding in N worker processes, writing the shards); the CLI's own start-up
  (argument parsing) is timed apart and printed once. With ``--compare-src DIR``, each ``N`` also runs
  with the lmforge package of another checkout (``DIR/src``), labelled ``N@DIR``.

Per size and setting it prints the median over the rounds of: seconds, CPU seconds (user + sys of the
whole process tree), MB/s, CPU seconds per MB, the speed relative to raw (target: >= 1.0 with one
worker), the CPU relative to raw (raw's CPU / the setting's: >= 1.0 means no more CPU than raw
encoding), the scaling over one worker as a share of linear (target: >= 0.8 at the machine's cores),
the CPU of one worker over that of N (1.0: the workers add no CPU, so on idle cores the scaling
would be linear), the peak RSS of the largest process (``os.wait4``) and the sampled peak of all its
processes together (psutil), and the load average before the runs. Wall-clock ratios need an
otherwise quiet machine; the CPU figures hold under load.

``--memory-sizes`` then runs ``prepare`` once per size with the cores as workers and prints its peak
RSS (memory must not grow with the corpus). ``--record FILE`` writes the figures as a results record
(``scripts/make_results.py`` renders docs/results/ from them). Never run by the tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

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

WRAPPER = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE)\n"
    "out = p.stdout.read()\n"
    "_, status, ru = os.wait4(p.pid, 0)\n"
    "sys.stdout.write(out.decode())\n"
    "print(f'\\n@@ {ru.ru_maxrss * 1024} {ru.ru_utime + ru.ru_stime} {status}')\n"
)


@dataclasses.dataclass
class Run:
    """One run of one setting."""

    wall: float  # raw: seconds inside encode_batch; prepare: the whole process
    cpu: float  # raw: CPU seconds inside encode_batch; prepare: user + sys of the process and its workers
    rss: int  # peak RSS of the largest process (os.wait4)
    rss_all: int  # sampled peak RSS of all its processes together (0 without psutil)
    load: float  # 1-minute load average before the run
    tokens: int


def cli_startup() -> float:
    """Seconds `lmforge prepare --help` takes: the CLI's start-up, on top of every prepare row."""
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lmforge.cli", "prepare", "--help"], capture_output=True)
    return time.perf_counter() - t if done.returncode == 0 else float("nan")  # the CLI broken: not this bench's say


def generate(path: Path, megabytes: int, seed: int = 0) -> int:
    """Write ``megabytes`` MB of shuffled built-in-corpus documents to ``path``; return the byte count."""
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


def run_setting(setting: str, text: Path, tok_dir: Path, out: Path, compare_src: Path | None) -> Run:
    """Run one setting (``raw``, ``raw:N``, ``N`` or ``N@src``) on ``text``."""
    from lmforge.data.shards import CHUNK_CHARS

    load = os.getloadavg()[0]
    if setting.startswith("raw"):
        threads = setting.partition(":")[2] or "1"
        _, _, rss, rss_all, body = measured(
            [sys.executable, "-c", RAW_SCRIPT, str(text), str(tok_dir / "tokenizer.json"), str(CHUNK_CHARS)],
            {**os.environ, "RAYON_RS_NUM_CPUS": threads})
        busy, cpu, tokens = body.split()
        return Run(float(busy), float(cpu), rss, rss_all, load, int(tokens))
    workers, _, src = setting.partition("@")
    env = dict(os.environ)
    if src:  # the other checkout's package comes first on the path
        env["PYTHONPATH"] = os.pathsep.join([str(compare_src / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    wall, cpu, rss, rss_all, _ = measured(
        [sys.executable, "-c", PREPARE_SCRIPT, str(text), str(tok_dir), str(out), workers], env)
    meta = json.loads((out / "meta.json").read_text())
    shutil.rmtree(out)
    return Run(wall, cpu, rss, rss_all, load, sum(meta["splits"][s]["tokens"] for s in ("train", "val")))


def label(setting: str) -> str:
    if setting.startswith("raw"):
        n = setting.partition(":")[2] or "1"
        return f"raw, {n} core{'s' if n != '1' else ''}"
    workers, _, src = setting.partition("@")
    return f"prepare -w {workers}" + (f" @{src}" if src else "")


def summarize(runs: dict[str, list[Run]], nbytes: int) -> dict[str, dict]:
    """Medians per setting and the ratios against raw on one core and against one worker of the same code."""
    mb = nbytes / 1e6
    out: dict[str, dict] = {}
    for setting, rs in runs.items():
        wall, cpu = statistics.median(r.wall for r in rs), statistics.median(r.cpu for r in rs)
        out[setting] = {"s": wall, "cpu_s": cpu, "mb_per_s": mb / wall, "cpu_s_per_mb": cpu / mb,
                        "rss_max_mb": max(r.rss for r in rs) / 2**20, "rss_all_mb": max(r.rss_all for r in rs) / 2**20,
                        "load": statistics.median(r.load for r in rs), "rounds": len(rs),
                        "walls": [r.wall for r in rs], "cpus": [r.cpu for r in rs]}
    raw = out.get("raw")
    for setting, row in out.items():
        if raw is not None:
            row["vs_raw"] = raw["s"] / row["s"]
            row["cpu_vs_raw"] = raw["cpu_s"] / row["cpu_s"]
        workers, _, src = setting.partition("@")
        one = out.get("1" + (f"@{src}" if src else ""))
        if workers.isdigit() and int(workers) > 1 and one is not None:
            row["of_linear"] = one["s"] / row["s"] / int(workers)
            row["cpu_of_one"] = one["cpu_s"] / row["cpu_s"]
    return out


HEADER = (f"{'MB':>5} {'run':<22} {'s':>7} {'cpu s':>7} {'MB/s':>6} {'cpu s/MB':>8} {'vs raw':>6} {'cpu vs raw':>10} "
          f"{'of linear':>9} {'cpu of -w 1':>11} {'RSS max':>8} {'RSS all':>8} {'load':>5}")


def row_line(mb: int, setting: str, row: dict) -> str:
    def opt(key: str, width: int) -> str:
        return f"{row[key]:>{width}.2f}" if key in row else " " * width

    return (f"{mb:>5} {label(setting):<22} {row['s']:>7.1f} {row['cpu_s']:>7.1f} {row['mb_per_s']:>6.2f} "
            f"{row['cpu_s_per_mb']:>8.3f} {opt('vs_raw', 6)} {opt('cpu_vs_raw', 10)} {opt('of_linear', 9)} "
            f"{opt('cpu_of_one', 11)} {row['rss_max_mb']:>6.0f}MB {row['rss_all_mb']:>6.0f}MB {row['load']:>5.1f}")


def bench_size(mb: int, settings: list[str], rounds: int, tmp: Path, tok_dir: Path, kind: str,
               compare_src: Path | None) -> dict[str, dict]:
    """All settings on one generated text, alternating over the rounds; the summary per setting."""
    text = tmp / f"text_{mb}mb.txt"
    nbytes = generate(text, mb)
    runs: dict[str, list[Run]] = {s: [] for s in settings}
    try:
        for r in range(rounds):
            order = settings[r % len(settings):] + settings[:r % len(settings)]
            for setting in order:
                run = run_setting(setting, text, tok_dir, tmp / "shards", compare_src)
                runs[setting].append(run)
                print(f"  round {r + 1}: {label(setting):<22} {run.wall:7.1f} s {run.cpu:7.1f} cpu s "
                      f"(load {run.load:.1f})", flush=True)
    finally:
        text.unlink()
    tokens = {r.tokens for s in settings if kind == "wordpiece" or not s.startswith("raw") for r in runs[s]}
    if len(tokens) > 1:  # BPE: raw has no end-of-text tokens; prepare runs must agree among themselves
        raise SystemExit(f"the settings disagree on the token count at {mb} MB: {sorted(tokens)}")
    return summarize(runs, nbytes)


def memory_size(mb: int, workers: int, tmp: Path, tok_dir: Path) -> dict:
    text = tmp / f"text_{mb}mb.txt"
    generate(text, mb)
    try:
        run = run_setting(str(workers), text, tok_dir, tmp / "shards", None)
    finally:
        text.unlink()
    return {"MB": mb, "workers": workers, "s": run.wall, "cpu_s_per_mb": run.cpu / mb,
            "rss_max_mb": run.rss / 2**20, "rss_all_mb": run.rss_all / 2**20, "load": run.load}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="50", help="comma-separated sizes in MB for the speed runs (default 50)")
    ap.add_argument("--settings", default=None,
                    help="comma-separated: raw, raw:N, N (prepare --workers N); default raw,1,<cores>")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over the settings (default 3); medians are shown")
    ap.add_argument("--memory-sizes", default="", help="comma-separated sizes in MB: one prepare run each, peak RSS")
    ap.add_argument("--compare-src", type=Path, default=None,
                    help="another checkout: each prepare setting also runs with its package (DIR/src)")
    ap.add_argument("--kind", choices=["wordpiece", "bpe"], default="wordpiece")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--workdir", type=Path, default=None, help="where to put the generated text (default: a temp dir)")
    ap.add_argument("--record", type=Path, default=None, metavar="FILE", help="write the figures as a results record")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT / "src"))
    from lmforge.data import builtin_corpus_path
    from lmforge.data.chunks import default_workers
    from lmforge.tokenization import Tokenizer

    cores = default_workers()
    settings = args.settings.split(",") if args.settings else ["raw", "1", str(cores)]
    if args.compare_src is not None:
        settings += [f"{s}@{args.compare_src.name}" for s in settings if s.isdigit()]
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    results: dict = {"speed": {}, "memory": []}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmpdir:
        tmp = Path(tmpdir)
        tok_dir = Tokenizer.train([builtin_corpus_path()], kind=args.kind, vocab_size=args.vocab_size).save(tmp / "tok")
        startup = cli_startup()
        print(f"lmforge prepare vs raw tokenizers encode_batch on one core ({args.kind}, vocab {args.vocab_size}, "
              f"{cores} cores, {args.rounds} rounds, load average {os.getloadavg()[0]:.1f}); the CLI's start-up "
              f"adds {startup:.1f} s to each prepare", flush=True)
        for mb in [int(s) for s in args.sizes.split(",") if s]:
            results["speed"][mb] = bench_size(mb, settings, args.rounds, tmp, tok_dir, args.kind, args.compare_src)
            print(HEADER)
            print("-" * len(HEADER))
            for setting, row in results["speed"][mb].items():
                print(row_line(mb, setting, row), flush=True)
        for mb in [int(s) for s in args.memory_sizes.split(",") if s]:
            m = memory_size(mb, cores, tmp, tok_dir)
            results["memory"].append(m)
            print(f"memory: {mb:>5} MB, prepare -w {cores}: {m['s']:.0f} s, RSS max {m['rss_max_mb']:.0f} MB, "
                  f"RSS all {m['rss_all_mb']:.0f} MB (load {m['load']:.1f})", flush=True)
    print("medians over the rounds. raw s = time inside encode_batch only; cpu s = CPU time (raw: inside "
          "encode_batch; prepare: all its processes); vs raw = speed over raw (target >= 1.0 with -w 1); cpu vs raw = "
          "raw's CPU over the run's; of linear = speed over -w 1, divided by the workers (target >= 0.8); cpu of -w 1 "
          "= -w 1's CPU over the run's; RSS max = the largest process, RSS all = the process and its workers together "
          "(sampled); load = the 1-minute load average before the runs")
    if args.record is not None:
        write_record(args, results, cores, startup)
    return 0


def write_record(args, results: dict, cores: int, startup: float) -> None:
    """A results record (docs/results/records/): the summary table, the settings and every run's figures."""
    from lmforge.provenance import git_commit, provenance
    from lmforge.storage.files import atomic_write_text

    prov = provenance()
    names = {"avx512f": "AVX-512", "avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX"}  # as the other records name them
    flags = [names[f] for f in prov["machine"]["cpu_flags"] if f in names]
    compared = ""
    if args.compare_src is not None:
        compared = (f" Rows marked @{args.compare_src.name} ran the package of another checkout, commit "
                    f"{git_commit(args.compare_src) or 'unknown'}, in the same rounds.")
    rows = []
    for mb, summary in results["speed"].items():
        for setting, r in summary.items():
            rows.append([str(mb), label(setting), f"{r['s']:.1f}", f"{r['cpu_s_per_mb']:.3f}",
                         f"{r['vs_raw']:.2f}x" if "vs_raw" in r else "–",
                         f"{r['cpu_vs_raw']:.2f}x" if "cpu_vs_raw" in r else "–",
                         f"{r['of_linear']:.2f}" if "of_linear" in r else "–",
                         f"{r['cpu_of_one']:.2f}" if "cpu_of_one" in r else "–",
                         f"{r['rss_all_mb']:.0f} MB", f"{r['load']:.1f}"])
    for m in results["memory"]:
        rows.append([str(m["MB"]), f"prepare -w {m['workers']} (memory)", f"{m['s']:.0f}", f"{m['cpu_s_per_mb']:.3f}",
                     "–", "–", "–", "–", f"{m['rss_all_mb']:.0f} MB", f"{m['load']:.1f}"])
    first = next(iter(results["speed"].items()), None)
    figure = ""
    if first is not None:
        mb, s = first
        one, many = s.get("1", {}), s.get(str(cores), {})
        figure = (f"-w 1: {one.get('vs_raw', 0):.2f}x raw speed, {one.get('cpu_vs_raw', 0):.2f}x raw CPU; "
                  f"-w {cores}: {many.get('of_linear', 0):.2f} of linear at {mb} MB")
    record = {
        "id": "prepare-cpu-xeon",
        "title": "prepare against raw tokenizers encode_batch on one core",
        "headline": {"what": "prepare speed vs raw tokenizers encode_batch (WordPiece)", "figure": figure},
        "readme": False,
        "reproduce": "../data.md",
        "command": "python bench/bench_prepare.py " + " ".join(sys.argv[1:]),
        "commit": prov["commit"], "date": prov["date"],
        "machine": {"cpu": f"{prov['machine']['cpu']} ({', '.join([f'{cores} cores', *flags])})", "threads": None},
        "notes": (f"Medians of {args.rounds} alternating rounds; CPU s/MB is user + sys of the whole process tree "
                  "(raw: inside encode_batch only); load is the 1-minute load average before the runs on a machine "
                  f"shared with other jobs. The CLI's start-up adds {startup:.1f} s to each prepare and is not in the "
                  "figures." + compared),
        "table": {"columns": ["MB", "run", "s", "CPU s/MB", "vs raw", "CPU vs raw", "of linear", "CPU of -w 1",
                              "RSS all", "load"], "rows": rows},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "results": results,
    }
    atomic_write_text(args.record, json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.record}")


if __name__ == "__main__":
    sys.exit(main())
