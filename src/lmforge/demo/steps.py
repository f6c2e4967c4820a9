"""The demo's steps: corpus, tokenizers, shards, pretraining, polysemy, transfer, learning curve.

Each step calls lmforge's public API (``Tokenizer``, ``prepare``, ``pretrain``, ``lmforge.evaluate``,
``run_transfer``, ``learning_curve``) and records what the report needs; the report itself is
:mod:`lmforge.demo.report`.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from ..config import from_dict
from ..data.corpus import builtin_corpus_path
from ..data.shards import Shards, prepare, uncompressed_size
from ..devices import Compute
from ..errors import LmforgeError
from ..evaluate import find_word, load_reference, word_rows
from ..evaluate.polysemy import polysemy_table
from ..evaluate.wic import wic_table
from ..families import FAMILIES, load
from ..storage.files import atomic_write_text, file_sha256, save_json
from ..tokenization import Tokenizer
from ..train.precision import resolve_compute
from ..train.pretrain import default_train_config, pretrain, recipe_in
from ..transfer import learning_curve, run_transfer
from ..transfer.benchmarks import load_benchmark, write_domain_text
from ..transfer.curve import main_metric
from .context import DemoContext, Step, jsonable
from .plan import (
    CURVE,
    CURVE_MODES,
    DOMAIN,
    POLYSEMY_SENTENCES,
    POLYSEMY_WORD,
    TABLE_FAMILY,
    TABLE_MODES,
    TRANSFER_BENCH,
    VAL_FRACTION,
    DemoPlan,
    FamilyPlan,
)
from .report import plot_polysemy, polysemy_highlights, pretrain_line

logger = logging.getLogger(__name__)


# --- corpus ------------------------------------------------------------------------------------------


def corpus_step() -> Step:
    def inputs(ctx: DemoContext) -> dict:
        return {"builtin_sha256": file_sha256(builtin_corpus_path()), "chars": ctx.plan.corpus_chars}

    def build(ctx: DemoContext) -> dict:
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


def corpus_path(ctx: DemoContext) -> Path:
    info = ctx.results["corpus"]
    return Path(info["path"]) if info["builtin"] else ctx.path(info["path"])


def domain_text_step() -> Step:
    """The curve benchmark's unlabelled text, none of it from its test partition (``lmforge benchmark text``)."""

    def inputs(ctx: DemoContext) -> dict:
        return {"bench": CURVE.bench, "lines": ctx.plan.domain_lines}

    def build(ctx: DemoContext) -> dict:
        path = ctx.path(f"{DOMAIN}.txt")
        docs = write_domain_text(CURVE.bench, path, max_docs=ctx.plan.domain_lines)
        return {"path": ctx.rel(path), "sha256": file_sha256(path), "lines": len(docs),
                "chars": sum(len(t) for t in docs), "bench": CURVE.bench}

    def summary(info: dict) -> str:
        return (f"{DOMAIN}: {info['lines']:,} documents of {CURVE.name} ({info['chars']:,} characters, none from "
                f"the test partition) in {info['path']}")

    return Step(f"{DOMAIN}-text", f"write {CURVE.name}, the curve benchmark's unlabelled text (the in-domain corpus)",
                inputs, build, summary, lambda i: [i["path"]], version=2)


def _source(source: str) -> tuple[str, str]:
    """(step that holds the text, shards layout) of ``corpus`` (the built-in corpus) or :data:`DOMAIN` (one
    sentence a line, documents between blank lines, read line by line)."""
    return ("corpus", "auto") if source == "corpus" else (f"{DOMAIN}-text", "lines")


def source_path(ctx: DemoContext, source: str) -> Path:
    return corpus_path(ctx) if source == "corpus" else ctx.path(ctx.results[f"{DOMAIN}-text"]["path"])


# --- tokenizers and shards ----------------------------------------------------------------------------


