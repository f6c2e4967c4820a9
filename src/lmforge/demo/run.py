"""The demo's step list and its runner, :func:`run_demo`."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

from ..cpu_quota import hold_threads
from ..errors import LmforgeError
from ..train.config import parse_duration
from ..train.precision import resolve_device, resolve_precision
from .context import REPORT_FILE, DemoContext, ProgressFactory, Step, jsonable, no_progress
from .packages import missing_packages, plan_without
from .plan import DEFAULT_OUT, DEMO_PRECISION, DOMAIN, FULL, QUICK_OUT, DemoPlan, make_plan
from .report import highlights, machine_line, report_step
from .steps import (
    corpus_step,
    curve_step,
    domain_text_step,
    polysemy_step,
    pretrain_step,
    shards_step,
    tokenizer_step,
    transfer_step,
)

logger = logging.getLogger(__name__)



def plan_steps(plan: DemoPlan) -> list[Step]:
    """The steps of a demo run of ``plan``, in order: the corpus, a tokenizer and shards per tokenizer kind its
    general-corpus models read, the in-domain text with its own tokenizer and shards, one pretraining per model,
    polysemy, transfer, the learning curve and the report (the transfer and the curve's steps as the plan says)."""
    domain = [domain_text_step(), tokenizer_step(plan, plan.domain_kind, source=DOMAIN), shards_step(DOMAIN)]
    return [
        corpus_step(),
        *[tokenizer_step(plan, kind) for kind in plan.tokenizer_kinds],
        *[shards_step(kind) for kind in plan.tokenizer_kinds],
        *(domain if plan.curve else []),
        *[pretrain_step(model) for model in plan.models],
        polysemy_step(),
        *([transfer_step()] if plan.transfer_table else []),
        *([curve_step(plan)] if plan.curve else []),
        report_step(),
    ]


STEPS: list[Step] = plan_steps(FULL)  # the full plan's steps (the quick plan trains the same models)


@dataclasses.dataclass
class StepReport:
    """What happened to one step: its summary line, whether it was reused, and the seconds it took now."""

    name: str
    summary: str
    reused: bool
    seconds: float = 0.0


@dataclasses.dataclass
class DemoResult:
    """What :func:`run_demo` returns.

    Attributes:
        out: the demo folder; report: its ``report.md``.
        steps: one :class:`StepReport` per step.
        results: each step's recorded info.
        elapsed: seconds of this run.
        highlights: a few lines of headline figures for the terminal.
        left_out: one line per missing optional package: what the run left out and how to add it.
    """

    out: Path
    report: Path
    steps: list[StepReport]
    results: dict[str, dict]
    elapsed: float
    highlights: list[str]
    left_out: list[str] = dataclasses.field(default_factory=list)


def run_demo(
    out: str | Path | None = None,
    quick: bool = False,
    budget: float | str | None = None,
    steps: list[Step] | None = None,
    progress: ProgressFactory | None = None,
    show_bars: bool | None = None,
    on_step: Callable[[int, int, Step], None] | None = None,
    on_done: Callable[[StepReport], None] | None = None,
    force: bool = False,
    device: str = "auto",
    precision: str = DEMO_PRECISION,
    plan: DemoPlan | None = None,
) -> DemoResult:
    """Run the demo steps in order, reusing what an earlier run built from the same inputs.

    Args:
        out: the demo folder (default ``lmforge-demo``, or ``lmforge-demo-quick`` with ``quick``).
        quick: tiny models, a slice of the corpus, a few steps each: the whole lineage in about a minute.
        budget: scales every model's fixed step count (seconds or ``"30m"``; the full plan is sized for
            15 minutes, the quick one for 3): ``30m`` trains twice the steps.  No step stops by time.
        steps: the steps to run (default: :func:`plan_steps` of the plan).
        progress: progress-bar factory for long steps (see :data:`ProgressFactory`).
        show_bars: the Trainer's own progress bars (``None``: only on a terminal).
        on_step: called as ``on_step(i, n, step)`` before step ``i`` (1-based) of ``n``.
        on_done: called with each step's :class:`StepReport`.
        force: rebuild everything.
        device: where the models train (``auto``, ``cpu``, ``cuda``, ``cuda:N``).
        precision: ``fp32`` (the default: the figures depend only on the plan, the corpus, the seeds and the CPU
            kind), ``auto`` (bf16 for a model where a timed probe finds it faster), ``bf16`` or ``fp16``; the
            resolved choice is part of every training step's inputs.
        plan: a plan of one's own (other models or sizes, e.g. ``dataclasses.replace(QUICK, ...)``); default
            ``make_plan(quick, budget)``, and ``budget`` scales a given plan.
    Returns:
        A :class:`DemoResult`.
    """
    if plan is None:
        plan = make_plan(quick, budget)
    elif budget is not None:
        plan = plan.with_budget(parse_duration(budget))
    missing = missing_packages()  # the demo runs without what a missing optional package feeds
    plan = plan_without(plan, missing)
    left_out = list(dict.fromkeys(p.note() for p in missing))
    folder = Path(out if out is not None else (QUICK_OUT if quick else DEFAULT_OUT))
    if folder.exists() and not folder.is_dir():
        raise LmforgeError(f"--out {folder} is a file; give a folder for the demo")
    folder.mkdir(parents=True, exist_ok=True)
    resolved = _resolved_precision(device, precision)
    held = hold_threads()  # one thread count for the whole run, the one report.md names: the figures repeat
    if held:
        logger.info("%s; the demo keeps this count to its end", held)
    ctx = DemoContext(folder, plan, progress or no_progress, show_bars, device=device, precision=resolved,
                      precision_asked=precision, machine=machine_line(resolved), left_out=left_out)
    logger.info("the demo computes on %s", ctx.machine)
    steps = plan_steps(plan) if steps is None else steps
    reports = []
    for i, step in enumerate(steps, 1):
        if on_step:
            on_step(i, len(steps), step)
        logger.debug("demo step %d/%d: %s", i, len(steps), step.name)
        report = _run_step(ctx, step, force)
        reports.append(report)
        if on_done:
            on_done(report)
    return DemoResult(folder, folder / REPORT_FILE, reports, dict(ctx.results), ctx.elapsed,
                      highlights(ctx.results, plan), left_out)


def _resolved_precision(device: str, precision: str) -> str:
    """The precision the training steps record: ``--precision`` resolved for the device."""
    resolved = resolve_precision(precision, resolve_device(device))
    if precision == "auto" and resolved == "bf16" and resolve_device(device).type == "cpu":
        return "precision auto (fp32 or bf16 for each model, as measured)"  # train/precision.py decides per model
    return resolved


def _run_step(ctx: DemoContext, step: Step, force: bool) -> StepReport:
    """Reuse ``step``'s recorded info when its inputs are unchanged (and not ``force``), else build and record it."""
    t0 = time.monotonic()
    inputs = jsonable({"version": step.version, **step.inputs(ctx)})
    info = None if force else step.reusable(ctx, inputs)
    reused = info is not None
    if info is None:
        info = step.build(ctx)
        info["_seconds"] = round(time.monotonic() - t0, 1)
        info["_machine"] = ctx.machine  # where this step's figures were made
        info = jsonable(info)
        ctx.record(step.name, inputs, info)
    else:
        ctx.results[step.name] = info
    return StepReport(step.name, step.summary(info), reused, time.monotonic() - t0)
