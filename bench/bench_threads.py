"""Training speed when the CPU is shared: torch's thread count and OpenMP's wait policy, quiet and busy.

A user's machine is seldom quiet: an editor, a browser, a second job.  torch runs its parallel
regions on OpenMP threads, one per core by default, and libgomp keeps idle threads spinning at each
barrier (``OMP_WAIT_POLICY`` unset or ``ACTIVE``).  When another process holds a core, the spinning
thread and the descheduled one wait on each other at every operator.  This bench measures one BERT
pretraining step of lmforge (``mini``-like shape: hidden 256, 4 layers, sequence 128, batch 16) in a
fresh process for each setting, since libgomp reads its environment once at start-up:

* threads: 1 and all cores;
* ``OMP_WAIT_POLICY``: unset (libgomp's spinning default) and ``PASSIVE`` (threads sleep at barriers);
* load: quiet, and with ``--busy`` processes spinning in pure Python beside it (default: 1);
* ``--quota CPUS``: also inside a cgroup allowed that many CPUs' worth of time (what ``docker --cpus``
  sets; root and a writable cgroup mount needed, ``bench/cgroup_quota.py``), at all cores (torch's
  default, which does not see the quota), at the quota's whole CPUs and at one more; the row the
  ``lmforge`` command would run (:mod:`lmforge.cpu_quota`) is marked.

Each cell is the median step time of ``--steps`` steps after ``--warmup``; the table gives tokens/s
and each setting's ratio to the unset-policy run at all cores on the same load.

``--contend`` measures lmforge's own thread choice (:mod:`lmforge.cpu_quota`) instead: with 0, 1 and 2
(``--burners``) bounded burner processes of its own beside it (each spins one core and stops by itself after
``--burn-seconds``), training (lmforge's Trainer on the same BERT shape, synthetic rows, fp32) in tokens/s
and ``lmforge encode`` (fp32, a tiny BERT saved once) in texts/s, each in a fresh process at 1 thread, at
every core and at lmforge's default (``OMP_NUM_THREADS`` unset: the count chosen at the start and re-checked
while training), and the ratio of the default to the best fixed count.  ``--mid SECONDS`` adds a run whose
machine gets busy part-way: each setting trains for SECONDS with one burner (started by the run itself) in the
middle third, and the default's thread changes are printed.  ``--check-cost`` times what the
re-check costs: a look at the counters, a step's poll between looks, and a change of torch's thread count.

    python bench/bench_threads.py                      # default: 12 steps, 1 busy process
    python bench/bench_threads.py --steps 20 --busy 2  # a machine fully taken by others
    python bench/bench_threads.py --record threads.json
    sudo python bench/bench_threads.py --quota 1 --busy 0   # under a 1-CPU quota as well
    python bench/bench_threads.py --contend --record contend.json   # lmforge's default beside 0, 1, 2 burners
    python bench/bench_threads.py --contend --burners 0 --mid 60    # a burner in the middle of a 60 s run
    python bench/bench_threads.py --check-cost                      # the re-check's cost

Settings only reach a child process: run it on an otherwise idle machine, alone.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, statistics, sys, time, torch
from lmforge.families.bert.model import BertConfig, BertForPreTraining
steps, warmup, B, T = map(int, sys.argv[1:5])
torch.manual_seed(0)
cfg = BertConfig(vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=1024, max_position_embeddings=T, next_sentence=False)
model = BertForPreTraining(cfg).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
g = torch.Generator().manual_seed(0)
ids = torch.randint(5, 8192, (B, T), generator=g)
labels = torch.full((B, T), -100)
pick = torch.rand(B, T, generator=g) < 0.15
labels[pick] = ids[pick]
times = []
for i in range(steps + warmup):
    t = time.perf_counter()
    loss = model(ids, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if i >= warmup:
        times.append(time.perf_counter() - t)
print(json.dumps({"step_s": statistics.median(times), "threads": torch.get_num_threads(), "tokens": B * T}))
"""


