"""One transfer run: a body, a task head, how the two are trained, and what they predict.

:class:`TransferRun` sets up one :class:`~lmforge.transfer.state.RunState` (body, config, its mode object, input
format, layers) and hands it to its parts, one module each:

- :mod:`lmforge.transfer.modes`: what the run's mode (``frozen``, ``features``, ``finetune``) trains, stores and
  exports;
- :mod:`lmforge.transfer.building` (:class:`~lmforge.transfer.building.RunNetwork`, ``run.net``): the head joined
  to the body, what trains, parameter groups, body passes;
- :mod:`lmforge.transfer.stored` (:class:`~lmforge.transfer.stored.RunVectors`, ``run.vectors``): the vectors a
  body pass stores, their cache and the scikit-learn fit of ``features`` mode;
- this module: encoding the data, fitting on a validation split, validating and predicting.

Runs that train by steps hold out a validation split of the training data (``val_fraction``), or read a
given one, keep the state of the best epoch on it and stop early (:mod:`lmforge.transfer.fit`); what was
chosen on it (epoch, learning rate, layer, strength) is reported beside the test score.

A run's folder (saving, loading) and the one-call entry point :func:`~lmforge.transfer.folder.run_transfer`
live in :mod:`lmforge.transfer.folder`; :class:`~lmforge.transfer.estimator.Transfer` is its
scikit-learn-style face.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ..data.tasks import TaskData
from ..devices import Compute
from ..errors import LmforgeError
from ..families import get_family
from ..models import onnx_backend
from ..train.precision import resolve_compute, settle
from ..utils import seed_everything
from . import onnx_run
from .building import RunNetwork, body_positions, reinit_body, start_pooler_at_identity
from .config import TransferConfig, check_supported
from .encoding import Encoding, InputFormat, summary_trained
from .fit import fit_trials, snapshot, train_trial
from .model import RowStore, TransferModel, collate
from .specs import SPECS
from .state import RunState
from .stored import RunVectors

logger = logging.getLogger(__name__)

#: frozen mode keeps its training examples' vectors in memory up to this size (one body pass for the whole fit)
KEEP_VECTORS_BYTES = 2 << 30
MIN_VAL_EXAMPLES = 8  # fewer held-out examples than this choose nothing: train on all, for the recipe's epochs


@dataclasses.dataclass
class FitPlan:
    """What one fit trains on: the training encodings and their targets, the units that form a training
    example, stored vectors (features mode) and the validation split."""

    encs: list[Encoding]
    targets: list
    units: list[list[int]]
    store: RowStore | None
    val: TaskData | None
    metric: str
    val_plan: FitPlan | None = None  # the validation split, encoded like training data (one pass scores it)


def validation_split(data: TaskData, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(fit, val) example indices: a seeded draw of ``fraction`` of the examples, stratified by label for
    sentence classification so every class is represented in proportion."""
    n = len(data)
    n_val = int(round(fraction * n))
    if fraction <= 0 or n_val < MIN_VAL_EXAMPLES or n - n_val < 2:
        return list(range(n)), []
    rng = np.random.default_rng(seed + 7919)
    if SPECS[data.task].classes:
        by_label: dict[str, list[int]] = {}
        for i, ex in enumerate(data.examples):
            by_label.setdefault(ex.label, []).append(i)
        val = []
        for lab in sorted(by_label):
            idx = by_label[lab]
            k = int(round(len(idx) * n_val / n))
            val += rng.permutation(idx)[:k].tolist()
    else:
        val = rng.permutation(n)[:n_val].tolist()
    val_set = set(val)
    return [i for i in range(n) if i not in val_set], sorted(val)



def _choices(out: dict, val_d: TaskData | None, n_train: int, refit_epochs: int | None) -> dict:
    """What a fit chose on validation data (``out``: the facts of :func:`~lmforge.transfer.fit.fit_trials`)."""
    choices = {
        "val_examples": len(val_d) if val_d is not None else 0,
        "best_epoch": out["best_epoch"],
        "epochs_run": out["epochs_run"],
        "lr": out["lr"],
    }
    if refit_epochs is not None:
        choices["refit"] = {"examples": n_train, "epochs": refit_epochs}
    if len(out["trials"]) > 1:
        choices["lr_trials"] = out["trials"]
    return choices


