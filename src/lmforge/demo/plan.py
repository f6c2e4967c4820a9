"""The sizes of a demo run: :data:`FULL` and :data:`QUICK`, and :func:`make_plan`.

Every model trains a fixed number of optimizer steps (word2vec a fixed number of epochs): a demo run
is a function of (plan, corpus, seeds), whatever the machine's load, so its figures reproduce.
``--budget`` only scales the step counts (``30m`` doubles those of the 15-minute :data:`FULL` plan).
"""

from __future__ import annotations

import dataclasses

from ..errors import LmforgeError
from ..models import FAMILIES

DEFAULT_OUT = "lmforge-demo"
QUICK_OUT = "lmforge-demo-quick"
DEFAULT_BUDGET = 15 * 60.0  # seconds: what the FULL plan's step counts are sized for (2 CPU cores)
VAL_FRACTION = 0.05
POLYSEMY_WORD = "python"
POLYSEMY_SENTENCES = ("He got bit by Python.", "Python is my favorite programming language.")
FAMILY_ORDER = ("word2vec", "elmo", "gpt", "bert")
FAMILY_LABEL = {f: FAMILIES[f].label for f in FAMILY_ORDER}
TRANSFER_BENCH = "en-tweets"
DOMAIN = "tweets"  # the in-domain corpus: the transfer benchmark's own unlabelled training side
DOMAIN_BERT = "bert-tweets"  # the BERT pretrained on it: the learning curve's model
MODEL_ORDER = (*FAMILY_ORDER, DOMAIN_BERT)  # every pretrained model, in the order they are trained
MODEL_LABEL = {**FAMILY_LABEL, DOMAIN_BERT: f"BERT ({DOMAIN})"}
CURVE_MODES = ("scratch", "features", "finetune")  # BERT fine-tuned vs from scratch: several seeds and sizes
TABLE_MODES = ("frozen", "features")  # BERT's rows of the transfer table (beside every family's features)


@dataclasses.dataclass(frozen=True)
class FamilyPlan:
    """How the demo pretrains one family.

    Attributes:
        family: ``word2vec``, ``elmo``, ``gpt`` or ``bert``.
        tokenizer: which shards it reads: ``wordpiece`` or ``bpe`` (the general corpus) or ``tweets``.
        config: model config fields (written to ``configs/<key>.json`` and given to ``pretrain``).
        train: TrainConfig fields (``--set`` overrides, ``max_steps`` included); empty for word2vec.
        name: the model's key when it is not the family's general-corpus model (``bert-tweets``).
    """

    family: str
    tokenizer: str
    config: dict
    train: dict = dataclasses.field(default_factory=dict)
    name: str = ""

    @property
    def key(self) -> str:
        """``models/<key>``, ``configs/<key>.json`` and the step ``pretrain-<key>``."""
        return self.name or self.family

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
        vocab_size: of both tokenizers.
        families: one :class:`FamilyPlan` per family, in the order they are trained (the general corpus).
        domain: the BERT pretrained on the tweets' own training side (MLM only): the learning curve's model.
        domain_lines: ``None`` = every training-side tweet; else the first this many.
        wic_pairs: WordNet word-in-context pairs (dev + test).
        reference: add the real all-MiniLM-L6-v2 BERT to the polysemy table and (features mode) to the
            learning curve when it is installed: what a model pretrained far longer gives on the same draws.
        n_train, n_test: labelled tweets for the transfer table (class-balanced draws, disjoint).
        transfer: TransferConfig fields given to every transfer run: only sizes (``max_len``); the
            modes' hyper-parameters are the transfer module's defaults.
        curve_sizes, curve_seeds: the learning curve (see :func:`lmforge.transfer.learning_curve`).
        curve_min_steps: the curve's least optimizer steps per run (``None``: the curve's default).
    """

    name: str
    budget: float
    corpus_chars: int | None
    vocab_size: int
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

    def family(self, key: str) -> FamilyPlan:
        """The model of ``key``: a family's general-corpus model, or :data:`DOMAIN_BERT`."""
        for f in (*self.families, self.domain):
            if f.key == key:
                return f
        raise LmforgeError(f"the {self.name} demo plan has no {key} model")

    def with_budget(self, budget: float) -> DemoPlan:
        """The plan sized for ``budget`` seconds: every model's steps (epochs) times ``budget / self.budget``."""
        factor = float(budget) / self.budget
        return dataclasses.replace(self, budget=float(budget), domain=self.domain.scaled(factor),
                                   families=tuple(f.scaled(factor) for f in self.families))


