"""Learning curves: how much does pretraining buy when labels are few?

For each training-set size ``n`` and seed, ``n`` examples are drawn from the training pool (the
same draw for every mode of that seed, so that modes are compared on the same examples); each
mode trains on them and is scored on the whole test set.  ``scratch`` is the same architecture
initialised at random and trained end to end (``finetune`` with ``from_scratch=True``): the
baseline that pretraining has to beat.  ``scratch:PRESET`` is the same baseline in another preset's
shape of the family (same tokenizer and position range): a larger pretrained shape is not a fair
yardstick for itself when a smaller one trains better from a few hundred labels, so a curve can
carry both and :func:`curve_leads` measures against the stronger.

With few examples an epoch is only a few steps, so every run trains for at least ``min_steps``
optimizer steps (more epochs for small ``n``); all modes get the same rule.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from torch import nn

from ..data.tasks import TaskData, check_labels, load_task
from ..devices import Compute
from ..errors import LmforgeError
from ..families import FAMILIES, get_family
from ..storage.files import atomic_path, atomic_write_text
from ..train.precision import describe, resolve_compute, settle
from .config import TransferConfig, check_supported
from .folder import load_body
from .model import RowStore
from .modes import FINETUNE, MODES, Mode, mode_of
from .run import TransferRun
from .specs import SPECS

logger = logging.getLogger(__name__)

SCRATCH = "scratch"  # the baseline: the same body's shape from a random init, fine-tuned
CURVE_MODES = (SCRATCH, *MODES)


def main_metric(data: TaskData) -> str:
    """The headline score of a task: accuracy, entity F1 (BIO tags), token accuracy (plain tags) or QA F1."""
    return SPECS[data.task].main_metric(data.labels)


def with_min_steps(cfg: TransferConfig, family: str, n: int, min_steps: int) -> TransferConfig:
    """``cfg`` with enough epochs that ``n`` training examples (less the validation split) give at least
    ``min_steps`` optimizer steps, and never fewer epochs than the recipe's."""
    steps_per_epoch = math.ceil(n * (1 - cfg.val_fraction) / cfg.batch_size)
    epochs = max(cfg.resolved(family).epochs, math.ceil(min_steps / max(1, steps_per_epoch)))
    return dataclasses.replace(cfg, epochs=epochs)


# config keys a ``scratch:PRESET`` body keeps from the pretrained one: the positions the inputs need
_KEEP_FROM_BODY = ("max_position_embeddings", "n_positions")


def is_scratch(mode: str) -> bool:
    """``scratch`` or ``scratch:PRESET``: a baseline trained from a random init."""
    return mode == SCRATCH or mode.startswith(f"{SCRATCH}:")


def transfer_mode(mode: str) -> Mode:
    """The transfer mode of a curve's ``mode`` (a from-scratch baseline fine-tunes)."""
    return FINETUNE if is_scratch(mode) else mode_of(mode)


def preset_body(body: nn.Module, preset: str) -> nn.Module:
    """A randomly initialised body of ``body``'s family in the shape of ``preset``, with its tokenizer.

    The preset's keys replace the pretrained config's (layers, width, heads, dropout); the vocabulary,
    the special ids and the position range stay the pretrained body's, so the same inputs fit both.
    """
    family = get_family(getattr(body, "model_type", None), LmforgeError)
    if FINETUNE.name not in family.transfer_modes:
        raise LmforgeError(f"scratch:{preset}: {family.label} bodies are not fine-tuned, so there is no such baseline")
    presets = family.presets
    if preset not in presets:
        raise LmforgeError(
            f"scratch:{preset}: {family.label} has no preset '{preset}'; choose from {', '.join(presets)}"
        )
    keys = {k: v for k, v in presets[preset].items() if k not in _KEEP_FROM_BODY}
    unknown = [k for k in keys if not hasattr(body.config, k)]
    if unknown:
        raise LmforgeError(f"scratch:{preset}: the preset sets {unknown}, which a {family.label} config does not have")
    out = type(body)(dataclasses.replace(body.config, **keys))
    out.tokenizer = body.tokenizer
    out.eval()
    return out


def _copy_body(body: nn.Module) -> nn.Module:
    """A deep copy of ``body`` sharing its tokenizer (tokenizers need not be copyable)."""
    tok = body.tokenizer
    body.tokenizer = None
    try:
        out = copy.deepcopy(body)
    finally:
        body.tokenizer = tok
    out.tokenizer = tok
    return out