def spin(stop) -> None:  # a process that keeps one core busy, as another user's work would
    while not stop.is_set():
        sum(range(10_000))


def run_child(threads: int, policy: str | None, args, procs: Path | None = None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    src = str(Path(args.checkout).resolve() / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-c", CHILD, str(args.steps), str(args.warmup), str(args.batch), str(args.seq)]
    if procs is not None:  # join the cgroup, then become the child
        cmd = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *cmd]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise SystemExit(f"child failed: {out.stderr.strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def quota_rows(args, child_cgroup) -> list[dict]:
    """Inside a cgroup with the quota, alternating, twice each: torch's default (a thread per physical core),
    the quota's whole CPUs and one more; ``who`` marks torch's default and the count the ``lmforge`` command
    picks."""
    sys.path.insert(0, str(Path(args.checkout).resolve() / "src"))
    from lmforge.cpu_quota import quota_threads, torch_default_threads

    cores = torch_default_threads()
    whole = max(1, int(args.quota))
    settings = sorted({cores, whole, min(cores, whole + 1)}, reverse=True)
    chosen = quota_threads(args.quota, cores) or cores
    rows, times = [], {t: [] for t in settings}
    with child_cgroup(args.quota) as procs:
        for r in range(2):
            for threads in settings if r == 0 else settings[::-1]:
                times[threads].append(run_child(threads, None, args, procs))
    base = None
    for threads in settings:
        tok_s = max(x["tokens"] / x["step_s"] for x in times[threads])  # the better of two runs of each
        base = base or tok_s
        who = ", ".join(w for w, t in (("torch's default", cores), ("lmforge", chosen)) if t == threads)
        rows.append({"load": f"quota {args.quota:g} CPUs", "threads": threads, "OMP_WAIT_POLICY": "unset",
                     "tokens_per_s": round(tok_s), "vs_unset_all_cores": round(tok_s / base, 2), "who": who})
        print(f"quota {args.quota:g}  threads {threads:<3} {tok_s:9,.0f} tok/s  {tok_s / base:5.2f}x  {who}",
              flush=True)
    return rows

CONTEND_CHILD = r"""
import json, logging, subprocess, sys, tempfile, threading
from lmforge.cpu_quota import choose_threads
choose_threads()  # what the lmforge command does first; nothing when OMP_NUM_THREADS is set (the fixed counts)
import numpy as np, torch
from lmforge.families.bert.model import BertConfig, BertForPreTraining
from lmforge.train.config import TrainConfig
from lmforge.train.trainer import Trainer
steps, warmup, B, T = map(int, sys.argv[1:5])
max_time, burst_at, burst_for = map(float, sys.argv[5:8])  # a run of max_time s with a burner from burst_at s on
V = 8192
said = []

class Said(logging.Handler):  # what the run logs, to print its thread changes
    def emit(self, record):
        said.append(record.getMessage())

logging.getLogger("lmforge").addHandler(Said())
logging.getLogger("lmforge").setLevel(logging.INFO)
burner = []

def start_burner():
    code = f"import time\nend = time.monotonic() + {burst_for}\nwhile time.monotonic() < end: sum(range(10_000))"
    burner.append(subprocess.Popen([sys.executable, "-c", code]))

class Rows:  # synthetic MLM rows, each a function of its generator
    def batch(self, rngs, split):
        if burst_for and not burner and split == "train":
            burner.append(threading.Timer(burst_at, start_burner))  # counted from the first batch
            burner[0].start()
        ids = torch.tensor(np.stack([r.integers(5, V, T) for r in rngs]))
        pick = torch.tensor(np.stack([r.random(T) < 0.15 for r in rngs]))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.where(pick, ids, -100)}

torch.manual_seed(0)
cfg = BertConfig(vocab_size=V, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=1024, max_position_embeddings=T, next_sentence=False)
config = TrainConfig(max_steps=warmup + steps if not max_time else 10**6, max_time=max_time or None, batch_size=B,
                     log_every=1, eval_every=0, eval_batches=1, save_every=0, device="cpu", precision="fp32", seed=0,
                     lr=1e-4)
with tempfile.TemporaryDirectory() as d:
    trainer = Trainer(BertForPreTraining(cfg), Rows(), config, d, plot=False, progress=False)
    trainer.train()
if burner:
    burner[0].cancel()  # a run shorter than the burst: no burner
for b in burner[1:]:
    b.kill()
events = [e for e in trainer.history if e.get("split") == "train"]
a, b = events[warmup - 1] if len(events) > warmup else {"tokens": 0, "elapsed": 0.0}, events[-1]  # short runs: all
print(json.dumps({"tokens_per_s": (b["tokens"] - a["tokens"]) / (b["elapsed"] - a["elapsed"]),
                  "threads": torch.get_num_threads(), "said": [x for x in said if "thread" in x]}))
"""
ENCODE = "import sys; from lmforge.cli import main; sys.exit(main(sys.argv[1:]))"


def burn(seconds: float, stop) -> None:
    """Keep one core busy, as another user's job would, until ``stop`` is set or ``seconds`` have passed."""
    end = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < end:
        sum(range(10_000))


def child_env(threads: int | None, args) -> dict:
    """The environment of a measured child: ``threads`` fixed, or None for lmforge's own choice."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = str(Path(args.checkout).resolve() / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_json(cmd: list[str], env: dict) -> dict:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise SystemExit(f"child failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def encode_inputs(folder: Path, n_texts: int, checkout: str) -> tuple[Path, Path]:
    """A tiny BERT (random weights, a WordPiece vocabulary of Python's own documentation) saved in ``folder``,
    and ``n_texts`` sentences of that documentation to encode."""
    sys.path.insert(0, str(Path(checkout).resolve() / "src"))
    from pydoc_data.topics import topics

    import torch

    from lmforge.families.bert.model import BertConfig, BertForPreTraining
    from lmforge.tokenization import Tokenizer

    lines = [" ".join(x.split()) for t in topics.values() for x in t.split(". ") if len(x.split()) >= 6]
    texts = (lines * (n_texts // max(1, len(lines)) + 1))[:n_texts]
    tok = Tokenizer.train(iter(lines), vocab_size=4000)  # an iterable of texts (a list would name files)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, max_position_embeddings=128)
    BertForPreTraining(cfg).save_pretrained(folder / "bert", tok)
    (folder / "texts.txt").write_text("\n".join(texts) + "\n")
    return folder / "bert", folder / "texts.txt"


def contend_case(burners: int, settings: list, args, model: Path, texts: Path, mid: bool = False) -> list[dict]:
    """Training and encode at each setting beside ``burners`` burner processes; the default's ratio to the best.
    ``mid``: no burner at the start; training runs ``--mid`` seconds, with one burner in its middle third."""
    stop = mp.Event()
    procs = [mp.Process(target=burn, args=(args.burn_seconds, stop), daemon=True) for _ in range(burners)]
    for p in procs:
        p.start()
    case = "1 mid-run" if mid else str(burners)
    timing = [str(args.mid), str(args.mid / 3), str(args.mid / 3)] if mid else ["0", "0", "0"]
    try:
        time.sleep(0.5 if burners else 0.0)
        got: dict = {}
        for threads in settings:
            env = child_env(threads, args)
            train = run_json([sys.executable, "-c", CONTEND_CHILD, str(args.steps), str(args.warmup),
                              str(args.batch), str(args.seq), *timing], env)
            got[threads] = {"train_tokens_per_s": train["tokens_per_s"], "train_threads_at_end": train["threads"],
                            "said": train["said"]}
            if not mid:
                out = Path(args.tmp) / f"vectors-{burners}-{threads}.npy"
                enc = run_json([sys.executable, "-c", ENCODE, "encode", str(model), "--file", str(texts), "--out",
                                str(out), "--precision", "fp32", "--json"], env)
                got[threads]["encode_texts_per_s"] = enc["texts_per_s"]
    finally:
        stop.set()
        for p in procs:
            p.join()
    rows = []
    for what in ("train_tokens_per_s",) if mid else ("train_tokens_per_s", "encode_texts_per_s"):
        best = max(got[t][what] for t in settings if t is not None)
        for t in settings:
            row = {"burners": case if mid else burners, "measure": what,
                   "threads": "lmforge's default" if t is None else t, "value": round(got[t][what], 1),
                   "vs_best_fixed": round(got[t][what] / best, 2)}
            if t is None and what.startswith("train"):
                row["threads_at_end"], row["said"] = got[t]["train_threads_at_end"], got[t]["said"]
            rows.append(row)
            end = row.get("threads_at_end")
            print(f"{case} burner{'' if case.startswith('1') else 's'}  {what:<19} threads {row['threads']!s:<17} "
                  f"{row['value']:10,.1f}  {row['vs_best_fixed']:5.2f}x of the best fixed"
                  + (f"  (ended at {end} thread{'' if end == 1 else 's'})" if end else ""), flush=True)
            for line in row.get("said", []):
                print(f"    {line}")
    return rows


def contend(args) -> list[dict]:
    import tempfile

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # taskset
    settings = sorted({1, cores}) + [None]  # None: lmforge's default
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        args.tmp = tmp
        model, texts = encode_inputs(Path(tmp), args.texts, args.checkout)
        for burners in args.burners:
            rows += contend_case(burners, settings, args, model, texts)
        if args.mid:
            rows += contend_case(0, settings, args, model, texts, mid=True)
    worst = []
    for measure, name in (("train_tokens_per_s", "training"), ("encode_texts_per_s", "encode")):
        ratios = [r["vs_best_fixed"] for r in rows if r["measure"] == measure and r["threads"] == "lmforge's default"]
        if ratios:
            worst.append(f"{name} {min(ratios):.2f}x")
    print(f"lmforge's default, worst case: {', '.join(worst)} of the best fixed thread count (target >= 0.9)")
    return rows


def check_cost(args) -> list[dict]:
    """The re-check's cost in this process: a look at the counters, a poll between looks, a thread-count change."""
    sys.path.insert(0, str(Path(args.checkout).resolve() / "src"))
    import torch

    from lmforge.cpu_quota import AutoThreads

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    auto = AutoThreads(ceiling=max(2, cores), every=3600.0)
    n = 2000
    t = time.perf_counter()
    for _ in range(n):
        auto._look()
    look_us = (time.perf_counter() - t) / n * 1e6
    auto.settle()
    t = time.perf_counter()
    for _ in range(n * 50):
        auto.poll()
    poll_us = (time.perf_counter() - t) / (n * 50) * 1e6
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    n_ops = 200

    def per_op(counts: list[int]) -> float:  # each op at the next count of ``counts``, set before it
        torch.set_num_threads(counts[0])
        t = time.perf_counter()
        for i in range(n_ops):
            if len(counts) > 1:
                torch.set_num_threads(counts[i % len(counts)])
            torch.mm(a, b)
        return (time.perf_counter() - t) / n_ops * 1e6

    # a change's cost: ops alternating between 1 thread and every core, against the mean of the same ops at each
    # count held fixed (the better of three tries of each, alternating, so a busy moment hits all alike)
    one, every, switching = [], [], []
    for _ in range(3):
        one.append(per_op([1]))
        every.append(per_op([cores]))
        switching.append(per_op([1, cores]))
    fixed_us = (min(one) + min(every)) / 2
    switch_us = min(switching) - fixed_us
    print(f"a look at the counters: {look_us:.1f} us; a step's poll between looks: {poll_us:.2f} us; "
          f"a thread-count change (1 <-> {cores}) before a 256x256 matmul: {switch_us:+.1f} us "
          f"(the matmul alone: {min(one):.1f} us at 1 thread, {min(every):.1f} us at {cores})")
    return [{"look_us": round(look_us, 2), "poll_us": round(poll_us, 3), "switch_us": round(switch_us, 1),
             "matmul_us": {"1": round(min(one), 1), str(cores): round(min(every), 1)}}]


def write_record(args, rows: list[dict], cores: int) -> None:
    """The table as JSON with the machine (its CPU, flags and torch) beside it, when ``--record`` asks."""
    if not args.record:
        return
    sys.path.insert(0, str(Path(args.checkout).resolve() / "src"))
    from lmforge.provenance import machine

    mode = "contend" if args.contend else "check_cost" if args.check_cost else "threads"
    record = {"bench": "bench_threads", "mode": mode, "machine": machine(), "rows": rows, "cores": cores,
              "settings": {"steps": args.steps, "warmup": args.warmup, "batch": args.batch, "seq": args.seq,
                           "busy": args.busy, "quota": args.quota, "burners": args.burners,
                           "burn_seconds": args.burn_seconds, "texts": args.texts, "mid": args.mid,
                           "shape": "BERT hidden 256, 4 layers, 4 heads, vocab 8192"}}
    Path(args.record).write_text(json.dumps(record, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkout", default=str(Path(__file__).resolve().parent.parent),
                    help="the lmforge checkout whose src/ the children import")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--busy", type=int, default=1, help="spinning processes beside the busy runs (0: no busy runs)")
    ap.add_argument("--quota", type=float, default=None, metavar="CPUS",
                    help="also run inside a cgroup with this CPU quota (needs root)")
    ap.add_argument("--contend", action="store_true",
                    help="measure lmforge's default thread count against fixed ones beside burner processes")
    ap.add_argument("--burners", type=lambda x: [int(n) for n in x.split(",") if n], default=[0, 1, 2],
                    help="--contend: the burner counts, comma-separated (default 0,1,2)")
    ap.add_argument("--burn-seconds", type=float, default=300.0,
                    help="--contend: a burner stops by itself after this many seconds (default 300)")
    ap.add_argument("--mid", type=float, default=0.0, metavar="SECONDS",
                    help="--contend: also train SECONDS at each setting with one burner in the middle third")
    ap.add_argument("--texts", type=int, default=512, help="--contend: texts lmforge encode encodes (default 512)")
    ap.add_argument("--check-cost", action="store_true", help="time the re-check of the free CPUs and a thread change")
    ap.add_argument("--record", default=None, metavar="FILE", help="also write the table as JSON")
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    if args.contend or args.check_cost:
        rows = contend(args) if args.contend else check_cost(args)
        write_record(args, rows, cores)
        return 0
    settings = [(cores, None), (cores, "PASSIVE"), (1, None)]
    rows = []
    for load in ("quiet", "busy") if args.busy else ("quiet",):
        stop, procs = mp.Event(), []
        if load == "busy":
            procs = [mp.Process(target=spin, args=(stop,), daemon=True) for _ in range(args.busy)]
            for p in procs:
                p.start()
            time.sleep(1.0)
        try:
            base = None
            for threads, policy in settings:
                r = run_child(threads, policy, args)
                tok_s = r["tokens"] / r["step_s"]
                base = base or tok_s
                rows.append({"load": load if load == "quiet" else f"{args.busy} busy", "threads": threads,
                             "OMP_WAIT_POLICY": policy or "unset", "tokens_per_s": round(tok_s),
                             "vs_unset_all_cores": round(tok_s / base, 2)})
                print(f"{rows[-1]['load']:>7}  threads {threads}  OMP_WAIT_POLICY {policy or 'unset':<8}"
                      f"  {tok_s:9,.0f} tok/s  {tok_s / base:5.2f}x", flush=True)
        finally:
            stop.set()
            for p in procs:
                p.join()
    if args.quota is not None:
        from cgroup_quota import child_cgroup

        rows += quota_rows(args, child_cgroup)
    write_record(args, rows, cores)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