KIND_LABEL = {"wordpiece": "WordPiece", "bpe": "byte-level BPE"}


def tokenizer_step(plan: DemoPlan, kind: str, source: str = "corpus") -> Step:
    """A ``kind`` tokenizer trained on ``source``: ``tokenizer-<kind>`` on the corpus, ``tokenizer-<source>``
    on the in-domain text; its description names the models of ``plan`` that read it."""
    name = f"tokenizer-{kind if source == 'corpus' else source}"
    text_step, _ = _source(source)

    def vocab_size(ctx: DemoContext) -> int:
        return ctx.plan.vocab_size if source == "corpus" else ctx.plan.domain_vocab_size

    def inputs(ctx: DemoContext) -> dict:
        return {"kind": kind, "vocab_size": vocab_size(ctx), "corpus_sha256": ctx.results[text_step]["sha256"]}

    def build(ctx: DemoContext) -> dict:
        tok = Tokenizer.train([source_path(ctx, source)], kind=kind, vocab_size=vocab_size(ctx))
        out = tok.save(ctx.path(name))
        return {"hash": tok.hash, "vocab_size": tok.vocab_size, "path": ctx.rel(out)}

    def valid(ctx: DemoContext, info: dict) -> bool:
        return Tokenizer.load(ctx.path(info["path"])).hash == info["hash"]

    def summary(info: dict) -> str:
        return f"{kind} tokenizer: {info['vocab_size']} tokens (hash {info['hash'][:12]}) in {info['path']}/"

    readers = [f.label for f in plan.families if f.tokenizer == kind] if source == "corpus" else [plan.domain.label]
    return Step(name, f"train a {KIND_LABEL.get(kind, kind)} ({', '.join(readers)}) tokenizer", inputs, build,
                summary, lambda i: [i["path"]], valid)


def shards_step(kind: str) -> Step:
    """``shards-<kind>``: the corpus through ``tokenizer-<kind>`` (``kind`` :data:`DOMAIN`: the in-domain text)."""
    name = f"shards-{kind}"
    source = kind if kind == DOMAIN else "corpus"
    text_step, layout = _source(source)

    def inputs(ctx: DemoContext) -> dict:
        return {"tokenizer_hash": ctx.results[f"tokenizer-{kind}"]["hash"],
                "corpus_sha256": ctx.results[text_step]["sha256"], "val_fraction": VAL_FRACTION, "layout": layout}

    def build(ctx: DemoContext) -> dict:
        corpus = source_path(ctx, source)
        out = ctx.path(name)
        with ctx.progress(uncompressed_size(corpus), f"prepare {kind}", "B") as update:
            meta = prepare([corpus], ctx.path(ctx.results[f"tokenizer-{kind}"]["path"]), out,
                           val_fraction=VAL_FRACTION, progress=update, layout=layout)
        return {"splits": meta["splits"], "dtype": meta["dtype"], "path": ctx.rel(out),
                "tokenizer_hash": ctx.results[f"tokenizer-{kind}"]["hash"]}

    def valid(ctx: DemoContext, info: dict) -> bool:
        return Shards.open(ctx.path(info["path"])).tokenizer_hash == info["tokenizer_hash"]

    def summary(info: dict) -> str:
        s = info["splits"]
        return (f"{kind} shards: {s['train']['tokens']:,} train / {s['val']['tokens']:,} val tokens, "
                f"{s['train']['documents'] + s['val']['documents']:,} documents ({info['dtype']}) in {info['path']}/")

    return Step(name, f"prepare the corpus into {kind} token shards", inputs, build, summary,
                lambda i: [i["path"]], valid)


# --- pretraining -------------------------------------------------------------------------------------