def learning_curve(
    model: nn.Module | str | Path,
    task: str,
    train: TaskData | str | Path,
    test: TaskData | str | Path,
    sizes: Sequence[int] = (100, 300, 1000, 3000),
    seeds: Sequence[int] = (0, 1, 2),
    modes: Sequence[str] | None = None,
    out_dir: str | Path | None = None,
    min_steps: int = 100,
    progress: Callable[[str], None] | None = None,
    compute: Compute | None = None,
    **options,
) -> dict:
    """Score each mode at each training-set size over several seeds.

    Args:
        model: a model folder or a loaded body (a ``TransferBody``, with ``.tokenizer``).
        task: ``classify``, ``pair``, ``tokens``, ``qa`` or ``choice``.
        train: the pool that the training sets are drawn from; test: scored in full.
        sizes: training-set sizes (sizes larger than the pool are skipped, with a warning).
        seeds: one draw and one training seed each.
        modes: a subset of :data:`CURVE_MODES` (default: ``scratch`` plus what the family supports), and
            ``scratch:PRESET`` for a from-scratch baseline in another preset's shape.
        out_dir: when given, writes ``curve.json``, ``curve.md`` (the table) and ``curve.png``.
        min_steps: the least number of optimizer steps of any run.
        progress: called with one line per finished run.
        compute: the command's device and precision (:class:`lmforge.devices.Compute`), resolved once; default:
            resolved from the ``device`` and ``precision`` options.
        **options: TransferConfig fields for every mode (batch_size, max_len, ...); unset (None) ones take
            each mode's own default.
    Returns:
        ``{"task", "metric", "family", "sizes", "modes", "runs": [{"mode", "n", "seed", "score", ...}],
        "summary": {mode: {n: {"mean", "std", "scores"}}}}``.
    """
    body, model_dir = load_body(model)
    family = getattr(body, "model_type", None)
    modes = _curve_modes(family, modes)
    pool = train if isinstance(train, TaskData) else load_task(train, task)
    test_d = test if isinstance(test, TaskData) else load_task(test, task)
    check_labels(pool, test_d)
    curve = _Curve(body, model_dir, task, family, pool, test_d, modes, min_steps,
                   {k: v for k, v in options.items() if v is not None})  # unset: the mode's (or baseline's) default
    curve.compute = compute
    usable = _usable_sizes(sizes, len(pool))
    precision = curve.prepare(usable[0], seeds[0])
    runs = []
    t_start = time.time()
    for n in usable:
        for seed in seeds:
            runs += curve.run_draw(n, seed, progress)
    result = curve.result(usable, seeds, precision, runs, round(time.time() - t_start, 1))
    if out_dir is not None:
        write_curve(result, out_dir)
    return result


