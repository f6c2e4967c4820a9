"""A bag-of-characters reference for a classification benchmark: TF-IDF of character n-grams and a
logistic regression (scikit-learn), the strength chosen by 5-fold cross-validation on the training draw.

    python scripts/tfidf_baseline.py zh-sentiment --sizes 100 300 1000 --seeds 0 1 2

Training draws are random samples (``random.Random(seed)``) of the benchmark's training side; the test
set is the benchmark's fixed test draw (``lmforge.transfer.benchmarks.load_benchmark``).  It calibrates
what the labels allow from n examples; it is not an lmforge transfer mode.
"""

from __future__ import annotations

import argparse
import random
import statistics

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegressionCV

from lmforge.transfer.benchmarks import BENCHMARKS, load_benchmark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", choices=[b for b in BENCHMARKS if b in ("zh-sentiment", "en-tweets")])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 300, 1000])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--ngrams", type=int, default=2, help="character n-grams of 1..N")
    ap.add_argument("--n-test", type=int, default=1000)
    args = ap.parse_args()
    train, test = load_benchmark(args.bench, 10000, args.n_test, 0)
    tx = [e.text for e in test.examples]
    ty = [e.label for e in test.examples]
    for n in args.sizes:
        accs = []
        for seed in args.seeds:
            sub = random.Random(seed).sample(train.examples, n)
            vec = TfidfVectorizer(analyzer="char", ngram_range=(1, args.ngrams), sublinear_tf=True)
            x = vec.fit_transform([e.text for e in sub])
            clf = LogisticRegressionCV(Cs=np.logspace(-2, 3, 11), cv=5, max_iter=2000, scoring="accuracy")
            clf.fit(x, [e.label for e in sub])
            accs.append(clf.score(vec.transform(tx), ty))
        print(f"{n}: " + " / ".join(f"{a:.3f}" for a in accs) + f" = {statistics.mean(accs):.3f}", flush=True)


if __name__ == "__main__":
    main()
