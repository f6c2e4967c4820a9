"""The settings of one transfer run, their defaults, and which family supports which mode.

Defaults depend on the mode and on whether the body is pretrained (see :meth:`TransferConfig.resolved`):

| run | lr | epochs (at most) | warm-up | layer-wise lr decay | early-stopping patience |
|---|---|---|---|---|---|
| ``finetune``, pretrained body | 1e-4 x 384 / width | 20 | 0.1 | 0.9 | 3 epochs |
| ``finetune --from-scratch`` | 1e-3 | 40 | 0.1 | none | 5 epochs |
| ``frozen`` (the head alone) | 3e-3 | 60 | 0.05 | n/a | 5 epochs |
| ``features`` with a torch head (mlp / bilstm / qa / choice) | 1e-2 | 100 | 0.05 | n/a | 8 epochs |

``features`` with the default ``logreg`` classifier on a sentence or tagging task is not trained by
steps at all: scikit-learn's ``LogisticRegression`` on standardised vectors, its strength and the layer
chosen by cross-validation on the training data (see :mod:`lmforge.transfer.features`).

Every run that trains by steps holds out ``val_fraction`` of its training examples, scores them after
each epoch, keeps the best state and stops after ``patience`` epochs without progress (metric or loss).  ``lr_grid``
tries several peak learning rates and keeps the one that scores best on the same validation split:
the from-scratch baseline and the pretrained run get the same number of trials.  Then (``refit``) the
run trains once more from the start on all its training examples, held-out ones included, with the
chosen lr for the chosen number of epochs: with 300 labels the 20 % hold-out is 60 examples the final
model would otherwise never see.
"""

from __future__ import annotations

import dataclasses
import logging

from ..config import from_dict
from ..devices import PRECISIONS, check_device
from ..errors import CheckpointError, ConfigError, LmforgeError
from ..families import FAMILIES
from .encoding import POOLS, TRUNCATIONS, input_rules
from .heads import CLASSIFIERS
from .modes import DEFAULT_MODE, MODES, Mode, mode_of
from .specs import SPECS

logger = logging.getLogger(__name__)



@dataclasses.dataclass(frozen=True)
class Recipe:
    """Resolved training settings of one run (what the run actually uses)."""

    lr: float
    epochs: int
    warmup: float
    layer_lr_decay: float | None
    patience: int
    lm_weight: float


# (lr, epochs, warmup, layer_lr_decay, patience) of a body fine-tuned from a random init; each mode's own recipe
# is its object's (lmforge.transfer.modes), and where a family departs from these its Family.transfer_recipes says so
# (word2vec: an embedding-bag rate)
_SCRATCH = (1e-3, 40, 0.1, None, 5)