class _Curve:
    """What every run of one curve shares: the body, the data, the modes and how each run is configured."""

    def __init__(self, body: nn.Module, model_dir, task: str, family: str, pool: TaskData, test: TaskData,
                 modes: list[str], min_steps: int, options: dict):
        self.body, self.model_dir, self.task, self.family = body, model_dir, task, family
        self.pool, self.test, self.modes = pool, test, modes
        self.min_steps, self.options = min_steps, options
        self.metric = main_metric(pool)
        self.shaped: dict[str, nn.Module] = {}  # scratch:PRESET -> its randomly initialised body
        # mode -> the vectors its runs share ("pool", "test"): features' of both, frozen's of the test set
        self.stores: dict[str, dict[str, RowStore]] = {}
        self.compute: Compute | None = None  # the device and precision, resolved once by prepare()

    def config(self, mode: str, n: int, seed: int) -> TransferConfig:
        """The run config of ``mode`` on ``n`` examples drawn with ``seed``."""
        cfg = TransferConfig(task=self.task, mode=transfer_mode(mode).name, seed=seed, from_scratch=is_scratch(mode),
                             **self.options)
        return cfg if "epochs" in self.options else with_min_steps(cfg, self.family, n, self.min_steps)

    def prepare(self, n: int, seed: int) -> str:
        """Check every mode, build the preset-shaped baselines and the features stores; return the precision
        every run computes in (where and as precisely as the first run of the curve)."""
        for mode in self.modes:  # fail before any training when a mode does not fit the family
            check_supported(self.family, self.config(mode, n, seed))
        self.shaped = {m: preset_body(self.body, m.split(":", 1)[1]) for m in self.modes if m.startswith("scratch:")}
        first = self.config(self.modes[0], n, seed)
        if self.compute is None:  # once for the curve; a pending auto settles on each body
            self.compute = resolve_compute(first.device, first.precision)
        chosen = settle(self.compute, self.body)
        logger.info("%s", describe(first.precision, chosen.precision, chosen.device, chosen.reason))
        for mode in self.modes:  # what the runs of a mode share: one body pass over the pool / the test set
            make_run = functools.partial(TransferRun, self.body, self.config(mode, n, seed), self.pool.labels,
                                         self.model_dir, compute=self.compute)
            self.stores[mode] = transfer_mode(mode).shared_vectors(make_run, self.pool, self.test)
        return chosen.precision

    def draw(self, n: int, seed: int) -> tuple[list[int], TaskData]:
        """The indices and the examples of the training set of size ``n`` drawn with ``seed`` (shared by every mode)."""
        idx = np.random.default_rng(seed).choice(len(self.pool), size=n, replace=False).tolist()
        sub = self.pool.subset(idx)
        missing = set(self.pool.labels) - {ex.label for ex in sub.examples} if SPECS[self.task].classes else set()
        if missing:
            logger.info("n=%d seed=%d: the draw has no example of %s", n, seed, sorted(missing))
        return idx, sub

    def run_draw(self, n: int, seed: int, progress: Callable[[str], None] | None) -> list[dict]:
        """Train and score every mode on one draw; one record per mode."""
        idx, sub = self.draw(n, seed)
        records = []
        for mode in self.modes:
            # frozen GPT trains its task-token rows, so every mode that may change the body gets its own copy
            b = _copy_body(self.shaped.get(mode, self.body)) if transfer_mode(mode).changes_body else self.body
            run = TransferRun(b, self.config(mode, n, seed), self.pool.labels, self.model_dir, self.compute)
            shared = self.stores.get(mode, {})  # frozen: its own pass over its training draw, the shared test vectors
            part = (shared["pool"].subset(idx) if "pool" in shared else None, shared.get("test"))
            rec = _run_record(run, sub, self.test, part, self.metric, mode, n, seed)
            records.append(rec)
            line = f"n={n} seed={seed} {mode}: {self.metric} {rec['score']:.4f} ({rec['seconds']:.1f}s)"
            logger.info(line)
            if progress is not None:
                progress(line)
        return records

    def result(self, usable: list[int], seeds: Sequence[int], precision: str, runs: list[dict], seconds: float
               ) -> dict:
        """The curve's record: its setting, every run and the summary per mode and size."""
        return {
            "task": self.task,
            "metric": self.metric,
            "family": self.family,
            "model_dir": str(self.model_dir) if self.model_dir else None,
            "sizes": usable,
            "seeds": list(seeds),
            "modes": self.modes,
            "precision": precision,
            "n_test": len(self.test),
            "scored_on": self.test.source,
            "seconds": seconds,
            "runs": runs,
            "summary": _summary(runs, self.modes, usable),
        }


def _curve_modes(family: str | None, modes: Sequence[str] | None) -> list[str]:
    """The modes of a curve (default: scratch and what the family supports), checked."""
    if family not in FAMILIES:
        raise LmforgeError(f"unknown model family '{family}'")
    if not modes:
        modes = [SCRATCH, *[m for m in MODES if m in FAMILIES[family].transfer_modes]]
    modes = list(modes)
    bad = [m for m in modes if m not in CURVE_MODES and not m.startswith("scratch:")]
    if bad:
        raise LmforgeError(
            f"unknown learning-curve mode(s) {bad}; choose from {', '.join(CURVE_MODES)} or scratch:PRESET"
        )
    return modes


def _usable_sizes(sizes: Sequence[int], pool_size: int) -> list[int]:
    """The sizes the pool can give (a warning for each one it cannot; none at all is an error)."""
    usable = [n for n in sizes if n <= pool_size]
    for n in sizes:
        if n > pool_size:
            logger.warning("learning curve: skipping n=%d, the training pool has only %d examples", n, pool_size)
    if not usable:
        raise LmforgeError(f"every size in {list(sizes)} exceeds the {pool_size} training examples")
    return usable


def _run_record(run: TransferRun, sub: TaskData, test_d: TaskData, stores: tuple, metric: str, mode: str, n: int,
                seed: int) -> dict:
    """Fit one run on ``sub``, score it on ``test_d`` (on stored vectors where ``stores`` has them); its record."""
    t0, epochs = time.time(), run.cfg.epochs
    pool_store, test_store = stores
    facts = run.fit(sub) if pool_store is None else run.fit(sub, store=pool_store)
    scores, _ = run.evaluate(test_d, store=test_store)
    rec = {
        "mode": mode,
        "n": n,
        "seed": seed,
        "score": round(scores[metric], 6),
        "val_score": facts["val_score"],
        "epochs": epochs,
        "choices": facts["choices"],
        "seconds": round(time.time() - t0, 2),
        **{k: round(v, 6) for k, v in scores.items()},
    }
    if run.model.head.scalar_mix is not None:
        rec["layer_weights"] = [round(w, 4) for w in run.model.head.layer_weights()]
    return rec