def _shared(name: str) -> property:
    """The run's view of field ``name`` of its :class:`~lmforge.transfer.state.RunState` (read and set)."""

    def get(run: TransferRun):
        return getattr(run.state, name)

    def set_(run: TransferRun, value) -> None:
        setattr(run.state, name, value)

    return property(get, set_, doc=f"``state.{name}`` (see :class:`~lmforge.transfer.state.RunState`)")


class TransferRun:
    """One transfer setup: body, config, labels, input format and head.

    Build it with ``TransferRun(body, cfg, labels)`` (a new run; :meth:`fit` trains it) or
    :func:`~lmforge.transfer.folder.load_run` (a finished run folder); :meth:`predict` / :meth:`evaluate`
    use it.  Its setup is one :class:`~lmforge.transfer.state.RunState` (``run.state``), which the run's network
    (``run.net``) and stored vectors (``run.vectors``) are given; the attributes below read and set it.
    """

    body = _shared("body")
    cfg = _shared("cfg")
    mode = _shared("mode")
    spec = _shared("spec")
    recipe = _shared("recipe")
    labels = _shared("labels")
    label_index = _shared("label_index")
    family = _shared("family")
    model_dir = _shared("model_dir")
    device = _shared("device")
    fmt = _shared("fmt")
    layer = _shared("layer")
    pooler = _shared("pooler")
    pair_rows = _shared("pair_rows")
    task_token_ids = _shared("task_token_ids")
    num_states = _shared("num_states")
    extract_ids = _shared("extract_ids")
    model = _shared("model")

    def __init__(self, body: nn.Module, cfg: TransferConfig, labels: list[str], model_dir: str | None = None,
                 compute: Compute | None = None):
        self.state = RunState()
        self.family = getattr(body, "model_type", None)
        check_supported(self.family, cfg)
        self.cfg = cfg
        self.mode = cfg.transfer_mode  # the mode's name is read here, once
        self.spec = SPECS[cfg.task]
        self.recipe = cfg.resolved(self.family, int(body.hidden_size))
        self.labels = list(labels)
        self.label_index = {lab: i for i, lab in enumerate(self.labels)}
        self.model_dir = model_dir
        self.body = body
        # the command's device and precision (default: resolved from cfg); a pending ``auto`` is settled on the body
        compute = settle(compute or resolve_compute(cfg.device, cfg.precision), body)
        self.device = compute.device
        positions = body_positions(body)
        if positions is not None and cfg.max_len > positions:  # the default 128 on a model of 32 positions, say
            logger.warning("max_len %d is more than the %s model's %d positions: inputs are cut at %d", cfg.max_len,
                           self.family, positions, positions)
            cfg = dataclasses.replace(cfg, max_len=positions)
        # ``auto`` becomes the precision this device computes best; the run folder records the choice
        self.cfg = cfg = dataclasses.replace(cfg, precision=compute.precision)
        gpt = None
        self.task_token_ids: tuple[int, ...] = ()
        if get_family(self.family).task_tokens:
            gpt = get_family(self.family).task_format(body)
            self.task_token_ids = (gpt.start_id, gpt.delim_id, gpt.extract_id)
        self.fmt = InputFormat(
            self.family,
            body.tokenizer,
            cfg.max_len,
            cfg.pool_choice(self.family, summary_trained(body)),
            gpt=gpt,
            doc_stride=cfg.doc_stride,
            both_orders=cfg.both_orders,
            truncation=cfg.truncation,
        )
        self.layer = cfg.layer_choice(self.family)
        self.pooler = self.fmt.pool == "pooler"
        if self.pooler and self.mode.trains_body and not summary_trained(body):
            start_pooler_at_identity(body)
        self.pair_rows = self.spec.pair_rows and self.fmt.pool == "mean"
        self.net = RunNetwork(self.state)  # the head joined to the body, what trains
        self.vectors = RunVectors(self.state, self.net)  # body passes, the features cache, the logreg fit
        self.choices: dict = {}  # what was chosen on validation data
        self.backend, self.quantize = "torch", "none"  # what predict runs the model on (set_backend)
        self._onnx: Callable | None = None
        self._decided = False  # whether _onnx holds the backend's answer (None then means torch)

    def encode(self, data: TaskData) -> list[Encoding]:
        """The body inputs of ``data`` in order (QA: one per window; choice: one per choice); each
        encoding's ``example`` is the index of its example in ``data``."""
        return self.state.encode(data)

    # -- the network and the stored vectors (what run.net and run.vectors do for the run) --------------------------
    def build(self, layer_ids: list[int] | None = None) -> TransferModel:
        """Create the head (seeded) and join it to the body (:meth:`RunNetwork.build`)."""
        return self.net.build(layer_ids)

    @property
    def trains_task_rows(self) -> bool:
        return self.net.trains_task_rows

    @property
    def body_stays_fixed(self) -> bool:
        return self.net.body_stays_fixed

    def freeze(self) -> None:
        self.net.freeze()

    def param_groups(self, lr: float) -> list[dict]:
        return self.net.param_groups(lr)

    def autocast(self):
        return self.net.autocast()

    def body_blocks(self, encs: list[Encoding], grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net.body_blocks(encs, grad)

    def features(self, data: TaskData, encs: list[Encoding] | None = None, use_cache: bool = True) -> RowStore:
        """The stored vectors of ``data`` (:meth:`RunVectors.features`: from the cache, or one body pass)."""
        return self.vectors.features(data, encs, use_cache)

    # -- training -------------------------------------------------------------------------------------
    def fit(
        self,
        train: TaskData,
        progress: Callable[[str], None] | None = None,
        store: RowStore | None = None,
        val: TaskData | None = None,
    ) -> dict:
        """Train on ``train`` (a validation split of it, or ``val``, chooses the epoch, the lr, the layer).

        Args:
            train: the labelled examples.
            progress: called with one line per epoch.
            store: features mode: the stored vectors of ``train`` already at hand (learning curves).
            val: labelled examples to choose on instead of a split of ``train``: every ``train`` example
                then trains, and there is no refit (features + logreg chooses by cross-validation and
                ignores it).

        Returns:
            training facts: ``train_loss``, ``steps``, ``train_seconds``, ``val_score`` and ``choices``.
        """
        cfg = self.cfg
        seed_everything(cfg.seed)
        if cfg.from_scratch:
            reinit_body(self.body, cfg.seed)
        if self.model is None:
            self.build()
        self.freeze()
        t0 = time.time()
        metric = self.spec.main_metric(self.labels)
        if cfg.uses_sklearn:
            facts = self.vectors.fit_logreg(train, store if store is not None else self.features(train), t0)
            self.choices = facts["choices"]
            return facts
        if cfg.lr_grid and len(cfg.lr_grid) > 1 and cfg.val_fraction <= 0 and val is None:
            raise LmforgeError("--lr-grid chooses on a validation split: set --val-fraction above 0")
        fit_idx, val_idx = (list(range(len(train))), []) if val is not None else self._split(train)
        full = self.mode.fit_vectors(self, train, store)  # stored vectors (features), or frozen's kept ones
        refit = cfg.refit and bool(val_idx)
        start = snapshot(self.model) if refit or len(cfg.lr_grid or []) > 1 else None
        plan = self._train_plan(train, val, full, fit_idx, val_idx, metric)
        out = fit_trials(self, plan, progress, start)
        refit_epochs = self._refit(train, full, metric, out, start, progress) if refit else None
        self.net.drop_row_hook()
        self.model.eval()
        self.choices = _choices(out, plan.val, len(train), refit_epochs)
        return {
            "train_loss": out["train_loss"],
            "aux_lm_loss": out.get("aux_lm_loss"),
            "history": out["history"],
            "steps": out["steps"],
            "train_seconds": round(time.time() - t0, 2),
            "val_score": out["val_score"] if plan.val is not None else None,
            "choices": self.choices,
        }

    def kept_vectors(self, train: TaskData) -> RowStore | None:
        """Frozen mode's vectors of ``train`` from one body pass, or None (a body pass in every step) when they
        would take more than :data:`KEEP_VECTORS_BYTES` of memory (long token-level inputs of a wide model)."""
        encs = self.encode(train)
        rows = sum(len(e.mean_segments) if e.mean_segments else len(e.rows) for e in encs)
        size = rows * len(self.extract_ids) * int(self.body.hidden_size) * 4  # float32, as RowStore keeps them
        if size > KEEP_VECTORS_BYTES:
            logger.info("frozen: the vectors of %d rows would take %.1f GB, so the body runs in every step instead",
                        rows, size / 1e9)
            return None
        return self.features(train, encs, use_cache=False)

    def _train_plan(self, train: TaskData, val: TaskData | None, full: RowStore | None, fit_idx: list[int],
                    val_idx: list[int], metric: str) -> FitPlan:
        """The plan of a fit: the examples of ``train`` at ``fit_idx`` (their stored vectors from ``full``),
        and the validation split: ``val`` when given, else the examples at ``val_idx`` (none when empty)."""
        fit_d = train.subset(fit_idx) if val_idx else train
        val_d = val if val is not None else train.subset(val_idx) if val_idx else None
        plan = self._fit_plan(fit_d, full.subset(fit_idx) if full is not None and val_idx else full, metric)
        if val_d is not None:
            plan.val = val_d
            val_store = None
            if full is not None:
                val_store = self.features(val) if val is not None else full.subset(val_idx)
            plan.val_plan = self._fit_plan(val_d, val_store, metric, standardize=False)
        return plan

    def _refit(self, train: TaskData, full: RowStore | None, metric: str, out: dict, start: dict,
               progress: Callable[[str], None] | None) -> int:
        """The choices are made: train again from ``start`` on every example of ``train``, up to the chosen epoch
        (the later of the best-metric and the least-loss epoch); fold its facts into ``out``; return that epoch."""
        self.model.load_state_dict(start)
        refit_epochs = max(out["best_epoch"], out["least_loss_epoch"])
        again = train_trial(self, self._fit_plan(train, full, metric), out["lr"], progress, refit_epochs)
        self.net.load_trainable_state(again.pop("state"))
        out["steps"] += again["steps"]
        out["train_loss"], out["aux_lm_loss"] = again["train_loss"], again["aux_lm_loss"]
        out["history"] = out["history"] + [dict(r, refit=True) for r in again["history"]]
        return refit_epochs

    def _split(self, train: TaskData) -> tuple[list[int], list[int]]:
        """(fit, val) indices of ``train``: the seeded validation split (none for too few examples)."""
        fit_idx, val_idx = validation_split(train, self.cfg.val_fraction, self.cfg.seed)
        if self.cfg.val_fraction > 0 and not val_idx:
            logger.info(
                "only %d training examples: no validation split, training for %d epochs", len(train), self.recipe.epochs
            )
        return fit_idx, val_idx

    def _fit_plan(self, data: TaskData, store: RowStore | None, metric: str, standardize: bool = True) -> FitPlan:
        """What a fit trains on for ``data``; with ``standardize`` frozen and features heads read vectors
        standardised over it (off for a validation split)."""
        encs = self.encode(data)
        # standardised vectors, as in features mode
        if standardize and self.mode.standardizes_body_pass and encs and store is None:
            mean, std = RowStore(*self.vectors.extract(encs)).stats()
            self.model.head.set_standardization(*self.vectors.head_stats(mean, std))
        if store is not None:
            store = self.vectors.head_store(store)
            if standardize and store.vectors.shape[0]:
                mean, std = store.stats()
                self.model.head.set_standardization(mean.to(self.device), std.to(self.device))
        return FitPlan(
            encs=encs,
            targets=self.spec.prepare(data, encs, self.fmt, self.label_index),
            units=self.spec.units(encs),
            store=store,
            val=None,
            metric=metric,
        )

    @torch.no_grad()
    def validate(self, plan: FitPlan, data: TaskData) -> tuple[float, float]:
        """The main metric and the task loss (per unit as in training, no auxiliary LM loss) of labelled
        ``data`` encoded as ``plan``, from one eval-mode pass of the body."""
        self.model.eval()
        total, n = 0.0, 0
        per_enc: list[torch.Tensor | None] = [None] * len(plan.encs)
        for k in range(0, len(plan.units), self.cfg.batch_size):
            b_units = plan.units[k : k + self.cfg.batch_size]
            idx = [i for u in b_units for i in u]
            b_encs = [plan.encs[i] for i in idx]
            y = self.spec.batch(plan.targets, b_units).to(self.device)
            with self.autocast():
                if plan.store is not None:
                    blocks, mask = (t.to(self.device) for t in plan.store.batch(idx))
                else:
                    blocks, mask = self.body_blocks(b_encs)
                logits = self.model.head(blocks, mask).float()
                total += float(self.spec.loss(logits, y, b_encs, b_units)) * len(b_units)
            n += len(b_units)
            logits, mask = logits.cpu(), mask.cpu()
            for j, i in enumerate(idx):  # per encoding, as _logits gives them to the spec
                per_enc[i] = logits[j] if self.spec.sentence else logits[j, : int(mask[j].sum())]
        preds = self.spec.predict(data, plan.encs, per_enc, self.labels, self.cfg)
        metrics, _ = self.spec.evaluate(data, preds, self.labels)
        return float(metrics[self.spec.main_metric(self.labels)]), total / max(1, n)

    # -- inference ------------------------------------------------------------------------------------
    def set_backend(self, backend: str = "torch", quantize: str = "none") -> TransferRun:
        """Predict on ``torch``, ``onnx`` (ONNX Runtime: :mod:`lmforge.transfer.onnx_run`) or ``auto`` (the faster,
        measured once per run and machine), in fp32 or with ``quantize="int8"`` (ONNX Runtime's dynamic int8,
        approximate); returns ``self``."""
        if backend not in onnx_backend.BACKENDS or quantize not in onnx_backend.QUANTIZE:
            raise LmforgeError(f"a run predicts on torch or onnx, in fp32 (none) or int8; not {backend}/{quantize}")
        if backend == "torch" and quantize != "none":
            raise LmforgeError("int8 runs on ONNX Runtime: use --backend onnx with --quantize int8")
        if backend == "onnx" or quantize != "none":
            self.mode.check_onnx()
        self.backend, self.quantize, self._onnx, self._decided = backend, quantize, None, False
        return self

    def _graph(self, encs: list[Encoding]) -> Callable | None:
        """The ONNX Runtime forward of the run, made on first use; None on torch."""
        if self.backend == "torch" or self._decided:
            return self._onnx
        if self.backend == "onnx" or self.quantize != "none":
            self._onnx = onnx_run.run_forward(self, encs, self.quantize)
        else:
            self._onnx = onnx_run.auto_forward(self, encs)
        self._decided = True
        return self._onnx

    @torch.no_grad()
    def _logits(
        self, data: TaskData, encs: list[Encoding], use_cache: bool = True, store: RowStore | None = None
    ) -> list[torch.Tensor]:
        """Per encoding: (K,) class scores, (n, K) tag scores or (n, 2) span scores."""
        self.model.eval()
        # features: the stored vectors; frozen: those its fixed body gave when given (a learning curve's test set)
        store = self.mode.predict_vectors(self, data, encs, use_cache, store)
        out: list[torch.Tensor | None] = [None] * len(encs)
        order = sorted(range(len(encs)), key=lambda i: len(encs[i].input_ids))
        graph = self._graph(encs) if store is None and encs else None
        for k in range(0, len(order), self.cfg.batch_size):
            idx = order[k : k + self.cfg.batch_size]
            with self.autocast():
                if graph is not None:
                    batch = collate([encs[i] for i in idx], self.fmt.pad_id)
                    logits, mask = graph(batch), batch["row_mask"]
                elif store is not None:
                    blocks, mask = (t.to(self.device) for t in store.batch(idx))
                else:
                    blocks, mask = self.body_blocks([encs[i] for i in idx])
                if graph is None:
                    logits = self.model.head(blocks, mask).float().cpu()
            mask = mask.cpu()
            for j, i in enumerate(idx):
                out[i] = logits[j] if self.spec.sentence else logits[j, : int(mask[j].sum())]
        return out

    def predict(self, data: TaskData, use_cache: bool = True, store: RowStore | None = None) -> list[dict]:
        """Predictions for each example of ``data`` (labels may be absent).

        Args:
            data: the examples.
            use_cache: features mode: read/write the vector cache (off for one-off texts).
            store: the stored vectors of ``data`` already at hand (features mode, or frozen mode with a body that
                stays fixed, as learning curves share them).

        Returns:
            classify/pair: ``{"label", "probs"}``; tokens: ``{"words", "tags"}``; qa: ``{"id", "answer"}``;
            choice: ``{"label": index of the chosen choice, "probs": [one per choice]}``.
        """
        encs = self.encode(data)
        logits = self._logits(data, encs, use_cache, store)
        return self.spec.predict(data, encs, logits, self.labels, self.cfg)

    def evaluate(self, data: TaskData, store: RowStore | None = None) -> tuple[dict[str, float], list[dict]]:
        """Task metrics on labelled ``data`` and the prediction records (gold included)."""
        preds = self.predict(data, store=store)
        return self.spec.evaluate(data, preds, self.labels)

    def score(self, data: TaskData, store: RowStore | None = None) -> float:
        """The task's main metric on labelled ``data``."""
        metrics, _ = self.evaluate(data, store=store)  # (eval mode; the next epoch sets train mode again)
        return float(metrics[self.spec.main_metric(self.labels)])
