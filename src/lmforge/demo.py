"""``lmforge demo``: the whole lineage on the built-in corpus, as a list of steps.

Each step is a :class:`Step` with a ``run(ctx) -> str`` function that builds one thing under the demo
folder and returns a one-line summary, and a ``done(ctx) -> str | None`` check that returns a
summary when a previous run already built it with the same inputs (so a second ``lmforge demo``
reuses its work). Later issues append model steps to :data:`STEPS`.

Built so far: a WordPiece and a byte-level BPE tokenizer trained on the built-in corpus, and the
corpus prepared into token shards with each of them.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import LmforgeError
from .utils import atomic_write_text, file_sha256

logger = logging.getLogger(__name__)

DEFAULT_OUT = "lmforge-demo"
VOCAB_SIZE = {"wordpiece": 8192, "bpe": 8192}
VAL_FRACTION = 0.05
STATE_FILE = "demo_state.json"

# progress(total, desc) -> a context manager whose value is an ``update(n)`` callable
ProgressFactory = Callable[[int | None, str], contextlib.AbstractContextManager]


@contextlib.contextmanager
def _no_progress(total: int | None, desc: str):
    yield lambda n: None


@dataclass
class DemoContext:
    """What the steps share: the output folder, the corpus, progress reporting and the results so far."""

    out: Path
    corpus: Path
    progress: ProgressFactory = _no_progress
    results: dict[str, dict] = field(default_factory=dict)
    _corpus_hash: str | None = None

    @property
    def corpus_hash(self) -> str:
        if self._corpus_hash is None:
            self._corpus_hash = file_sha256(self.corpus)
        return self._corpus_hash

    def path(self, name: str) -> Path:
        return self.out / name

    # The state file records each step's inputs and outputs, so a rerun can tell what is reusable.
    def load_state(self) -> dict:
        p = self.out / STATE_FILE
        if not p.is_file():
            return {}
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def record(self, step: str, info: dict) -> None:
        state = self.load_state()
        state[step] = info
        atomic_write_text(self.out / STATE_FILE, json.dumps(state, indent=2, sort_keys=True) + "\n")
        self.results[step] = info


@dataclass
class Step:
    """One demo step: ``run`` builds and returns a summary line; ``done`` returns one if already built."""

    name: str
    description: str
    run: Callable[[DemoContext], str]
    done: Callable[[DemoContext], str | None] = lambda ctx: None


# --- tokenizers ---------------------------------------------------------------------------------


def _tokenizer_inputs(ctx: DemoContext, kind: str) -> dict:
    return {"kind": kind, "vocab_size": VOCAB_SIZE[kind], "corpus_sha256": ctx.corpus_hash}


def _tokenizer_summary(kind: str, tok, out: Path) -> str:
    return f"{kind} tokenizer: {tok.vocab_size} tokens (hash {tok.hash[:12]}) in {out}"


def _tokenizer_step(kind: str) -> Step:
    name = f"tokenizer-{kind}"

    def done(ctx: DemoContext) -> str | None:
        from .tokenization import Tokenizer

        info = ctx.load_state().get(name)
        if not info or info.get("inputs") != _tokenizer_inputs(ctx, kind):
            return None
        try:
            tok = Tokenizer.load(ctx.path(name))
        except LmforgeError:
            return None
        if tok.hash != info.get("hash"):
            return None
        ctx.results[name] = info
        return _tokenizer_summary(kind, tok, ctx.path(name))

    def run(ctx: DemoContext) -> str:
        from .tokenization import Tokenizer

        tok = Tokenizer.train([ctx.corpus], kind=kind, vocab_size=VOCAB_SIZE[kind])
        out = tok.save(ctx.path(name))
        ctx.record(name, {"inputs": _tokenizer_inputs(ctx, kind), "hash": tok.hash, "vocab_size": tok.vocab_size,
                          "path": str(out)})
        return _tokenizer_summary(kind, tok, out)

    label = "WordPiece (BERT)" if kind == "wordpiece" else "byte-level BPE (GPT)"
    return Step(name, f"train a {label} tokenizer on the built-in corpus", run, done)


# --- shards -------------------------------------------------------------------------------------


def _shards_summary(kind: str, meta: dict, out: Path) -> str:
    s = meta["splits"]
    return (f"{kind} shards: {s['train']['tokens']:,} train / {s['val']['tokens']:,} val tokens, "
            f"{s['train']['documents'] + s['val']['documents']:,} documents ({meta['dtype']}) in {out}")


def _shards_step(kind: str) -> Step:
    name = f"shards-{kind}"
    tok_name = f"tokenizer-{kind}"

    def inputs(ctx: DemoContext) -> dict:
        return {"tokenizer_hash": ctx.results[tok_name]["hash"], "corpus_sha256": ctx.corpus_hash,
                "val_fraction": VAL_FRACTION}

    def done(ctx: DemoContext) -> str | None:
        from .data.shards import Shards

        info = ctx.load_state().get(name)
        if not info or tok_name not in ctx.results or info.get("inputs") != inputs(ctx):
            return None
        try:
            shards = Shards.open(ctx.path(name))
        except LmforgeError:
            return None
        if shards.tokenizer_hash != ctx.results[tok_name]["hash"]:
            return None
        ctx.results[name] = info
        return _shards_summary(kind, shards.meta, ctx.path(name))

    def run(ctx: DemoContext) -> str:
        from .data.shards import prepare, uncompressed_size

        out = ctx.path(name)
        with ctx.progress(uncompressed_size(ctx.corpus), f"prepare {kind}") as update:
            meta = prepare([ctx.corpus], ctx.path(tok_name), out, val_fraction=VAL_FRACTION, progress=update)
        ctx.record(name, {"inputs": inputs(ctx), "splits": meta["splits"], "path": str(out)})
        return _shards_summary(kind, meta, out)

    return Step(name, f"prepare the built-in corpus into {kind} token shards", run, done)


STEPS: list[Step] = [
    _tokenizer_step("wordpiece"),
    _tokenizer_step("bpe"),
    _shards_step("wordpiece"),
    _shards_step("bpe"),
]


@dataclass
class StepReport:
    name: str
    summary: str
    reused: bool


def run_demo(
    out: str | Path = DEFAULT_OUT,
    steps: list[Step] | None = None,
    progress: ProgressFactory | None = None,
    on_step: Callable[[int, int, Step], None] | None = None,
    on_done: Callable[[StepReport], None] | None = None,
    force: bool = False,
) -> list[StepReport]:
    """Run the demo steps in order, reusing what an earlier run built with the same inputs.

    Args:
        out: the demo folder.
        steps: the steps to run (default :data:`STEPS`).
        progress: progress-bar factory for long steps (see :data:`ProgressFactory`).
        on_step: called as ``on_step(i, n, step)`` before step ``i`` (1-based) of ``n``.
        on_done: called with each step's :class:`StepReport`.
        force: rebuild everything.
    Returns:
        One report per step.
    """
    from .data.corpus import builtin_corpus_path

    ctx = DemoContext(Path(out), builtin_corpus_path(), progress or _no_progress)
    ctx.out.mkdir(parents=True, exist_ok=True)
    steps = STEPS if steps is None else steps
    reports = []
    for i, step in enumerate(steps, 1):
        if on_step:
            on_step(i, len(steps), step)
        logger.debug("demo step %d/%d: %s", i, len(steps), step.name)
        summary = None if force else step.done(ctx)
        report = StepReport(step.name, summary, True) if summary else StepReport(step.name, step.run(ctx), False)
        reports.append(report)
        if on_done:
            on_done(report)
    return reports
