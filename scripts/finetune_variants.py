"""Fine-tuning variants on a real benchmark, as docs/transfer.md records them (zh-sentiment, 300 labels).

    python scripts/finetune_variants.py zh-sentiment MODEL_DIR --variant lpft --split dev --seeds 0 1 2 3 4
    python scripts/finetune_variants.py zh-sentiment MODEL_DIR --variant dropout --split test --seeds 0 1 2

Variants (each with the learning curve's rules: the same draws per seed, the same lr grids, at least
100 optimizer steps, the refit on all examples):

* ``plain``: ``finetune`` as ``lmforge benchmark curve`` runs it (grid 1e-4 3e-4 1e-3);
* ``scratch``: the same architecture from a random init (grid 3e-4 1e-3 3e-3);
* ``dropout``: ``plain`` and ``scratch`` with dropout ``--dropout`` in every body layer (the tiny presets
  pretrain without it);
* ``lpft``: LP-FT (Kumar et al. 2022): the new head is first trained alone on the frozen body (lr 3e-3,
  at most 60 epochs, the epoch chosen on the run's validation split, no refit), then ``plain`` runs from
  that head.

Splits: ``test`` draws from the benchmark's 10,000-example training pool and scores on its 1,000 test
examples; ``dev`` draws from the pool's first 8,000 and scores on its last 2,000 (training-side
examples, no test example; unlike ``lmforge benchmark curve --score-on dev`` this split keeps texts that
occur on both sides, as the recorded runs did). Prints one line per seed and the mean.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", choices=["zh-sentiment", "en-tweets"])
    ap.add_argument("model_dir")
    ap.add_argument("--variant", choices=["plain", "scratch", "dropout", "lpft"], default="plain")
    ap.add_argument("--split", choices=["test", "dev"], default="dev")
    ap.add_argument("--size", type=int, default=300)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--dropout", type=float, default=0.1, help="body dropout of the dropout variant")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from torch import nn

    from lmforge.nn.cpu_ops import Dropout
    from lmforge.nn.transformer import SelfAttention
    from lmforge.transfer.benchmarks import load_benchmark
    from lmforge.transfer.config import TransferConfig
    from lmforge.transfer.curve import _copy_body, with_min_steps
    from lmforge.transfer.run import TransferRun, load_body

    class HeadOnly(TransferRun):
        """The finetune head trained on a frozen body: LP-FT's first step."""

        @property
        def body_trains(self) -> bool:
            return False

    body, model_dir = load_body(args.model_dir)
    pool, test = load_benchmark(args.bench, 10000, 1000, seed=0)
    if args.split == "dev":
        pool, test = pool.subset(list(range(8000))), pool.subset(list(range(8000, 10000)))
    runs = ["scratch", "plain"] if args.variant == "dropout" else [args.variant]
    for kind in runs:
        scores = []
        for seed in args.seeds:
            idx = np.random.default_rng(seed).choice(len(pool), size=args.size, replace=False).tolist()
            sub = pool.subset(idx)
            b = _copy_body(body)
            if args.variant == "dropout":
                for m in b.modules():
                    if isinstance(m, (Dropout, nn.Dropout)):
                        m.p = args.dropout
                    if isinstance(m, SelfAttention):
                        m.dropout = args.dropout
            scratch = kind == "scratch"
            cfg = TransferConfig(task=pool.task, mode="finetune", seed=seed, max_len=args.max_len,
                                 lr_grid=[3e-4, 1e-3, 3e-3] if scratch else [1e-4, 3e-4, 1e-3], from_scratch=scratch)
            cfg = with_min_steps(cfg, body.model_type, args.size, min_steps=100)
            run = TransferRun(b, cfg, pool.labels, model_dir)
            if kind == "lpft":
                probe_cfg = TransferConfig(task=pool.task, mode="finetune", seed=seed, max_len=args.max_len, lr=3e-3,
                                           epochs=60, patience=5, warmup=0.05, refit=False)
                probe = HeadOnly(b, probe_cfg, pool.labels, model_dir)
                probe.fit(sub)
                run.model = probe.model  # the fine-tuning starts from the trained head
            facts = run.fit(sub)
            score = run.score(test)
            scores.append(score)
            print(f"{args.variant} {kind} seed {seed}: {score:.4f} (validation {facts['val_score']:.3f}, "
                  f"lr {facts['choices']['lr']:g})", flush=True)
        print(f"{args.variant} {kind}: mean {statistics.fmean(scores):.4f} over seeds {args.seeds} "
              f"({args.split}: {len(test)} examples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
