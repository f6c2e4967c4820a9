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

    python bench/bench_threads.py                      # default: 12 steps, 1 busy process
    python bench/bench_threads.py --steps 20 --busy 2  # a machine fully taken by others
    python bench/bench_threads.py --record threads.json
    sudo python bench/bench_threads.py --quota 1 --busy 0   # under a 1-CPU quota as well

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
from lmforge.models.bert import BertConfig, BertForPreTraining
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
    ap.add_argument("--record", default=None, metavar="FILE", help="also write the table as JSON")
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
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
    if args.record:
        sys.path.insert(0, str(Path(args.checkout).resolve() / "src"))
        from lmforge.provenance import machine  # the CPU, its flags and torch, beside the figures

        record = {"bench": "bench_threads", "machine": machine(), "rows": rows, "cores": cores,
                  "settings": {"steps": args.steps, "warmup": args.warmup, "batch": args.batch, "seq": args.seq,
                               "busy": args.busy, "quota": args.quota,
                               "shape": "BERT hidden 256, 4 layers, 4 heads, vocab 8192"}}
        Path(args.record).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