@dataclasses.dataclass
class TransferConfig:
    """The settings of one transfer run (saved in the run's ``config.json``).

    Attributes:
        task: ``classify``, ``pair``, ``tokens``, ``qa`` or ``choice``.
        mode: ``frozen``, ``features`` or ``finetune``.
        epochs: the most passes over the training data (default: see the module table).
        lr: peak learning rate of AdamW (default: see the module table).
        lr_grid: try each of these peak learning rates and keep the best on the validation split
            (overrides ``lr``).
        batch_size: examples per step (also per body pass when extracting features).
        max_len: most positions per input, special tokens included (longer inputs are cut).
        truncation: how a longer text is cut (``classify`` and ``pair``): ``head`` keeps its start;
            ``head+tail`` keeps its first quarter of the room and fills the rest from its end. Reach for
            it when the texts run past ``max_len`` and their end carries the label (a review that states
            its verdict last); Sun et al. 2019 found it the best cut for long documents.
        seed: seeds the validation split, the head's init, dropout and the order of examples.
        classifier: ``linear`` (dropout + Linear), ``logreg``, ``mlp`` or ``bilstm``; default ``logreg``
            in features mode, else ``linear``.
        freeze_layers: finetune only: keep embeddings and the lowest K layers fixed (None = none).
        layer_lr_decay: finetune only: multiply the learning rate by this per layer going down
            (default 0.9 for a pretrained body, none from scratch; 1 turns it off).
        pool: how a sentence is read: ``cls`` (BERT's top ``[CLS]``), ``pooler`` (BERT's NSP-trained tanh
            pooler on ``[CLS]``), ``last`` (GPT's extract token), ``mean``, or ``tokens`` (every token, for
            the ``bilstm`` head); default: ``mean`` for single texts in frozen and features mode (a frozen
            body's mean vector measures best there) and for single texts fine-tuned on a BERT pretrained
            without next-sentence prediction (its ``[CLS]`` was never trained as a summary), else BERT ``cls``
            and GPT ``last`` (a pair is read where the body attended across both texts), ELMo / word2vec
            ``mean``.
        layer: which layer the head reads: an index into the body's hidden states (0 = embeddings,
            negative from the top), ``"mix"`` (all layers mixed by a learned ScalarMix) or ``"auto"``
            (features + logreg: the layer that cross-validates best). Default: ``auto`` for features +
            logreg, ``mix`` in frozen mode (and other features heads) and for ELMo, else the top layer.
        dropout: dropout of the head.
        head_hidden: hidden width of the ``mlp`` head, LSTM size per direction of the ``bilstm`` head.
        weight_decay: AdamW weight decay.
        warmup: fraction of the steps with a linear warm-up; then linear decay to zero (default by mode).
        val_fraction: fraction of the training examples held out to choose the epoch, the learning rate
            and (features) the classifier's strength; 0 trains on everything for ``epochs`` epochs.
        patience: stop after this many epochs in which neither the validation score nor the validation
            loss improved (default by mode).
        refit: once the validation split has chosen the lr and the epochs (the later of the best-metric
            and the least-loss epoch), train again from the start on every training example (the
            held-out ones included) for that many epochs, and keep that model; False keeps the best
            state of the trial itself.
        cv_folds: features + logreg: cross-validation folds over the training data.
        from_scratch: re-initialise the body from its config (finetune: the no-pretraining baseline).
        lm_weight: GPT, finetune: weight of GPT-1's auxiliary next-token loss on the task's own inputs
            (``loss = task_loss + lm_weight * lm_loss``; default 0.5 as in the paper, 0 turns it off).
        max_answer_tokens: QA: the longest answer span considered.
        doc_stride: QA: a context longer than fits is read in windows starting this many tokens apart
            (default: half the room after the question); 0 cuts it instead.
        both_orders: pair: read each pair in both orders and add the two read-outs (GPT-1's similarity).
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``.
        precision: ``auto`` (bf16 where the device computes it natively, else fp32), ``fp32``, ``bf16`` or
            ``fp16`` (CUDA only, with a gradient scaler): the autocast of body and head (see
            :mod:`lmforge.train.precision`); a run folder records the resolved choice.
        cache_dir: where features mode caches vectors (default ``~/.cache/lmforge/features``).
    """

    task: str = "classify"
    mode: str = DEFAULT_MODE
    epochs: int | None = None
    lr: float | None = None
    lr_grid: list[float] | None = None
    batch_size: int = 32
    max_len: int = 128
    truncation: str = "head"
    seed: int = 0
    classifier: str | None = None
    freeze_layers: int | None = None
    layer_lr_decay: float | None = None
    pool: str | None = None
    layer: int | str | None = None
    dropout: float = 0.1
    head_hidden: int = 128
    weight_decay: float = 0.01
    warmup: float | None = None
    val_fraction: float = 0.2
    patience: int | None = None
    refit: bool = True
    cv_folds: int = 5
    from_scratch: bool = False
    lm_weight: float | None = None
    max_answer_tokens: int = 30
    doc_stride: int | None = None
    both_orders: bool = False
    device: str = "auto"
    precision: str = "auto"
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"invalid transfer settings: {msg}")

        need(self.task in SPECS, f"task must be one of {', '.join(SPECS)}, got {self.task!r}")
        need(self.mode in MODES, f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        need(
            self.classifier is None or self.classifier in CLASSIFIERS,
            f"classifier must be one of {', '.join(CLASSIFIERS)}, got {self.classifier!r}",
        )
        need(self.pool is None or self.pool in POOLS, f"pool must be one of {', '.join(POOLS)}, got {self.pool!r}")
        need(self.epochs is None or self.epochs >= 1, "epochs must be >= 1")
        need(self.lr is None or 0 < self.lr < float("inf"), "lr must be a finite number > 0")
        if self.lr_grid is not None:
            self.lr_grid = [float(x) for x in self.lr_grid]
            need(bool(self.lr_grid) and all(0 < x < float("inf") for x in self.lr_grid), "lr_grid must hold lrs > 0")
        need(self.batch_size >= 1 and self.max_len >= 8, "batch_size must be >= 1 and max_len >= 8")
        need(
            self.truncation in TRUNCATIONS,
            f"truncation must be one of {', '.join(TRUNCATIONS)}, got {self.truncation!r}",
        )
        need(
            self.truncation == "head" or SPECS[self.task].classes,
            f"truncation {self.truncation!r} cuts whole texts (classify, pair); {self.task} keeps every word it can",
        )
        need(self.freeze_layers is None or self.freeze_layers >= 0, "freeze_layers must be >= 0")
        need(self.layer_lr_decay is None or 0 < self.layer_lr_decay <= 1, "layer_lr_decay must be in (0, 1]")
        need(self.warmup is None or 0 <= self.warmup < 1, "warmup must be in [0, 1)")
        need(0 <= self.val_fraction < 1, "val_fraction must be in [0, 1)")
        need(self.patience is None or self.patience >= 1, "patience must be >= 1")
        need(self.cv_folds >= 2, "cv_folds must be >= 2")
        need(self.max_answer_tokens >= 1, "max_answer_tokens must be >= 1")
        need(self.doc_stride is None or self.doc_stride >= 0, "doc_stride must be >= 0 (0 = no sliding window)")
        need(self.lm_weight is None or self.lm_weight >= 0, f"lm_weight must be >= 0, got {self.lm_weight}")
        check_device(self.device)
        need(self.precision in PRECISIONS, f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if isinstance(self.layer, str) and self.layer not in ("mix", "auto"):
            try:
                self.layer = int(self.layer)
            except ValueError:
                need(False, f"layer must be an index, 'mix' or 'auto', got {self.layer!r}")

    @property
    def transfer_mode(self) -> Mode:
        """The mode object of :attr:`mode` (:mod:`lmforge.transfer.modes`)."""
        return mode_of(self.mode)

    @property
    def head_classifier(self) -> str:
        return self.classifier or self.transfer_mode.default_classifier

    @property
    def uses_sklearn(self) -> bool:
        """features + logreg on a task whose rows are independent examples (and no learned layer mix):
        scikit-learn fits the head."""
        return (
            self.transfer_mode.reads_stored
            and self.head_classifier == "logreg"
            and SPECS[self.task].sklearn
            and self.layer != "mix"
        )

    def layer_choice(self, family: str) -> int | str:
        """What the head reads: an index, ``"mix"`` or ``"auto"`` (see the ``layer`` attribute)."""
        if self.layer is not None:
            return self.layer
        if self.uses_sklearn:
            return "auto"
        if self.pool == "pooler":
            return -1
        mixes = family in FAMILIES and FAMILIES[family].mixes_layers
        return "mix" if mixes or not self.transfer_mode.trains_body else -1

    def pool_choice(self, family: str, summary_trained: bool = True) -> str | None:
        """The sentence read-out (None for token-level tasks).

        ``summary_trained``: whether the body's default read-out token was trained to summarise the input
        (False for a BERT pretrained without next-sentence prediction: see
        :func:`lmforge.transfer.encoding.summary_trained`).
        """
        if not SPECS[self.task].sentence:
            return None
        if self.head_classifier == "bilstm":
            return "tokens"
        if self.pool is not None:
            return self.pool
        rules = input_rules(family)
        no_summary = not rules.pools  # ELMo, word2vec: no summary position
        single = SPECS[self.task].single_text
        hf_pool = FAMILIES[family].hf_pool if family in FAMILIES else None
        if self.transfer_mode.trains_body and hf_pool and SPECS[self.task].hf_head and not no_summary:
            # what the family's HF class of the task reads (BERT's pooler, ELECTRA's [CLS], GPT's last token):
            # fine-tuning trains that read-out along with the body, and the run exports exactly (lmforge export-hf)
            return hf_pool
        if no_summary or (not self.transfer_mode.trains_body and single) or (single and not summary_trained):
            return "mean"
        return rules.default_pool

    def resolved(self, family: str, hidden_size: int | None = None) -> Recipe:
        """The learning rate, epochs, warm-up, layer decay, patience and LM weight this run uses.

        Fine-tuning a pretrained body of width ``hidden_size`` defaults to ``1e-4 * 384 / hidden_size``
        (clamped to [2e-5, 1e-3]): 5e-5 for a BERT-base of 768 (the range the BERT paper recommends), 1e-4
        for a 384-wide MiniLM, 3e-4 for a 128-wide model: narrower bodies take larger steps.
        """
        mode = self.transfer_mode
        own = FAMILIES[family].transfer_recipes if family in FAMILIES else {}
        if mode.trains_body and self.from_scratch:
            base = own.get("scratch", _SCRATCH)
        elif mode.trains_body and "finetune" in own:
            base = own["finetune"]
            hidden_size = None  # the width rule is for transformer bodies
        else:
            base = mode.recipe
        lr, epochs, warmup, decay, patience = base
        if mode.trains_body and not self.from_scratch and hidden_size:
            lr = min(1e-3, max(2e-5, lr * 384 / hidden_size))
        decay = mode.layer_decay(self, decay)
        lm = (
            self.lm_weight
            if self.lm_weight is not None
            else (0.5 if _aux_lm(family) and mode.trains_body else 0.0)
        )
        return Recipe(
            lr=self.lr if self.lr is not None else lr,
            epochs=self.epochs if self.epochs is not None else epochs,
            warmup=self.warmup if self.warmup is not None else warmup,
            layer_lr_decay=decay,
            patience=self.patience if self.patience is not None else patience,
            lm_weight=lm,
        )


def _aux_lm(family: str | None) -> bool:
    """Whether ``family`` fine-tunes with GPT-1's auxiliary LM loss (the registry's ``aux_lm``)."""
    return family in FAMILIES and FAMILIES[family].aux_lm


def check_supported(family: str | None, cfg: TransferConfig) -> None:
    """Raise a one-line LmforgeError when ``family`` cannot run ``cfg``'s mode / task / options."""
    if family not in FAMILIES:
        raise LmforgeError(f"unknown model family '{family}'; transfer supports {', '.join(FAMILIES)}")
    modes = FAMILIES[family].transfer_modes
    mode = cfg.transfer_mode
    if not mode.serves(modes, cfg):
        raise LmforgeError(
            f"{family} models support --mode {' / '.join(modes)}, not {cfg.mode} "
            f"(see docs/transfer.md for which family supports which mode)"
        )
    if cfg.task in FAMILIES[family].unsupported_tasks:
        raise LmforgeError(f"{family} models cannot do --task {cfg.task}: static word vectors cannot locate a span")
    mode.check(cfg, _aux_lm(family))
    if cfg.both_orders and not SPECS[cfg.task].text_pair:
        raise LmforgeError(f"--both-orders reads a pair in both orders: it serves --task pair, not {cfg.task}")
    if cfg.head_classifier == "bilstm" and not SPECS[cfg.task].bilstm_head:
        raise LmforgeError("the bilstm classifier serves classify / pair / tokens, not qa")
    pool = cfg.pool_choice(family)
    if pool == "pooler" and not (family in FAMILIES and FAMILIES[family].pooler):
        raise LmforgeError(f"--pool pooler reads BERT's NSP-trained pooler; the {family} model has none: "
                           "use --pool cls or --pool mean")
    if pool == "tokens" and cfg.head_classifier != "bilstm":
        raise LmforgeError("--pool tokens feeds every token vector to a BiLSTM: use it with --classifier bilstm")
    layer = cfg.layer_choice(family)
    if layer == "auto" and not cfg.uses_sklearn:
        raise LmforgeError(
            "--layer auto (chosen by cross-validation) serves --mode features with the logreg classifier"
        )
    if pool == "pooler" and layer not in (-1, "auto"):
        raise LmforgeError("--pool pooler reads the top layer through BERT's pooler: leave --layer unset")
    if cfg.classifier in ("logreg", "mlp") and not mode.reads_stored:
        logger.info(
            "classifier %s in %s mode: the head is that classifier on top of the body", cfg.classifier, cfg.mode
        )


def saved_config(data: dict, where: object) -> TransferConfig:
    """The :class:`TransferConfig` of a run folder's parsed ``config.json`` (``where`` names it in errors).

    Raises:
        ConfigError: a key TransferConfig does not have (the message names the closest one).
        CheckpointError: the run was trained with a setting lmforge no longer has (one line saying what to do).
    """
    fields = dict(data["transfer"])
    cfg = from_dict(TransferConfig, fields)
    if cfg.lm_weight and data.get("family") in FAMILIES and not _aux_lm(data["family"]):
        raise CheckpointError(
            f"{where} was trained with BERT's auxiliary masked-LM loss (--lm-weight), which lmforge no longer "
            "has; retrain it without --lm-weight"
        )
    return cfg