# Sizes chosen to learn something in a minute or two each on 2 CPU cores: 3-layer Transformers of hidden
# 128 and a biLM of two 128-unit LSTMs per direction over a small char CNN, a 4096-token vocabulary (the
# output softmax is most of the cost), windows of 48-64 tokens.  The biLM's LSTMs are not projected
# (cell = projection): PyTorch runs unprojected LSTMs on oneDNN, projected ones several times slower.
# Dropout is off: minutes of training cannot overfit.  Most of the pretraining time goes to the BERT on
# the tweets, the one model whose transfer is measured against scratch: on general English, a BERT
# pretrained for a few minutes does not beat scratch on tweets (docs/demo.md), so the general models get
# the steps that show each family learning and the in-domain BERT the rest.
_BERT = {"hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 512,
         "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "max_seq_length": 64,
         "max_predictions_per_seq": 10, "max_position_embeddings": 128}
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
                   {**_TRAIN, "lr": 2e-3, "max_steps": 300}),
        FamilyPlan("gpt", "bpe",
                   {"n_positions": 64, "n_embd": 128, "n_layer": 3, "n_head": 4, "resid_pdrop": 0.0,
                    "embd_pdrop": 0.0, "attn_pdrop": 0.0},
                   {**_TRAIN, "lr": 1e-3, "weight_decay": 0.1, "beta2": 0.95, "max_steps": 600}),
        FamilyPlan("bert", "wordpiece", _BERT, {**_TRAIN, "lr": 1e-3, "max_steps": 700}),
    ),
    # MLM only (the seed objective's NSP needs sentence pairs; a tweet is one): fine-tuned, it reads the
    # mean of its token vectors.  Batches of 32 tweets (~30 tokens each) fill about as many tokens as 16
    # windows of the general corpus.
    domain=FamilyPlan("bert", DOMAIN, {**_BERT, "next_sentence": False},
                      {**_TRAIN, "batch_size": 32, "lr": 1e-3, "max_steps": 2000, "eval_every": 250},
                      name=DOMAIN_BERT),
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
    families=(
        FamilyPlan("word2vec", "wordpiece", {"vector_size": 32, "epochs": 1, "window": 3}),
        FamilyPlan("elmo", "wordpiece",
                   {"token_encoder": "char", "projection_dim": 32, "cell_size": 32, "char_embed_dim": 8,
                    "char_filters": [[1, 8], [2, 8], [3, 16]], "max_chars_per_token": 12, "num_highway": 1,
                    "dropout": 0.0, "seq_len": 16},
                   {**_QUICK_TRAIN, "lr": 3e-3, "max_steps": 6}),
        FamilyPlan("gpt", "bpe", {"n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 2},
                   {**_QUICK_TRAIN, "lr": 3e-3, "max_steps": 6}),
        FamilyPlan("bert", "wordpiece", _QUICK_BERT, {**_QUICK_TRAIN, "lr": 3e-3, "max_steps": 6}),
    ),
    domain=FamilyPlan("bert", DOMAIN, {**_QUICK_BERT, "next_sentence": False},
                      {**_QUICK_TRAIN, "lr": 3e-3, "max_steps": 6}, name=DOMAIN_BERT),
    domain_lines=2000,
    wic_pairs=80,
    reference=True,  # a few seconds: the tests check the reference rows
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
        from ..train.config import parse_duration

        plan = plan.with_budget(parse_duration(budget))
    return plan
