"""The features mode's classifier fit: lmforge's ``fit_logreg`` vs the plain scikit-learn recipe.

Both choose a layer and the L2 strength ``C`` by 5-fold grouped cross-validation on the same rows,
score the folds the same way (micro F1 over the tags other than ``O``) and refit the winner:

* the plain recipe: ``GridSearchCV(make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)))``
  per layer, every fit from zero, with the BLAS threads the machine gives it (what lmforge ran before);
* lmforge: the same folds and grid, each fold's strengths fitted from the strongest up, each starting
  from the previous solution, on one BLAS thread (``lmforge.transfer.features.fit_logreg``).

    python bench/bench_features_fit.py                 # tagging-shaped: 2,600 rows, 128 dims, 32 tags, 3 layers
    python bench/bench_features_fit.py --rows 7500     # the coarse grid (over 5,000 rows)

The rows are synthetic (class means on a random simplex plus noise, words grouped into "sentences"
of 25), shaped like the zh-pos features of a 128-wide BERT at 100 labelled sentences. Both fits run in
one process, in turns, ``--repeats`` times; the ratio is the thing to read. The chosen layer and ``C``
and the cross-validated scores are printed side by side. The problem is convex, so they agree where the
fits converge; at the weakest regularisation on separable rows ``max_iter`` stops L-BFGS first, and a
cold and a warm start stop at different points (a few thousandths of CV score).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

print = functools.partial(print, flush=True)  # noqa: A001 - progress shows when piped to a file


def make_rows(rows: int, dim: int, classes: int, layers: int, seed: int):
    """Rows of ``layers`` views of one labelling; a higher layer separates the classes a little better."""
    rng = np.random.default_rng(seed)
    freq = 1.0 / np.arange(1, classes + 1)  # Zipf-like tag frequencies, tag 0 the commonest ("O")
    y = rng.choice(classes, size=rows, p=freq / freq.sum())
    groups = np.arange(rows) // 25
    X_by_layer = {}
    for layer in range(layers):
        means = rng.normal(size=(classes, dim)) * (0.35 + 0.1 * layer)
        X_by_layer[layer] = (means[y] + rng.normal(size=(rows, dim))).astype(np.float32)
    return X_by_layer, y, groups


def plain_fit(X_by_layer, y, groups, n_folds, seed, score_classes):
    """The recipe without the path or the thread limit: GridSearchCV over a scaler + logistic regression."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score, make_scorer
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from lmforge.transfer import features as FT

    scoring = make_scorer(f1_score, labels=list(score_classes), average="micro", zero_division=0)
    folds = FT._folds(y, groups, n_folds, seed, True)
    grid = FT.C_GRID_LARGE if len(y) > FT.LARGE_ROWS else FT.C_GRID
    per_layer = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for layer, X in X_by_layer.items():
            pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
            search = GridSearchCV(pipe, {"logisticregression__C": grid}, cv=folds, scoring=scoring, refit=False)
            scores = search.fit(X, y).cv_results_["mean_test_score"]
            best = int(np.argmax(scores))
            per_layer[layer] = (float(scores[best]), float(grid[best]))
        layer = max(per_layer, key=lambda k: (round(per_layer[k][0], 9), k))
        C = per_layer[layer][1]
        scaler = StandardScaler().fit(X_by_layer[layer])
        LogisticRegression(C=C, max_iter=2000).fit(scaler.transform(X_by_layer[layer]), y)
    return {"layer": layer, "C": C, "per_layer": {k: round(v[0], 4) for k, v in per_layer.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=2600)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--classes", type=int, default=32)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    from threadpoolctl import threadpool_info

    from lmforge.transfer.features import fit_logreg

    X_by_layer, y, groups = make_rows(args.rows, args.dim, args.classes, args.layers, seed=0)
    score_classes = list(range(1, args.classes))
    threads = max((i.get("num_threads", 1) for i in threadpool_info()), default=1)
    print(f"{args.rows} rows x {args.dim} dims, {args.classes} classes, {args.layers} layers, 5 grouped folds; "
          f"BLAS threads available: {threads}")
    times = {"plain": [], "lmforge": []}
    out = {}
    for r in range(args.repeats):
        order = ("plain", "lmforge") if r % 2 == 0 else ("lmforge", "plain")
        for name in order:
            t0 = time.perf_counter()
            if name == "plain":
                out[name] = plain_fit(X_by_layer, y, groups, 5, 0, score_classes)
            else:
                fit = fit_logreg(X_by_layer, y, groups, 5, 0, True, score_classes)
                out[name] = {"layer": fit["layer"], "C": fit["C"], "per_layer": fit["per_layer"]}
            times[name].append(time.perf_counter() - t0)
            print(f"  repeat {r + 1} {name:8s} {times[name][-1]:7.1f} s")
    print(f"{'fit':10s} {'median':>9s}  {'layer':>5s}  {'C':>8s}  cv score by layer")
    for name in ("plain", "lmforge"):
        o = out[name]
        print(f"{name:10s} {statistics.median(times[name]):8.1f}s  {o['layer']:5d}  {o['C']:8.1e}  {o['per_layer']}")
    print(f"speed-up lmforge / plain: {statistics.median(times['plain']) / statistics.median(times['lmforge']):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
