"""Learning curve: the older spelling of ``lmforge benchmark curve`` (kept so that recorded commands still run).

    python scripts/learning_curve.py MODEL_DIR --bench zh-sentiment --out runs/curve [options]

is ``lmforge benchmark curve zh-sentiment MODEL_DIR --out runs/curve [options]`` (the same options;
``--bench`` defaults to zh-sentiment, and ``--sizes`` here to 100 300 1000 3000 as it always did).
See ``lmforge benchmark curve --help`` and docs/transfer.md.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("model_dir")
    p.add_argument("--bench", default="zh-sentiment")
    p.add_argument("-h", "--help", action="store_true")
    args, rest = p.parse_known_args()
    from lmforge.cli import main as cli

    if args.help:
        return cli(["benchmark", "curve", "--help"])
    if "--sizes" not in rest:
        rest += ["--sizes", "100", "300", "1000", "3000"]
    return cli(["benchmark", "curve", args.bench, args.model_dir, *rest])


if __name__ == "__main__":
    sys.exit(main())
