"""``lmforge demo``: build the demo lineage on the built-in corpus, reusing what a previous run built."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser(
        "demo", help="run the whole lineage on the built-in corpus (tokenizers, shards, models)",
        description="Train tokenizers and prepare token shards from lmforge's built-in English corpus (Python "
                    "docs, WordNet, King James Bible), then the model steps. A second run reuses what exists.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  lmforge demo --out lmforge-demo",
    )
    p.add_argument("--out", default="lmforge-demo", metavar="DIR", help="demo folder (default: lmforge-demo/)")
    p.add_argument("--force", action="store_true", help="rebuild every step even if a previous run built it")
    p.set_defaults(func=run)


def run(args) -> int:
    import contextlib
    import sys
    import time

    from tqdm import tqdm

    from ..demo import run_demo

    @contextlib.contextmanager
    def progress(total, desc):
        with tqdm(total=total, desc=f"  {desc}", unit="B", unit_scale=True, file=sys.stderr, leave=False,
                  disable=True if args.quiet else None, dynamic_ncols=True) as bar:
            yield bar.update

    started = {}

    def on_step(i, n, step):
        started["t"] = time.perf_counter()
        if not args.quiet:
            print(f"[{i}/{n}] {step.description} ...", file=sys.stderr, flush=True)

    def on_done(report):
        took = time.perf_counter() - started["t"]
        tag = "reused" if report.reused else f"built in {took:.1f}s"
        print(f"  {report.summary}  [{tag}]", flush=True)

    t0 = time.perf_counter()
    reports = run_demo(args.out, progress=progress, on_step=on_step, on_done=on_done, force=args.force)
    n_reused = sum(r.reused for r in reports)
    print(f"demo done in {time.perf_counter() - t0:.1f}s: {len(reports)} steps ({n_reused} reused) in {args.out}/")
    return 0