def pretrain_step(model: FamilyPlan) -> Step:
    """``pretrain-<key>`` of ``model``: a family's general-corpus model or the in-domain one; what it trains is
    the run's plan's model of that key (its step counts scaled to the budget)."""
    key = model.key

    def inputs(ctx: DemoContext) -> dict:
        fp = ctx.plan.family(key)
        shards = ctx.results[f"shards-{fp.tokenizer}"]
        return jsonable({"config": fp.config, "train": fp.train, **compute_inputs(ctx),
                         "shards": {"tokenizer_hash": shards["tokenizer_hash"], "splits": shards["splits"]}})

    def outputs(info: dict) -> list[str]:
        return [info["path"] + "/model.safetensors", info["path"] + "/config.json"]

    def valid(ctx: DemoContext, info: dict) -> bool:
        return file_sha256(ctx.path(info["path"], "model.safetensors")) == info["weights_sha256"]

    def summary(info: dict) -> str:
        return f"{model.label}: {pretrain_line(info)}"

    return Step(f"pretrain-{key}", f"pretrain {model.description}", inputs, lambda ctx: pretrain_model(ctx, key),
                summary, outputs, valid, version=3)


def pretrain_model(ctx: DemoContext, key: str) -> dict:
    """Pretrain the plan's model ``key`` into ``models/<key>`` (afresh) and return what the report needs of it."""
    fp = ctx.plan.family(key)
    out = ctx.path("models", key)
    if out.exists():  # an older or unfinished model of other inputs: start afresh
        shutil.rmtree(out)
    cfg_file = ctx.path("configs", f"{key}.json")
    cfg_file.parent.mkdir(parents=True, exist_ok=True)
    save_json({"model_type": fp.family, **fp.config}, cfg_file)
    t0 = time.monotonic()
    recipe = recipe_in(fp.family, fp.config)
    recipe_keys = {f.name for f in dataclasses.fields(recipe)} if recipe is not None else set()
    model = from_dict(FAMILIES[fp.family].config_class, {k: v for k, v in fp.config.items() if k not in recipe_keys})
    compute = {k: v for k, v in (("device", ctx.device), ("precision", ctx.precision_asked)) if v is not None}
    train = default_train_config(fp.family, **{**fp.train, **compute}) if FAMILIES[fp.family].trainer else None
    res = pretrain(fp.family, ctx.path(f"shards-{fp.tokenizer}"), out, model, train, recipe, progress=ctx.show_bars,
                   compute=run_compute(ctx) if train is not None else None)
    seconds = time.monotonic() - t0
    params = sum(p.numel() for p in load(out).parameters())  # the folder must open as a model
    curves = out / "training_curves.png"
    return {
        "path": ctx.rel(out),
        "weights_sha256": file_sha256(out / "model.safetensors"),
        "params": params,
        "step": res.step,
        "epochs": fp.config.get("epochs") if res.step is None else None,
        "stop_reason": res.stop_reason,
        "val": {k: float(v) for k, v in res.val.items()},
        "val_order": list(res.val),  # the model's own order (the state file sorts keys)
        "first_train_loss": first_train_loss(out / "metrics.jsonl"),
        "train_loss": res.train_loss,
        "tokens_seen": res.tokens_seen,
        "seconds": round(seconds, 1),
        "train_seconds": round(res.elapsed, 2) if res.elapsed is not None else None,
        "sec_per_step": round(res.elapsed / res.step, 5) if res.elapsed and res.step else None,
        "curves": ctx.rel(curves) if curves.is_file() else None,
    }


def first_train_loss(metrics_path: Path) -> float | None:
    """The first training loss logged in a model folder's ``metrics.jsonl`` (``None`` without one)."""
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


# --- polysemy and word-in-context ---------------------------------------------------------------------


def models_inputs(ctx: DemoContext) -> dict:
    """The weights of the plan's general-corpus models (what the polysemy and transfer tables compare)."""
    return {f.key: ctx.results[f"pretrain-{f.key}"]["weights_sha256"] for f in ctx.plan.families}


