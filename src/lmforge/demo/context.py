"""What the demo's steps share: :class:`DemoContext` (folder, plan, results, the state file) and :class:`Step`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..devices import Compute
from ..errors import LmforgeError
from ..storage.files import atomic_write_text
from .plan import DemoPlan

STATE_FILE = "demo_state.json"
REPORT_FILE = "report.md"

# progress(total, desc, unit) -> a context manager whose value is an ``update(n)`` callable
ProgressFactory = Callable[..., contextlib.AbstractContextManager]


@contextlib.contextmanager
def no_progress(total: int | None, desc: str, unit: str = "it"):
    yield lambda n=1: None


@dataclasses.dataclass
class DemoContext:
    """What the steps share: the folder, the plan, progress reporting and the results so far.

    Attributes:
        out: the demo folder.
        plan: the sizes of this run.
        progress: progress-bar factory for long steps (``progress(total, desc, unit)``).
        show_bars: the Trainer's progress bars (``None``: only on a terminal).
        device: the ``--device`` of the training steps (``auto``, ``cpu``, ``cuda``, ``cuda:N``).
        precision: the resolved precision of the training steps (``fp32``, ``bf16`` or ``fp16``): part of
            their inputs, so a run in another precision rebuilds them.
        precision_asked: the ``--precision`` as given (``auto`` ...), what the training calls are passed.
        machine: one line naming where this run computes (CPU model and flags, threads, torch, the code's
            commit or version, the precision); every step built in this run records it.
        left_out: one line per missing optional package: what this run leaves out and how to add it.
        compute: ``device`` and ``precision_asked`` resolved once for the run (default: resolved on first use).
        results: each finished (or reused) step's ``info``, by step name.
        started: ``time.monotonic()`` at the start of the run.
    """

    out: Path
    plan: DemoPlan
    progress: ProgressFactory = no_progress
    show_bars: bool | None = None
    device: str = "auto"
    precision: str = "fp32"
    precision_asked: str = "auto"
    machine: str = ""
    left_out: list[str] = dataclasses.field(default_factory=list)
    compute: Compute | None = None
    results: dict[str, dict] = dataclasses.field(default_factory=dict)
    started: float = dataclasses.field(default_factory=time.monotonic)

    def path(self, *parts: str) -> Path:
        return self.out.joinpath(*parts)

    def rel(self, p: str | Path) -> str:
        """``p`` relative to the demo folder (how the state and the report name files)."""
        try:
            return Path(p).resolve().relative_to(self.out.resolve()).as_posix()
        except ValueError:
            return str(p)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    # The state file records each step's inputs and outputs, so a rerun can tell what is reusable.
    def load_state(self) -> dict:
        p = self.out / STATE_FILE
        if not p.is_file():
            return {}
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def record(self, step: str, inputs: dict, info: dict) -> None:
        state = self.load_state()
        state[step] = {"inputs": inputs, "info": info}
        atomic_write_text(self.out / STATE_FILE, json.dumps(state, indent=2, sort_keys=True) + "\n")
        self.results[step] = info


@dataclasses.dataclass
class Step:
    """One demo step.

    Attributes:
        name: key in ``demo_state.json`` and in ``ctx.results``.
        description: one line shown before it runs.
        inputs: ``inputs(ctx) -> dict`` of everything the output depends on (JSON-able).
        build: ``build(ctx) -> info`` builds the output and returns what the later steps and the report need.
        summary: ``summary(info) -> str``, one line for the terminal.
        outputs: ``outputs(info) -> [paths relative to the demo folder]`` that must exist for a reuse.
        valid: optional deeper check of a recorded output (e.g. the tokenizer's hash).
        version: part of the inputs; bump it when the step's code changes what it builds.
    """

    name: str
    description: str
    inputs: Callable[[DemoContext], dict]
    build: Callable[[DemoContext], dict]
    summary: Callable[[dict], str]
    outputs: Callable[[dict], list[str]] = lambda info: []
    valid: Callable[[DemoContext, dict], bool] | None = None
    version: int = 1

    def reusable(self, ctx: DemoContext, inputs: dict) -> dict | None:
        """The recorded info when a previous run built this step from the same inputs, else None."""
        rec = ctx.load_state().get(self.name)
        if not rec or rec.get("inputs") != inputs or "info" not in rec:
            return None
        info = rec["info"]
        if not all(ctx.path(p).exists() for p in self.outputs(info)):
            return None
        try:
            if self.valid is not None and not self.valid(ctx, info):
                return None
        except LmforgeError:
            return None
        return info


def jsonable(x: Any) -> Any:
    """Round-trip through JSON so that recorded and freshly computed inputs compare equal."""
    return json.loads(json.dumps(x, sort_keys=True))
