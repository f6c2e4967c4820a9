"""A benchmark's learning curve scored on held-out training-side examples instead of its test partition.

A curve tuned and read on the same test partition over many sessions can flatter a method; this scores the same
kind of curve on examples that no run, no choice and no earlier result has seen.  The benchmark's training side is
drawn once (seed 0) as ``--pool`` + ``--held`` examples: training sets of each size are drawn from the first
``--pool``, and every run is scored on the last ``--held``, less any example that repeats one of the pool (the same
text up to case and spacing, or the same sentence), as the test partition is kept apart.

    python scripts/heldout_curve.py en-tweets MODEL_DIR --out heldout --modes scratch frozen features finetune

Writes curve.json, curve.md and curve.png into ``--out``, as ``lmforge benchmark curve`` does.
"""

from __future__ import annotations

import argparse
import sys

from lmforge.data.task_data import TaskData
from lmforge.devices import PRECISIONS
from lmforge.transfer import learning_curve
from lmforge.transfer.benchmarks import BENCHMARKS, example_key, load_benchmark
from lmforge.transfer.curve import curve_table


def split_training_side(name: str, pool: int, held: int) -> tuple[TaskData, TaskData]:
    """(the pool the training sets are drawn from, the held-out examples) of benchmark ``name``."""
    train, _ = load_benchmark(name, pool + held, 1, seed=0)
    drawn = TaskData(train.task, train.examples[:pool], train.labels, f"{train.source}[:{pool}]")
    seen = {example_key(ex) for ex in drawn.examples}
    rest = [ex for ex in train.examples[pool:] if example_key(ex) not in seen]
    return drawn, TaskData(train.task, rest, train.labels, f"{train.source}[{pool}:{pool + held}] (held out)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("name", choices=list(BENCHMARKS))
    ap.add_argument("model_dir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", nargs="+", type=int, default=[100, 300])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--modes", nargs="+", default=None)
    ap.add_argument("--pool", type=int, default=10000, help="training-side examples the training sets come from")
    ap.add_argument("--held", type=int, default=2000, help="training-side examples scored (before duplicates go)")
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--precision", choices=PRECISIONS, default="fp32")
    args = ap.parse_args(argv)
    pool, held = split_training_side(args.name, args.pool, args.held)
    print(f"training sets from {len(pool.examples):,} examples; scored on {len(held.examples):,} held-out ones",
          file=sys.stderr)
    res = learning_curve(args.model_dir, pool.task, pool, held, sizes=args.sizes, seeds=args.seeds, modes=args.modes,
                         out_dir=args.out, max_len=args.max_len, precision=args.precision,
                         progress=lambda line: print(line, file=sys.stderr))
    print(curve_table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