def load_models(ctx: DemoContext) -> list[tuple[str, Any]]:
    """(label, model) of each of the plan's general-corpus models, in the plan's order."""
    return [(f.label, load(ctx.path(ctx.results[f"pretrain-{f.key}"]["path"]))) for f in ctx.plan.families]


def polysemy_step() -> Step:
    def inputs(ctx: DemoContext) -> dict:
        return {"models": models_inputs(ctx), "word": POLYSEMY_WORD, "sentences": list(POLYSEMY_SENTENCES),
                "wic_pairs": ctx.plan.wic_pairs, "reference": ctx.plan.reference}

    def build(ctx: DemoContext) -> dict:
        models = load_models(ctx)
        reference = None
        if ctx.plan.reference:
            try:
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
        return "polysemy: " + "; ".join(polysemy_highlights(info))

    return Step("polysemy", "compare 'python' across contexts and score word-in-context pairs", inputs, build,
                summary, lambda i: ["polysemy.json", i["plot"]], version=2)


def word_pieces(tokenizer, sentence: str, word: str) -> list[str]:
    """The tokens of ``sentence`` that make up the first occurrence of ``word`` (the polysemy tools' matcher)."""
    span = find_word(sentence, word)
    if span is None:
        return []
    _, tokens, offsets = tokenizer.encode_with_offsets(sentence)
    return [tokens[i] for i in word_rows(offsets, span, sentence)]


# --- transfer ----------------------------------------------------------------------------------------


def compute_inputs(ctx: DemoContext) -> dict:
    """Where and in which precision a training step computes (part of its inputs: another choice rebuilds it)."""
    return {"device": run_compute(ctx).device.type, "precision": ctx.precision}


def run_compute(ctx: DemoContext) -> Compute:
    """The run's device and precision, resolved once (:func:`lmforge.demo.run.run_demo` resolves them first)."""
    if ctx.compute is None:
        ctx.compute = resolve_compute(ctx.device, ctx.precision_asked)
    return ctx.compute


def transfer_options(ctx: DemoContext) -> dict:
    """What every transfer run is given: the plan's sizes, the features cache, the device and the precision; the
    rest are defaults."""
    return {**ctx.plan.transfer, "cache_dir": str(ctx.path("features-cache")), "device": ctx.device,
            "precision": ctx.precision_asked}


def transfer_step() -> Step:
    """The transfer table: :data:`TABLE_FAMILY`'s model in each of :data:`TABLE_MODES`, every other family's in
    ``features`` mode (the run's plan's general-corpus models)."""

    def inputs(ctx: DemoContext) -> dict:
        p = ctx.plan
        return jsonable({"models": models_inputs(ctx), "bench": TRANSFER_BENCH, "n_train": p.n_train,
                         "n_test": p.n_test, "transfer": p.transfer, **compute_inputs(ctx)})

    def build(ctx: DemoContext) -> dict:
        p = ctx.plan
        train, test = load_benchmark(TRANSFER_BENCH, p.n_train, p.n_test, seed=0)
        metric = main_metric(train)
        opts = transfer_options(ctx)
        # fine-tuned and from scratch are the learning curve's (several seeds and sizes); this table compares
        # what the frozen bodies give: TABLE_FAMILY's frozen modes and every other family's features
        runs: list[tuple[str, str, str, dict]] = [  # (row name, model key, mode, options)
            *[(mode, TABLE_FAMILY, mode, opts) for mode in TABLE_MODES],
            *[(f"features ({f.label})", f.key, "features", opts) for f in p.families if f.key != TABLE_FAMILY],
        ]
        rows = []
        with ctx.progress(len(runs), "transfer", "run") as update:
            for row, fam, mode, o in runs:
                model_dir = ctx.path(ctx.results[f"pretrain-{fam}"]["path"])
                run_dir = ctx.path("transfer", f"{fam}-{row.split(' ')[0]}")
                m = run_transfer(model_dir, "classify", train, test, mode=mode, out_dir=run_dir,
                                 compute=run_compute(ctx), **o)
                rows.append({"name": row, "family": fam, "mode": mode, "from_scratch": bool(o.get("from_scratch")),
                             "score": m[metric], "macro_f1": m.get("macro_f1"), "epochs": m.get("epochs"),
                             "lr": m.get("lr"), "train_seconds": m["train_seconds"], "run_dir": ctx.rel(run_dir)})
                logger.info("transfer %s %s: %s %.4f (%.0fs)", p.label(fam), row, metric, m[metric],
                            m["train_seconds"])
                update(1)
        counts = {lab: sum(ex.label == lab for ex in train.examples) for lab in train.labels}
        info = {"bench": TRANSFER_BENCH, "metric": metric, "n_train": len(train), "n_test": len(test),
                "labels": train.labels, "train_counts": counts, "rows": rows}
        atomic_write_text(ctx.path("transfer", "results.json"), json.dumps(info, indent=2) + "\n")
        return info

    def summary(info: dict) -> str:
        return "tweet sentiment: " + ", ".join(f"{r['name']} {100 * r['score']:.1f}%" for r in info["rows"])

    return Step("transfer", f"transfer to English tweet sentiment: {FAMILIES[TABLE_FAMILY].label} frozen and "
                            "features, every family's features", inputs, build, summary,
                lambda i: ["transfer/results.json"], version=3)


