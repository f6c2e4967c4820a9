"""``lmforge demo``: the whole lineage on the built-in corpus, reusing what a previous run built."""

from __future__ import annotations

import argparse

from ..demo import run_demo
from ..demo.plan import DEMO_PRECISION
from ..storage.writing import output_folder
from . import command_help
from ._common import add_compute_args, add_json_arg, say, show


def register(sub) -> None:
    p = sub.add_parser(
        "demo",
        help=command_help("demo"),
        description="Train tokenizers and prepare token shards from lmforge's built-in English corpus (Python "
        "docs, WordNet, King James Bible); pretrain small word2vec, ELMo, GPT, BERT and ELECTRA models on it, and the "
        "same BERT (MLM only) on the Chinese NER benchmark's unlabelled text (People's Daily), all for fixed "
        "step counts; compare 'python' the snake and the language across models and layers, and score WordNet "
        "word-in-context pairs; transfer to English tweet sentiment (BERT frozen and features, every family's "
        "features); a learning curve on Chinese NER of the in-domain BERT's features / finetune vs the same BERT "
        "trained from scratch; write report.md with the tables and plots. A second run reuses every step whose "
        "inputs did not change.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  lmforge demo                      # the full run (docs/demo.md: how long, per CPU kind)\n"
        "  lmforge demo --quick              # tiny models on a slice of the corpus\n"
        "  lmforge demo --budget 30m --out big-demo\n"
        "  lmforge demo --precision auto     # bf16 for each model where a timed probe finds it faster\n\n"
        "The demo computes in fp32 unless --precision says otherwise. The figures repeat exactly on the same "
        "machine;\nanother CPU kind, thread count or precision gives slightly different ones (report.md names "
        "the machine).",
    )
    p.add_argument("--out", default=None, metavar="DIR",
                   help="demo folder (default: lmforge-demo/, or lmforge-demo-quick/ with --quick)")
    p.add_argument("--budget", default=None, metavar="TIME",
                   help="scale the fixed step counts against the plan's reference budget (15m; 3m with --quick), "
                        "e.g. 30m trains every model twice the steps of the full plan (nothing stops by time, so a "
                        "run's figures reproduce)")
    p.add_argument("--quick", action="store_true",
                   help="tiny models on a slice of the corpus, a few steps each: the whole path, quickly")
    p.add_argument("--force", action="store_true", help="rebuild every step even if a previous run built it")
    add_compute_args(p)
    add_json_arg(p)
    p.set_defaults(func=run, writes=("--out",))


def run(args) -> int:
    import contextlib
    import logging
    import sys

    from tqdm import tqdm

    quiet = bool(getattr(args, "quiet", False))

    @contextlib.contextmanager
    def progress(total, desc, unit="it"):
        with tqdm(total=total, desc=f"  {desc}", unit=unit, unit_scale=unit == "B", file=sys.stderr, leave=False,
                  disable=True if quiet else None, dynamic_ncols=True) as bar:
            yield bar.update

    def on_step(i, n, step):
        if not quiet:
            print(f"[{i}/{n}] {step.description} ...", file=sys.stderr, flush=True)

    def on_done(report):
        tag = "reused" if report.reused else f"built in {report.seconds:.1f}s"
        say(args, f"  {report.summary}  [{tag}]")

    # the demo logs one line per transfer run; the epoch-by-epoch lines of the parts it calls are too many
    chatty = [logging.getLogger(name) for name in ("lmforge.transfer", "lmforge.evaluate")]
    levels = [lg.level for lg in chatty]
    for lg in chatty:
        lg.setLevel(logging.WARNING)

    out = args.out or ("lmforge-demo-quick" if args.quick else "lmforge-demo")
    try:
        with output_folder(out, "demo", existing="continue", hint=None):  # a demo reuses what it built
            result = run_demo(args.out, quick=args.quick, budget=args.budget, progress=progress,
                              show_bars=False if quiet else None, on_step=on_step, on_done=on_done, force=args.force,
                              device=args.device or "auto", precision=args.precision or DEMO_PRECISION)
    finally:
        for lg, level in zip(chatty, levels):
            lg.setLevel(level)
    n_reused = sum(r.reused for r in result.steps)
    done = (f"demo done in {result.elapsed:.1f}s: {len(result.steps)} steps ({n_reused} reused); "
            f"report: {result.report}")
    record = {"out": str(result.out), "report": str(result.report), "elapsed": result.elapsed,
              "left_out": result.left_out,
              "steps": [{"name": r.name, "summary": r.summary, "reused": r.reused, "seconds": r.seconds}
                        for r in result.steps], "results": result.results}
    show(args, record, ["", *result.left_out, *result.highlights, done])
    return 0
