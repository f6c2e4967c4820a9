"""Learning curve: score vs number of labelled examples, pretrained (each transfer mode) vs from scratch.

Usage:
    python scripts/learning_curve.py MODEL_DIR --bench zh-sentiment --out runs/curve_bert \
        [--sizes 100 300 1000 3000] [--seeds 0 1 2] [--modes scratch frozen features finetune] \
        [--lr-grid-finetune 1e-4 3e-4 1e-3 --lr-grid-scratch 3e-4 1e-3 3e-3]
Writes curve.png, curve.md (table: mean ± std over seeds) and curve.json. See docs/transfer.md.
"""

from __future__ import annotations

import argparse
import logging
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("--bench", default="zh-sentiment", choices=["zh-sentiment", "zh-ner", "zh-pos", "en-tweets"])
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 300, 1000, 3000])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--modes", nargs="+", default=None, help="subset of scratch frozen features finetune")
    p.add_argument("--n-test", type=int, default=1000)
    p.add_argument("--pool", type=int, default=10000, help="labelled examples the training sets are drawn from")
    p.add_argument("--min-steps", type=int, default=100, help="every run trains at least this many steps")
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--finetune-lr", type=float, default=None, help="lr of finetune and scratch runs")
    p.add_argument("--finetune-epochs", type=int, default=None, help="epochs of finetune and scratch runs")
    p.add_argument("--lr-grid-finetune", type=float, nargs="+", default=None, metavar="LR",
                   help="finetune: try these lrs, keep the best on the validation split")
    p.add_argument("--lr-grid-scratch", type=float, nargs="+", default=None, metavar="LR",
                   help="scratch: the same number of trials on the same validation split")
    p.add_argument("--no-refit", dest="refit", action="store_false",
                   help="keep each run's best validation epoch instead of refitting on all its examples")
    args = p.parse_args()
    if (args.lr_grid_finetune is None) != (args.lr_grid_scratch is None) or (
        args.lr_grid_finetune and len(args.lr_grid_finetune) != len(args.lr_grid_scratch)
    ):
        p.error("give --lr-grid-finetune and --lr-grid-scratch together, with as many lrs each (equal care)")

    from lmforge.errors import LmforgeError
    from lmforge.transfer import learning_curve
    from lmforge.transfer.benchmarks import load_benchmark
    from lmforge.utils import setup_logging

    setup_logging(logging.INFO)
    try:
        train, test = load_benchmark(args.bench, max(args.pool, max(args.sizes)), args.n_test, seed=0)
        res = learning_curve(
            args.model_dir,
            train.task,
            train,
            test,
            sizes=args.sizes,
            seeds=args.seeds,
            modes=args.modes,
            out_dir=args.out,
            min_steps=args.min_steps,
            max_len=args.max_len,
            batch_size=args.batch_size,
            cache_dir=args.cache_dir,
            refit=args.refit,
            mode_options={
                "finetune": {"lr": args.finetune_lr, "epochs": args.finetune_epochs, "lr_grid": args.lr_grid_finetune},
                "scratch": {"lr": args.finetune_lr, "epochs": args.finetune_epochs, "lr_grid": args.lr_grid_scratch},
            },
        )
    except LmforgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from lmforge.transfer.curve import curve_table

    print(curve_table(res))
    print(f"wrote {args.out}/curve.png, curve.md, curve.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
