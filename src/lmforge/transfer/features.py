"""Features mode: vectors computed once and cached, and the classifier a careful practitioner fits on them.

**The cache.**  The body runs once over a split; every layer's read-out vectors are stored as
safetensors under ``cache_dir``, keyed by the sha256 of the model weights, of the examples and of the
settings that shape the vectors (family, task, max_len, pooling, windows, tokenizer).  A second run
with the same model, data and settings reads the file instead of running the body.

**The classifier** (``logreg``, the default, on sentence and tagging tasks) is scikit-learn's
``LogisticRegression`` on standardised vectors: each layer's vectors are standardised per channel, the
L2 strength ``C`` is chosen from a log grid and the layer from all of the body's layers, both by
stratified (sentences) or grouped (tagging: all words of a sentence in one fold) k-fold
cross-validation on the training data; the best pair is refitted on all of it.  The fitted model is
folded into the run's :class:`~lmforge.transfer.heads.TaskHead` (its standardisation buffers and its
linear layer), so prediction, saving and export treat it like any other head.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from ..errors import CheckpointError
from ..storage.files import load_safetensors, save_safetensors
from ..utils import seed32
from .model import RowStore

logger = logging.getLogger(__name__)

CACHE_FORMAT = 3  # bump when what the cache stores changes (3: every layer, choices grouped per question)
C_GRID = np.logspace(-5, 1, 13)  # L2 strengths tried (inverse regularisation), half a decade apart
C_GRID_LARGE = np.logspace(-4, 1, 6)  # a coarser grid when there are many rows (tagging)
LARGE_ROWS = 5000


def cache_dir(cfg) -> Path:
    return Path(cfg.cache_dir) if cfg.cache_dir else Path.home() / ".cache" / "lmforge" / "features"


def cache_key(weights_hash: str, data_hash: str, settings: dict) -> str:
    h = hashlib.sha256()
    h.update(weights_hash.encode())
    h.update(data_hash.encode())
    h.update(json.dumps({"format": CACHE_FORMAT, **settings}, sort_keys=True).encode())
    return h.hexdigest()[:32]


def load_or_compute(path: Path, owners: torch.Tensor, compute, meta: dict[str, str]) -> RowStore:
    """The cached store at ``path`` when it fits ``owners``; else ``compute()`` (vectors, lengths), saved."""
    if path.is_file():
        try:
            t = load_safetensors(path)
            if _cache_fits(t, owners):
                logger.info("features: reusing cached vectors %s (%d inputs)", path, len(owners))
                return RowStore(t["vectors"], t["lengths"], t["owners"])
        except CheckpointError:
            pass
        logger.warning("features: cache file %s is unreadable or stale; recomputing it", path)
    t0 = time.time()
    vectors, lengths = compute()
    save_safetensors({"vectors": vectors, "lengths": lengths, "owners": owners}, path, metadata=meta)
    logger.info("features: ran the body over %d inputs in %.1fs; cached to %s", len(owners), time.time() - t0, path)
    return RowStore(vectors, lengths, owners)


def _cache_fits(t: dict, owners: torch.Tensor) -> bool:
    """Whether a cache file holds whole, finite vectors of these inputs (a damaged one is computed again: a cache
    never decides a result)."""
    if not {"vectors", "lengths", "owners"} <= set(t) or not torch.equal(t["owners"], owners):
        return False
    vectors, lengths = t["vectors"], t["lengths"]
    whole = (not lengths.is_floating_point() and len(lengths) == len(owners) and bool((lengths >= 0).all())
             and int(lengths.sum()) == len(vectors))
    return whole and vectors.is_floating_point() and bool(torch.isfinite(vectors).all())


def _folds(y: np.ndarray, groups: np.ndarray, n_folds: int, seed: int, grouped: bool):
    """The cross-validation folds: grouped by example, else stratified by class (None when a class is too rare)."""
    from sklearn.model_selection import GroupKFold, StratifiedKFold  # slow to import: see fit_logreg

    if grouped:
        n = min(n_folds, len(np.unique(groups)))
        return list(GroupKFold(n_splits=n).split(np.zeros(len(y)), y, groups))
    counts = np.bincount(y)
    n = int(min(n_folds, counts[counts > 0].min())) if len(counts) else 0
    if n < 2:
        return None
    return list(StratifiedKFold(n_splits=n, shuffle=True, random_state=seed32(seed)).split(np.zeros(len(y)), y))


def _cv_scores(X: np.ndarray, y: np.ndarray, folds, grid: np.ndarray, scorer) -> np.ndarray:
    """Mean held-out score of every ``C`` of ``grid`` (ascending) over ``folds``.

    Within a fold the scaler is fitted on the training part only (no held-out statistics leak), and the
    strengths are fitted from the strongest regularisation up, each fit starting from the previous
    solution (the regularisation path, as ``LogisticRegressionCV`` walks it): the problem is convex, so
    the warm start changes only how many iterations a fit takes.
    """
    from sklearn.linear_model import LogisticRegression  # slow to import: see fit_logreg
    from sklearn.preprocessing import StandardScaler

    scores = np.zeros(len(grid))
    for train_idx, test_idx in folds:
        scaler = StandardScaler().fit(X[train_idx])
        X_fit, X_held = scaler.transform(X[train_idx]), scaler.transform(X[test_idx])
        clf = LogisticRegression(max_iter=1000, warm_start=True)
        for i, C in enumerate(grid):
            clf.set_params(C=float(C)).fit(X_fit, y[train_idx])
            scores[i] += scorer(clf, X_held, y[test_idx])
    return scores / len(folds)


def fit_logreg(
    X_by_layer: dict[int, np.ndarray],
    y: np.ndarray,
    groups: np.ndarray,
    n_folds: int,
    seed: int,
    grouped: bool,
    score_classes: list[int] | None = None,
) -> dict:
    """Choose a layer and ``C`` by cross-validation, refit on everything.

    The fits run with one BLAS thread: on these small matrices more threads only contend (a 32-tag
    tagging fit took three times as long with two).

    Args:
        X_by_layer: the read-out vectors (N, D) of each candidate layer.
        y: (N,) class ids; groups: (N,) the example each row belongs to.
        grouped: keep all rows of an example in one fold (tagging) instead of stratifying by class.
        score_classes: score the folds by the micro F1 over these classes instead of by accuracy (tagging:
            every tag but ``O``, so that predicting ``O`` everywhere scores 0, as it does in entity F1).

    Returns:
        ``{"layer", "C", "cv_accuracy", "mean" (D,), "scale" (D,), "coef" (K', D), "intercept" (K',),
        "classes", "per_layer"}``; with two classes ``coef`` has one row (the second class's logit).
    """
    from sklearn.exceptions import ConvergenceWarning  # slow to import: only a features fit loads scikit-learn

    classes = np.unique(y)
    folds = _folds(y, groups, n_folds, seed, grouped) if len(classes) > 1 else None
    grid = np.sort(C_GRID_LARGE if len(y) > LARGE_ROWS else C_GRID)
    with warnings.catch_warnings(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore", ConvergenceWarning)
        if folds is not None:
            layer, cv_acc, C, per_layer = _choose_layer_and_c(X_by_layer, y, folds, grid, _scorer(score_classes))
        else:  # one class, or too few examples of a class to cross-validate: a moderate default
            layer, cv_acc, C, per_layer = max(X_by_layer), float("nan"), 1e-2, {}
        scaler, coef, intercept = _final_fit(X_by_layer[layer], y, C, classes)
    return {
        "layer": int(layer),
        "C": float(C),
        "cv_accuracy": cv_acc,
        "mean": scaler.mean_,
        "scale": scaler.scale_,
        "coef": coef,
        "intercept": intercept,
        "classes": classes,
        "per_layer": {int(k): round(v[0], 4) for k, v in per_layer.items()},
    }


def _scorer(score_classes: list[int] | None):
    """Accuracy, or the micro F1 over ``score_classes`` (see :func:`fit_logreg`), as a scikit-learn scorer."""
    from sklearn.metrics import accuracy_score, f1_score, make_scorer  # slow to import: see fit_logreg

    if score_classes is not None:
        return make_scorer(f1_score, labels=list(score_classes), average="micro", zero_division=0)
    return make_scorer(accuracy_score)


def _choose_layer_and_c(X_by_layer: dict[int, np.ndarray], y: np.ndarray, folds, grid: np.ndarray, scorer
                        ) -> tuple[int, float, float, dict[int, tuple[float, float]]]:
    """``(layer, its CV score, its C, {layer: (CV score, C)})``: per layer the ``C`` of the best mean CV score
    (of equal scores, the strongest regularisation), then the layer of the best score (ties: the higher layer)."""
    per_layer: dict[int, tuple[float, float]] = {}
    for layer, X in X_by_layer.items():
        scores = _cv_scores(X, y, folds, grid, scorer)
        best = int(np.argmax(np.round(scores, 9)))  # the first of equal scores: the strongest regularisation
        per_layer[layer] = (float(scores[best]), float(grid[best]))
    layer = max(per_layer, key=lambda k: (round(per_layer[k][0], 9), k))
    cv_acc, C = per_layer[layer]
    return layer, cv_acc, C, per_layer


def _final_fit(X: np.ndarray, y: np.ndarray, C: float, classes: np.ndarray):
    """``(scaler, coef, intercept)`` of the logistic regression at ``C`` on all of ``X`` standardised (with one
    class: zero weights)."""
    from sklearn.linear_model import LogisticRegression  # slow to import: see fit_logreg
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(X)
    if len(classes) < 2:
        return scaler, np.zeros((1, X.shape[1])), np.zeros(1)
    clf = LogisticRegression(C=C, max_iter=2000).fit(scaler.transform(X), y)
    return scaler, clf.coef_, clf.intercept_


@torch.no_grad()
def fold_into_linear(linear: torch.nn.Linear, fit: dict, num_outputs: int) -> None:
    """Write a fitted (scaler, logistic regression) into ``linear`` so that ``linear(x)`` gives its logits.

    Classes absent from the training rows get a logit of -1e4 (never predicted).
    """
    coef = torch.as_tensor(fit["coef"], dtype=torch.float64)  # (K', D)
    b = torch.as_tensor(fit["intercept"], dtype=torch.float64)
    mean = torch.as_tensor(fit["mean"], dtype=torch.float64)
    scale = torch.as_tensor(fit["scale"], dtype=torch.float64)
    classes = [int(c) for c in fit["classes"]]
    W = torch.zeros(num_outputs, coef.shape[1], dtype=torch.float64)
    bias = torch.full((num_outputs,), -1e4, dtype=torch.float64)
    if len(classes) == 2 and coef.shape[0] == 1:  # binary: sklearn gives the second class's logit
        rows = {classes[0]: (torch.zeros_like(coef[0]), torch.zeros(())), classes[1]: (coef[0], b[0])}
    else:
        rows = {c: (coef[i], b[i]) for i, c in enumerate(classes)}
    for c, (w, bb) in rows.items():
        W[c] = w / scale
        bias[c] = bb - (w * mean / scale).sum()
    linear.weight.copy_(W.to(linear.weight.dtype))
    linear.bias.copy_(bias.to(linear.bias.dtype))
