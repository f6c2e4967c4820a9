"""The sizes of a demo run: :data:`FULL` and :data:`QUICK`, and :func:`make_plan`.

Every model trains a fixed number of optimizer steps (word2vec a fixed number of epochs): a demo run
is a function of (plan, corpus, seeds), whatever the machine's load, so its figures reproduce.
``--budget`` only scales the step counts (``30m`` doubles those of the 15-minute :data:`FULL` plan).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from ..errors import LmforgeError
from ..families import FAMILIES
from ..train.config import parse_duration

DEFAULT_OUT = "lmforge-demo"
QUICK_OUT = "lmforge-demo-quick"
DEFAULT_BUDGET = 15 * 60.0  # seconds: what the FULL plan's step counts are sized for (2 CPU cores)
VAL_FRACTION = 0.05
# fp32 unless --precision says otherwise: --precision auto decides bf16 per model by a timed probe, and a probe near
# its margin can decide either way on a fresh machine, so the figures would follow the machine's load
DEMO_PRECISION = "fp32"
POLYSEMY_WORD = "python"
POLYSEMY_SENTENCES = ("He got bit by Python.", "Python is my favorite programming language.")
TRANSFER_BENCH = "en-tweets"  # the transfer table: what every general-corpus model's frozen body gives


@dataclasses.dataclass(frozen=True)
class InDomain:
    """The learning curve's benchmark, whose own unlabelled text (never its test partition) trains the
    in-domain model.

    Attributes:
        bench: the benchmark (``lmforge benchmark text|curve NAME``).
        key: names its files and steps (``<key>.txt``, ``tokenizer-<key>``, ``shards-<key>``, ``<family>-<key>``).
        name: the text in labels and prose (``People's Daily``).
        text: what its unlabelled text is, in the report's words.
        unit: one labelled example (``sentence``, ``tweet``).
        task: the labelled task, in words.
        why: why the demo's learning curve is on this benchmark.
    """

    bench: str
    key: str
    name: str
    text: str
    unit: str
    task: str
    why: str


# The learning curve runs where a few CPU-minutes of in-domain pretraining measurably beat scratch.  On tweet
# sentiment they do not (docs/results/README.md: within the seed-to-seed spread at 300 tweets, with BERT and with
# ELECTRA); on Chinese NER, where a model from scratch must learn every character's use from a few hundred
# sentences, they do.
CURVE = InDomain(
    bench="zh-ner", key="peoples-daily", name="People's Daily",
    text="the People's Daily sentences of the NER benchmark's training side (`lmforge benchmark text zh-ner`)",
    unit="sentence", task="Chinese named entities (person, place, organisation) in People's Daily",
    why="entity tagging from a few hundred labelled sentences is where pretraining on the task's own text shows "
        "within a demo's minutes: a model from scratch must learn every character from the labels alone (on "
        "English tweet sentiment a few minutes of pretraining stay within the seed-to-seed spread of scratch; "
        "docs/results/README.md)",
)
DOMAIN = CURVE.key  # the in-domain corpus: the curve benchmark's own unlabelled text
DOMAIN_FAMILY = "bert"  # the family pretrained on it: one of _DOMAIN_FAMILIES
DOMAIN_MODEL = f"{DOMAIN_FAMILY}-{DOMAIN}"  # the model pretrained on it: the learning curve's model
TABLE_FAMILY = "bert"  # the general-corpus model the transfer table shows in every frozen mode (the others: features)
CURVE_MODES = ("scratch", "features", "finetune")  # the in-domain model fine-tuned vs from scratch: several seeds
TABLE_MODES = ("frozen", "features")  # TABLE_FAMILY's rows of the transfer table (beside every family's features)

# The families the demo can pretrain on the in-domain text: what each adds to the general BERT's shape, and its
# objective in the report's words.  BERT learns by MLM only (the in-domain text is one sentence a line: no pairs);
# ELECTRA's discriminator keeps BERT's shape, its embeddings as wide as its hidden states.
_DOMAIN_FAMILIES = {
    "bert": (lambda shape: {"next_sentence": False}, "MLM only"),
    "electra": (lambda shape: {"embedding_size": shape["hidden_size"]}, "replaced-token detection"),
}


@dataclasses.dataclass(frozen=True)
class FamilyPlan:
    """How the demo pretrains one model.

    Attributes:
        family: a family of the registry (``word2vec``, ``elmo``, ``gpt``, ``bert``, ``electra``).
        tokenizer: which shards it reads: ``wordpiece`` or ``bpe`` (the general corpus) or :data:`DOMAIN`.
        config: model config fields, and the data recipe's for BERT and ELECTRA (written together to
            ``configs/<key>.json``; ``pretrain`` gets them apart).
        train: TrainConfig fields (``--set`` overrides, ``max_steps`` included); empty for word2vec.
        name: the model's key when it is not the family's general-corpus model (:data:`DOMAIN_MODEL`).
        objective: what it learns from, in the report's words (``MLM only``, ``replaced-token detection``).
    """

    family: str
    tokenizer: str
    config: dict
    train: dict = dataclasses.field(default_factory=dict)
    name: str = ""
    objective: str = ""

    @property
    def key(self) -> str:
        """``models/<key>``, ``configs/<key>.json`` and the step ``pretrain-<key>``."""
        return self.name or self.family

    @property
    def family_label(self) -> str:
        """The family as reports name it (``BERT``), from the registry."""
        return FAMILIES[self.family].label

    @property
    def label(self) -> str:
        """The model as reports name it: the family's label, and for a named model the corpus it reads
        (``BERT (People's Daily)``)."""
        return f"{self.family_label} ({self.corpus})" if self.name else self.family_label

    @property
    def corpus(self) -> str:
        """The text it reads, in prose: the in-domain corpus's name, else its shards' tokenizer kind."""
        return CURVE.name if self.tokenizer == DOMAIN else self.tokenizer

    @property
    def description(self) -> str:
        """What its pretraining step says it builds: ``a BERT (MLM + NSP)``, ``a BERT on People's Daily (MLM only)``."""
        what = f"{'an' if self.family_label[0] in 'AEIOU' else 'a'} {self.family_label}"
        if self.name:
            what += f" on {self.corpus}"
        return f"{what} ({self.objective})" if self.objective else what

    def scaled(self, factor: float) -> FamilyPlan:
        """The same plan with ``factor`` times the steps (word2vec: epochs), at least one."""
        if factor == 1.0:
            return self
        if "max_steps" in self.train:
            return dataclasses.replace(self, train={**self.train, "max_steps": max(1, round(self.train["max_steps"]
                                                                                          * factor))})
        if "epochs" in self.config:
            return dataclasses.replace(self, config={**self.config, "epochs": max(1, round(self.config["epochs"]
                                                                                         * factor))})
        return self


@dataclasses.dataclass(frozen=True)
class DemoPlan:
    """Everything that sizes a demo run; two instances exist: :data:`FULL` and :data:`QUICK`.

    Attributes:
        name: ``full`` or ``quick``.
        budget: the wall-clock time (seconds, on 2 CPU cores) the step counts are sized for; nothing stops
            at it: :func:`make_plan` scales the step counts by ``budget / reference``.
        corpus_chars: ``None`` = the whole built-in corpus; else a slice of about this many characters.
        vocab_size: of the general corpus's tokenizers.
        domain_vocab_size: of the in-domain text's tokenizer (Chinese needs a token per character it uses).
        families: one :class:`FamilyPlan` per family, in the order they are trained (the general corpus); the
            pretraining, polysemy, word-in-context and transfer tables take their rows from it.
        domain: the model pretrained on the curve benchmark's own unlabelled text (:data:`DOMAIN_MODEL`): the
            learning curve's model.
        domain_lines: ``None`` = every document of that text; else the first this many.
        wic_pairs: WordNet word-in-context pairs (dev + test).
        reference: add the real all-MiniLM-L6-v2 BERT to the polysemy table when it is installed (an English
            model: the Chinese learning curve leaves it out).
        n_train, n_test: labelled tweets for the transfer table (class-balanced draws, disjoint); n_test also
            sizes the learning curve's test set.
        transfer: TransferConfig fields given to every transfer run: only sizes (``max_len``); the
            modes' hyper-parameters are the transfer module's defaults.
        curve_sizes, curve_seeds: the learning curve (see :func:`lmforge.transfer.learning_curve`).
        curve_min_steps: the curve's least optimizer steps per run (``None``: the curve's default).
        transfer_table: run the transfer table (``False`` when its labelled tweets are not installed).
        curve: pretrain the in-domain model and run its learning curve (``False`` when its text is not installed).
    """

    name: str
    budget: float
    corpus_chars: int | None
    vocab_size: int
    domain_vocab_size: int
    families: tuple[FamilyPlan, ...]
    domain: FamilyPlan
    domain_lines: int | None
    wic_pairs: int
    reference: bool
    n_train: int
    n_test: int
    transfer: dict
    curve_sizes: tuple[int, ...]
    curve_seeds: tuple[int, ...]
    curve_min_steps: int | None = None
    transfer_table: bool = True
    curve: bool = True

    @property
    def models(self) -> tuple[FamilyPlan, ...]:
        """Every model, in the order they are trained: the general-corpus ones, then the in-domain one (when the
        plan runs the learning curve)."""
        return (*self.families, self.domain) if self.curve else self.families

    @property
    def fingerprint(self) -> str:
        """12 hex digits of every field: a record of the demo's time names the plan it timed, and
        ``scripts/make_results.py --check`` finds it stale when the plan has changed since."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]

    @property
    def family_order(self) -> tuple[str, ...]:
        """The families of the general-corpus models, in the plan's order."""
        return tuple(f.family for f in self.families)

    @property
    def tokenizer_kinds(self) -> tuple[str, ...]:
        """The tokenizer kinds the general-corpus models read (``wordpiece``, ``bpe``), in the plan's order."""
        return tuple(dict.fromkeys(f.tokenizer for f in self.families))

    @property
    def domain_kind(self) -> str:
        """The tokenizer kind trained on the in-domain text: the one the in-domain model's family reads."""
        return FAMILIES[self.domain.family].tokenizer_kind or "wordpiece"

    def family(self, key: str) -> FamilyPlan:
        """The model of ``key``: a family's general-corpus model, or :data:`DOMAIN_MODEL`."""
        for f in self.models:
            if f.key == key:
                return f
        raise LmforgeError(f"the {self.name} demo plan has no {key} model")

    def label(self, key: str) -> str:
        """How reports name the model of ``key`` (``BERT``, ``BERT (People's Daily)``)."""
        return self.family(key).label

    def with_budget(self, budget: float) -> DemoPlan:
        """The plan sized for ``budget`` seconds: every model's steps (epochs) times ``budget / self.budget``."""
        factor = float(budget) / self.budget
        return dataclasses.replace(self, budget=float(budget), domain=self.domain.scaled(factor),
                                   families=tuple(f.scaled(factor) for f in self.families))


# Sizes chosen to learn something in a minute or two each on 2 CPU cores: 3-layer Transformers of hidden
# 128 and a biLM of two 128-unit LSTMs per direction over a small char CNN, a 4096-token vocabulary (the
# output softmax is most of the cost), windows of 48-64 tokens.  The biLM's LSTMs are not projected
# (cell = projection): PyTorch runs unprojected LSTMs on oneDNN, projected ones several times slower.
# Dropout is off: minutes of training cannot overfit.  Most of the pretraining time goes to the in-domain
# model, the one whose transfer is measured against scratch: a BERT pretrained for a few minutes on general
# English does not beat scratch on a task's own data (docs/demo.md), so the general models get the steps
# that show each family learning and the in-domain model the rest.
_BERT = {"hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 512,
         "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "max_seq_length": 64,
         "max_predictions_per_seq": 10, "max_position_embeddings": 128}
_TRAIN = {"batch_size": 16, "warmup_steps": 30, "eval_every": 100, "eval_batches": 8, "log_every": 10,
          "save_every": 0, "min_lr_ratio": 0.1, "schedule": "cosine"}


def domain_model(family: str, shape: dict, train: dict) -> FamilyPlan:
    """The in-domain model of ``family`` (one of :data:`_DOMAIN_FAMILIES`): the general BERT's ``shape`` with
    what the family adds to it, trained with ``train``, called ``<family>-<DOMAIN>``."""
    extra, objective = _DOMAIN_FAMILIES[family]
    return FamilyPlan(family, DOMAIN, {**shape, **extra(shape)}, train, name=f"{family}-{DOMAIN}",
                      objective=objective)


FULL = DemoPlan(
    name="full",
    budget=DEFAULT_BUDGET,
    corpus_chars=None,
    vocab_size=4096,
    domain_vocab_size=8000,
    families=(
        FamilyPlan("word2vec", "wordpiece", {"vector_size": 100, "architecture": "skipgram", "window": 5,
                                             "epochs": 2, "min_count": 2}, objective="skip-gram"),
        FamilyPlan("elmo", "wordpiece",
                   {"token_encoder": "char", "projection_dim": 128, "cell_size": 128, "num_layers": 2,
                    "char_embed_dim": 16, "char_filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 128]],
                    "max_chars_per_token": 20, "num_highway": 1, "dropout": 0.0, "seq_len": 48},
                   {**_TRAIN, "lr": 2e-3, "max_steps": 300}, objective="biLM"),
        FamilyPlan("gpt", "bpe",
                   {"n_positions": 64, "n_embd": 128, "n_layer": 3, "n_head": 4, "resid_pdrop": 0.0,
                    "embd_pdrop": 0.0, "attn_pdrop": 0.0},
                   {**_TRAIN, "lr": 1e-3, "weight_decay": 0.1, "beta2": 0.95, "max_steps": 600},
                   objective="next-token LM"),
        FamilyPlan("bert", "wordpiece", _BERT, {**_TRAIN, "lr": 1e-3, "max_steps": 700}, objective="MLM + NSP"),
        # a step of ELECTRA costs more than one of BERT in this shape (the generator's pass and its softmax over
        # the vocabulary; the report gives both times per step): 500 steps take about BERT's 700 in CPU time
        FamilyPlan("electra", "wordpiece", {**_BERT, "embedding_size": _BERT["hidden_size"]},
                   {**_TRAIN, "lr": 1e-3, "max_steps": 500}, objective="replaced-token detection"),
    ),
    # Batches of 32 sentences (~40 tokens each) fill about as many tokens as 16 windows of the general corpus.
    domain=domain_model(DOMAIN_FAMILY, _BERT,
                        {**_TRAIN, "batch_size": 32, "lr": 1e-3, "max_steps": 2000, "eval_every": 250}),
    domain_lines=None,
    wic_pairs=800,
    reference=True,
    n_train=500,
    n_test=1000,
    transfer={"max_len": 64},
    curve_sizes=(100, 300),  # 1,000 labels would cost more than both sizes together; docs/transfer.md runs them
    curve_seeds=(0, 1, 2),
    curve_min_steps=30,  # runs stop early on their validation split; 30 steps bound the smallest sets' epochs
)

# Tiny everything: a few seconds per step on a busy machine; for the tests and a first look.
_QUICK_BERT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
               "max_seq_length": 32, "max_position_embeddings": 32, "max_predictions_per_seq": 5}
_QUICK_TRAIN = {"batch_size": 8, "warmup_steps": 2, "eval_every": 0, "eval_batches": 2, "log_every": 2,
                "save_every": 0}
QUICK = DemoPlan(
    name="quick",
    budget=3 * 60.0,
    corpus_chars=150_000,
    vocab_size=600,
    domain_vocab_size=3000,
    families=(
        FamilyPlan("word2vec", "wordpiece", {"vector_size": 32, "epochs": 1, "window": 3}, objective="skip-gram"),
        FamilyPlan("elmo", "wordpiece",
                   {"token_encoder": "char", "projection_dim": 32, "cell_size": 32, "char_embed_dim": 8,
                    "char_filters": [[1, 8], [2, 8], [3, 16]], "max_chars_per_token": 12, "num_highway": 1,
                    "dropout": 0.0, "seq_len": 16},
                   {**_QUICK_TRAIN, "lr": 3e-3, "max_steps": 6}, objective="biLM"),
        FamilyPlan("gpt", "bpe", {"n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 2},
                   {**_QUICK_TRAIN, "lr": 3e-3, "max_steps": 6}, objective="next-token LM"),
        FamilyPlan("bert", "wordpiece", _QUICK_BERT, {**_QUICK_TRAIN, "lr": 3e-3, "max_steps": 6},
                   objective="MLM + NSP"),
        FamilyPlan("electra", "wordpiece", {**_QUICK_BERT, "embedding_size": _QUICK_BERT["hidden_size"]},
                   {**_QUICK_TRAIN, "lr": 3e-3, "max_steps": 6}, objective="replaced-token detection"),
    ),
    domain=domain_model(DOMAIN_FAMILY, _QUICK_BERT, {**_QUICK_TRAIN, "lr": 3e-3, "max_steps": 6}),
    domain_lines=2000,
    wic_pairs=80,
    reference=True,  # a few seconds: the tests check the reference row
    n_train=48,
    n_test=48,
    transfer={"max_len": 32},
    curve_sizes=(16, 32),
    curve_seeds=(0,),
    curve_min_steps=2,
)


def make_plan(quick: bool = False, budget: float | str | None = None) -> DemoPlan:
    """The :data:`FULL` or :data:`QUICK` plan, its step counts scaled to ``budget`` (seconds or ``"30m"``)."""
    plan = QUICK if quick else FULL
    if budget is not None:
        plan = plan.with_budget(parse_duration(budget))
    return plan


FAMILY_ORDER = FULL.family_order
