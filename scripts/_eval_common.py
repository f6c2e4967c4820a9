"""Shared argument parsing of the scripts/eval_*.py wrappers (not a public module)."""

from __future__ import annotations

import argparse
import json
import logging
import sys


def parser(description: str, n_train: int, n_test: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("model_dirs", nargs="+", help="pretrained model folders (from `lmforge pretrain`)")
    p.add_argument("--out", required=True, help="folder for results.md, results.json and the run folders")
    p.add_argument("--n-train", type=int, default=n_train)
    p.add_argument("--n-test", type=int, default=n_test)
    p.add_argument("--modes", nargs="*", default=None, help="frozen / features / finetune (default: all supported)")
    p.add_argument("--no-scratch", action="store_true", help="skip the from-scratch baseline")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--finetune-lr",
        type=float,
        default=None,
        help="learning rate of finetune and from-scratch runs (small models want ~1e-3)",
    )
    p.add_argument("--finetune-epochs", type=int, default=None, help="epochs of finetune and from-scratch runs")
    return p


def run(bench: str, args) -> int:
    from lmforge.errors import LmforgeError
    from lmforge.transfer.benchmarks import compare
    from lmforge.utils import setup_logging

    setup_logging(logging.INFO)
    try:
        res = compare(
            args.model_dirs,
            bench,
            n_train=args.n_train,
            n_test=args.n_test,
            modes=args.modes,
            seed=args.seed,
            out_dir=args.out,
            with_scratch=not args.no_scratch,
            epochs=args.epochs,
            max_len=args.max_len,
            batch_size=args.batch_size,
            mode_options={m: {"lr": args.finetune_lr, "epochs": args.finetune_epochs} for m in ("finetune", "scratch")},
        )
    except LmforgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from lmforge.transfer.benchmarks import results_table

    print(results_table(res))
    print(json.dumps({"wrote": f"{args.out}/results.md"}))
    return 0