def _summary(runs: list[dict], modes: list[str], usable: list[int]) -> dict[str, dict[int, dict]]:
    """Mean, spread and scores of each mode at each size."""
    summary: dict[str, dict[int, dict]] = {}
    for mode in modes:
        summary[mode] = {}
        for n in usable:
            sc = [r["score"] for r in runs if r["mode"] == mode and r["n"] == n]
            summary[mode][n] = {
                "mean": statistics.fmean(sc),
                "std": statistics.pstdev(sc) if len(sc) > 1 else 0.0,
                "scores": sc,
            }
    return summary


def _at(result: dict, mode: str, n: int) -> dict:
    """The summary of ``mode`` at size ``n`` (its keys are strings in a result read back from curve.json)."""
    s = result["summary"][mode]
    return s[n] if n in s else s[str(n)]


def curve_leads(result: dict) -> dict[int, dict]:
    """Per size: the best transfer mode's mean minus the strongest from-scratch baseline's mean.

    Returns ``{n: {"best", "best_mean", "baseline", "baseline_mean", "lead", "per_seed"}}`` (``per_seed``:
    best minus baseline on each seed's draw) for the sizes where the curve has both a transfer mode and a
    baseline; empty otherwise.  Works on a result read back from ``curve.json`` (string size keys) too.
    """
    base = [m for m in result["modes"] if is_scratch(m)]
    tran = [m for m in result["modes"] if not is_scratch(m)]
    out: dict[int, dict] = {}
    if not base or not tran:
        return out
    for n in result["sizes"]:
        best = max(tran, key=lambda m: _at(result, m, n)["mean"])
        floor = max(base, key=lambda m: _at(result, m, n)["mean"])
        b, f = _at(result, best, n), _at(result, floor, n)
        out[n] = {"best": best, "best_mean": b["mean"], "baseline": floor, "baseline_mean": f["mean"],
                  "lead": b["mean"] - f["mean"], "per_seed": [x - y for x, y in zip(b["scores"], f["scores"])]}
    return out


def leads_text(result: dict) -> str:
    """One line per size: the best mode against the strongest baseline, in points (every headline metric is
    a fraction); empty when there is nothing to compare."""
    lines = [
        f"n={n}: {d['best']} {d['best_mean']:.3f} - {d['baseline']} {d['baseline_mean']:.3f} = "
        f"{100 * d['lead']:+.1f} points"
        for n, d in curve_leads(result).items()
    ]
    return ("best mode against the strongest from-scratch baseline:\n" + "\n".join(lines) + "\n") if lines else ""


def curve_table(result: dict) -> str:
    """The curve as a markdown table: one row per size, one column per mode, ``mean ± std``."""
    modes = result["modes"]
    head = f"| labelled examples | {' | '.join(modes)} |\n|---|" + "---|" * len(modes)
    rows = []
    for n in result["sizes"]:
        cells = []
        for m in modes:
            s = _at(result, m, n)
            cells.append(f"{s['mean']:.3f} ± {s['std']:.3f}")
        rows.append(f"| {n} | {' | '.join(cells)} |")
    return head + "\n" + "\n".join(rows) + "\n"


def write_curve(result: dict, out_dir: str | Path) -> Path:
    """Write ``curve.json``, ``curve.md`` and ``curve.png`` (mean ± std per mode vs size, log x axis)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "curve.json", json.dumps(result, indent=2) + "\n")
    seeds = len(result["seeds"])
    md = (
        f"{result['metric']} on {result['n_test']} examples of {result.get('scored_on', 'the test set')} "
        f"({result['family']}, task {result['task']}), "
        f"mean ± std over {seeds} seed(s)\n\n" + curve_table(result)
    )
    leads = leads_text(result)
    if leads:
        md += "\n" + leads
    atomic_write_text(out / "curve.md", md)
    _plot_curve(result, out / "curve.png")
    return out


def _plot_curve(result: dict, path: Path) -> None:
    """Mean ± std of each mode against the training-set size (log x axis), as a PNG at ``path``."""
    import matplotlib  # optional and slow to import: only a curve that is written needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for m in result["modes"]:
        s = result["summary"][m]
        ns = result["sizes"]
        mean = np.array([s[n]["mean"] for n in ns])
        std = np.array([s[n]["std"] for n in ns])
        ax.plot(ns, mean, marker="o", label=m)
        ax.fill_between(ns, mean - std, mean + std, alpha=0.15)
    ax.set_xscale("log")
    ax.set_xlabel("labelled training examples")
    ax.set_ylabel(result["metric"])
    ax.set_title(f"{result['family']}: {result['task']} learning curve")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