def curve_step(plan: DemoPlan) -> Step:
    """The learning curve of the in-domain model against scratch (``plan`` names it in the description)."""

    def inputs(ctx: DemoContext) -> dict:
        p = ctx.plan
        return jsonable({"model": ctx.results[f"pretrain-{p.domain.key}"]["weights_sha256"], "bench": CURVE.bench,
                         "sizes": p.curve_sizes, "seeds": p.curve_seeds, "min_steps": p.curve_min_steps,
                         "n_test": p.n_test, "transfer": p.transfer, "modes": CURVE_MODES, **compute_inputs(ctx)})

    def build(ctx: DemoContext) -> dict:
        p = ctx.plan
        pool, test = load_benchmark(CURVE.bench, max(p.curve_sizes), p.n_test, seed=0)
        kwargs = {} if p.curve_min_steps is None else {"min_steps": p.curve_min_steps}
        with ctx.progress(len(p.curve_sizes) * len(p.curve_seeds) * len(CURVE_MODES), "learning curve",
                          "run") as update:
            def line(text: str) -> None:
                logger.info("learning curve: %s", text)
                update(1)

            result = learning_curve(ctx.path(ctx.results[f"pretrain-{p.domain.key}"]["path"]), pool.task, pool, test,
                                    sizes=list(p.curve_sizes), seeds=list(p.curve_seeds), modes=list(CURVE_MODES),
                                    out_dir=ctx.path("curve"), progress=line, compute=run_compute(ctx), **kwargs,
                                    **transfer_options(ctx))
        return {"sizes": result["sizes"], "modes": result["modes"], "metric": result["metric"],
                "n_test": result["n_test"], "seeds": result["seeds"], "bench": CURVE.bench, "task": pool.task,
                "summary": {m: {str(n): s for n, s in v.items()} for m, v in result["summary"].items()},
                "model": p.domain.key, "seconds": result["seconds"], "plot": "curve/curve.png",
                "table": "curve/curve.md"}

    def summary(info: dict) -> str:
        n = info["sizes"][-1]
        cells = ", ".join(f"{m} {100 * info['summary'][m][str(n)]['mean']:.1f}" for m in info["modes"])
        return f"learning curve ({info['metric']}) at n={info['sizes']}: at {n} labels {cells}"

    return Step("curve", f"learning curve of the {plan.domain.label} on {CURVE.bench} ({CURVE.task}): scratch vs "
                         f"each mode by labelled {CURVE.unit}s", inputs, build, summary,
                lambda i: ["curve/curve.json", i["plot"]], version=5)
