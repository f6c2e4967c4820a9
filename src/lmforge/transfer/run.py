"""One transfer run: a body, a task head, how the two are trained, and the run's folder.

- ``frozen``: the body is frozen (eval mode) and runs inside every training step; only the head (and,
  for ELMo, the ScalarMix) trains.
- ``features``: the body runs once over each split and the vectors are cached
  (:mod:`lmforge.transfer.features`); the head is fitted on them (scikit-learn's logistic regression
  for sentence and tagging tasks, else a torch head).
- ``finetune``: body and head train together; ``freeze_layers=K`` keeps items ``0..K`` of
  ``body.transfer_layers()`` (the embeddings and the lowest K layers) fixed, and ``layer_lr_decay=d``
  gives item ``i`` of ``n`` the learning rate ``lr * d ** (n - 1 - i)``.  ``from_scratch=True``
  re-initialises the body from its config first: the same architecture with no pretraining.

GPT's start / delimiter / extract tokens (GPT-1's input transformations) are new embedding rows: they
train in ``frozen`` mode and whenever the embeddings are otherwise frozen (only those rows change).

Runs that train by steps hold out a validation split of the training data (``val_fraction``), keep the
state of the best epoch on it and stop early (:mod:`lmforge.transfer.fit`); what was chosen on it
(epoch, learning rate, layer, strength) is reported beside the test score.

The entry points are :func:`run_transfer` and :func:`load_run`; a run folder holds ``config.json``,
``metrics.json``, ``predictions.jsonl``, ``head.safetensors`` and, after fine-tuning, ``body.safetensors``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..config import load_json, save_json, to_dict
from ..data.tasks import TaskData, check_labels, load_task
from ..errors import CheckpointError, LmforgeError
from ..train.precision import autocast as precision_autocast
from ..train.precision import describe, resolve_device, resolve_precision
from ..utils import atomic_write_text, file_sha256, load_safetensors, save_safetensors, seed_everything
from . import features as FT
from .batching import RowStore, TransferModel, collate, with_twins
from .config import TransferConfig, check_supported, saved_config
from .encoding import Encoding, InputFormat, summary_trained
from .fit import fit_trials, snapshot, train_trial
from .heads import TaskHead
from .specs import SPECS

logger = logging.getLogger(__name__)

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
    if data.task in ("classify", "pair"):
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


def _reinit(body: nn.Module, seed: int) -> None:
    """Replace the body's weights with a fresh random init of the same config (no pretraining)."""
    torch.manual_seed(seed)
    fresh = dict(type(body)(body.config).named_parameters())
    with torch.no_grad():  # parameters only: buffers (e.g. ELMo's spelled vocabulary) stay as they are
        for name, p in body.named_parameters():
            p.copy_(fresh[name])  # every parameter: a baseline must keep none of the pretrained weights
    logger.info(
        "from scratch: the %s body was re-initialised at random (seed %d)", getattr(body, "model_type", "?"), seed
    )


class TransferRun:
    """One transfer setup: body, config, labels, input format and head.

    Build it with ``TransferRun(body, cfg, labels)`` (a new run; :meth:`fit` trains it) or
    :func:`load_run` (a finished run folder); :meth:`predict` / :meth:`evaluate` use it.
    """

    def __init__(self, body: nn.Module, cfg: TransferConfig, labels: list[str], model_dir: str | None = None):
        self.family = getattr(body, "model_type", None)
        check_supported(self.family, cfg)
        self.cfg = cfg
        self.spec = SPECS[cfg.task]
        self.recipe = cfg.resolved(self.family, int(body.hidden_size))
        self.labels = list(labels)
        self.label_index = {lab: i for i, lab in enumerate(self.labels)}
        self.model_dir = model_dir
        self.body = body
        self.device = resolve_device(cfg.device)
        # ``auto`` becomes the precision this device computes best; the run folder records the choice
        self.cfg = cfg = dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, self.device))
        gpt = None
        self.task_token_ids: tuple[int, ...] = ()
        if self.family == "gpt":
            from . import gpt_inputs

            gpt = gpt_inputs.transfer_format(body)
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
        self.pair_rows = cfg.task in ("pair", "choice") and self.fmt.pool == "mean"
        self.num_states: int | None = None  # filled on the first body pass
        self.extract_ids: list[int] | None = None  # the layers a features pass stores
        self.choices: dict = {}  # what was chosen on validation data
        self._weights_hash: str | None = None
        self.model: TransferModel | None = None

    # -- construction ---------------------------------------------------------------------------------
    def _count_states(self) -> int:
        if self.num_states is None:
            with torch.no_grad():
                batch = collate([self.fmt.encode_text("a")], self.fmt.pad_id)
                was = self.body.training
                self.body.eval()
                states = self.body.hidden_states(
                    batch["input_ids"].to(self._body_device()),
                    batch["attention_mask"].to(self._body_device()),
                    batch["token_type_ids"].to(self._body_device()),
                )
                self.num_states = len(states)
                self.body.train(was)
        return self.num_states

    def _body_device(self) -> torch.device:
        return next(self.body.parameters()).device

    def default_layer_ids(self, stored: bool = False) -> list[int]:
        """The layers the head reads, or with ``stored`` the layers a features pass stores (``auto``: all
        of them, until cross-validation picks one; the head reads the top one until then)."""
        n = self._count_states()
        if self.pooler:
            return [n - 1]
        if self.layer == "mix" or (self.layer == "auto" and stored):
            return list(range(n))
        if self.layer == "auto":
            return [n - 1]
        k = int(self.layer)
        if not -n <= k < n:
            raise LmforgeError(
                f"--layer {k} is out of range: this {self.family} body has {n} hidden states (0..{n - 1})"
            )
        return [k % n]

    def build(self, layer_ids: list[int] | None = None) -> TransferModel:
        """Create the head (seeded) and join it to the body; it reads ``layer_ids`` (default: see above)."""
        ids = list(layer_ids) if layer_ids is not None else self.default_layer_ids()
        if self.extract_ids is None:
            self.extract_ids = self.default_layer_ids(stored=True) if layer_ids is None else list(ids)
        torch.manual_seed(self.cfg.seed)
        head = TaskHead(
            self.cfg.task,
            int(self.body.hidden_size),
            len(ids),
            self.spec.num_outputs(self.labels),
            classifier=self.cfg.head_classifier,
            layer_mix=self.layer == "mix",
            pair_rows=self.pair_rows,
            dropout=self.cfg.dropout,
            mlp_hidden=self.cfg.head_hidden,
        )
        self.model = TransferModel(self.body, head, ids, pooler=self.pooler).to(self.device)
        return self.model

    def encode(self, data: TaskData) -> list[Encoding]:
        """The body inputs of ``data`` in order (QA: one per window; choice: one per choice); each
        encoding's ``example`` is the index of its example in ``data``."""
        out = []
        for i, ex in enumerate(data.examples):
            for e in self.spec.encode(self.fmt, ex):
                e.example = i
                out.append(e)
        return out

    # -- what trains ----------------------------------------------------------------------------------
    @property
    def body_trains(self) -> bool:
        return self.cfg.mode == "finetune"

    @property
    def trains_task_rows(self) -> bool:
        """GPT's added task-token rows train although the embeddings are frozen (frozen mode, or
        finetune with ``freeze_layers``)."""
        if not self.task_token_ids:
            return False
        return self.cfg.mode == "frozen" or (self.cfg.mode == "finetune" and self.cfg.freeze_layers is not None)

    @property
    def body_needs_grad(self) -> bool:
        return self.body_trains or self.trains_task_rows

    def _wte(self) -> nn.Parameter:
        return self.body.wte.weight

    def freeze(self) -> None:
        """Set ``requires_grad`` on the body as the mode says."""
        cfg = self.cfg
        for p in self.body.parameters():
            p.requires_grad_(self.body_trains)
        if cfg.mode == "finetune" and cfg.freeze_layers is not None:
            parts = list(self.body.transfer_layers())
            if cfg.freeze_layers >= len(parts) - 1:
                raise LmforgeError(
                    f"--freeze-layers {cfg.freeze_layers} is too large: this {self.family} body has the embeddings "
                    f"and {len(parts) - 1} layers, so K can be 0..{len(parts) - 2}"
                )
            for part in parts[: cfg.freeze_layers + 1]:
                for p in part.parameters():
                    p.requires_grad_(False)
        if self.trains_task_rows:
            wte = self._wte()
            wte.requires_grad_(True)
            rows = torch.zeros(wte.shape[0], 1, dtype=wte.dtype, device=wte.device)
            rows[list(self.task_token_ids)] = 1.0
            if getattr(self, "_row_hook", None) is not None:
                self._row_hook.remove()
            self._row_hook = wte.register_hook(lambda g: g * rows)  # only the task tokens' rows learn

    def param_groups(self, lr: float) -> list[dict]:
        """AdamW groups: the head, then the body's layers bottom-up with layer-wise decay; biases and
        norms without weight decay; GPT's task-token rows (when the rest of ``wte`` is frozen) without it."""
        decay = self.recipe.layer_lr_decay or 1.0
        groups: list[dict] = []
        seen: set[int] = set()

        def add(name: str, params, rate: float) -> None:
            ps = [p for p in params if p.requires_grad and id(p) not in seen]
            seen.update(id(p) for p in ps)
            wd = [p for p in ps if p.ndim >= 2]
            no_wd = [p for p in ps if p.ndim < 2]
            if wd:
                groups.append({"params": wd, "lr": rate, "name": name})
            if no_wd:
                groups.append({"params": no_wd, "lr": rate, "weight_decay": 0.0, "name": f"{name}.no_decay"})

        if self.trains_task_rows:  # zero gradient elsewhere; no decay, so the frozen rows stay exactly as they were
            wte = self._wte()
            seen.add(id(wte))
            groups.append({"params": [wte], "lr": lr, "weight_decay": 0.0, "name": "task_tokens"})
        add("head", self.model.head.parameters(), lr)
        if self.body_trains:
            parts = list(self.body.transfer_layers())
            n = len(parts)
            for i in reversed(range(n)):  # top first, so a module shared with a lower part trains at the top rate
                add(f"body.{i}", parts[i].parameters(), lr * decay ** (n - 1 - i))
            add("body.rest", self.body.parameters(), lr)  # e.g. an LM output layer outside the layer list
        return groups

    def train_mode(self) -> None:
        self.model.head.train()
        self.body.train(self.body_trains)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        if self.body_trains:
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        state = {f"head.{k}": v.detach().clone() for k, v in self.model.head.state_dict().items()}
        if self.trains_task_rows:
            state["task_rows"] = self._wte()[list(self.task_token_ids)].detach().clone()
        return state

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        if self.body_trains:
            self.model.load_state_dict(state)
            return
        self.model.head.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("head.")})
        if "task_rows" in state:
            with torch.no_grad():
                self._wte()[list(self.task_token_ids)] = state["task_rows"]

    def autocast(self):
        return precision_autocast(self.device, self.cfg.precision)

    # -- body passes ----------------------------------------------------------------------------------
    def body_blocks(self, encs: Sequence[Encoding], grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's input for ``encs``; pairs read in both orders get their twin's read-out added."""
        seqs = with_twins(encs)
        batch = {k: v.to(self.device) for k, v in collate(seqs, self.fmt.pad_id).items()}
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            blocks, mask = self.model.blocks(batch)
        if len(seqs) > len(encs):
            B = len(encs)
            return blocks[:B] + blocks[B:], mask[:B]
        return blocks, mask

    @torch.no_grad()
    def extract(self, encs: list[Encoding]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the (eval-mode) body over all encodings once; the stored layers are ``extract_ids``.

        Returns:
            vectors (R, L, C): every encoding's rows one after another; lengths (N,) rows per encoding.
        """
        self.body.eval()
        keep = self.model.layer_ids
        self.model.layer_ids = self.extract_ids
        try:
            order = sorted(range(len(encs)), key=lambda i: len(encs[i].input_ids))  # similar lengths batch well
            per: list[torch.Tensor | None] = [None] * len(encs)
            bs = self.cfg.batch_size
            for k in range(0, len(order), bs):
                chunk = order[k : k + bs]
                with self.autocast():
                    blocks, mask = self.body_blocks([encs[i] for i in chunk])
                for j, i in enumerate(chunk):
                    per[i] = blocks[j, : int(mask[j].sum())].float().cpu().clone()  # (n_i, L, C)
        finally:
            self.model.layer_ids = keep
        lengths = torch.tensor([p.shape[0] for p in per], dtype=torch.long)
        L, C = len(self.extract_ids), int(self.body.hidden_size)
        vectors = torch.cat(per) if per else torch.zeros(0, L, C)
        return vectors, lengths

    def weights_hash(self) -> str:
        """sha256 of the body's weights file (or of its tensors when it was not loaded from a folder)."""
        if self._weights_hash is None:
            f = Path(self.model_dir) / "model.safetensors" if self.model_dir else None
            if f is not None and f.is_file():
                self._weights_hash = file_sha256(f)
            else:
                h = hashlib.sha256()
                for k, v in sorted(self.body.state_dict().items()):
                    h.update(k.encode())
                    h.update(v.detach().cpu().contiguous().numpy().tobytes())
                self._weights_hash = h.hexdigest()
        return self._weights_hash

    def features(self, data: TaskData, encs: list[Encoding] | None = None, use_cache: bool = True) -> RowStore:
        """The stored vectors of ``data`` (``extract_ids`` layers): from the cache, or one body pass that is
        then cached."""
        if self.model is None:
            self.build()
        encs = self.encode(data) if encs is None else encs
        owners = torch.tensor([e.example for e in encs], dtype=torch.long)
        if not use_cache:
            return RowStore(*self.extract(encs), owners)
        settings = {
            "family": self.family,
            "task": self.cfg.task,
            "max_len": self.cfg.max_len,
            "pool": self.fmt.pool,
            "layers": self.extract_ids,
            "doc_stride": self.cfg.doc_stride,
            "both_orders": self.cfg.both_orders,
            "tokenizer": getattr(self.body.tokenizer, "hash", None),
        }
        if self.cfg.truncation != "head":  # the default keeps the keys of caches written before the option
            settings["truncation"] = self.cfg.truncation
        if self.cfg.precision != "fp32":  # vectors computed in bf16 differ; fp32 keeps the older keys
            settings["precision"] = self.cfg.precision
        key = FT.cache_key(self.weights_hash(), data.content_hash(), settings)
        path = FT.cache_dir(self.cfg) / f"{key}.safetensors"
        meta = {"source": str(data.source), "examples": str(len(data)), "family": str(self.family)}
        return FT.load_or_compute(path, owners, lambda: self.extract(encs), meta)

    def _head_stats(self, mean: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, C) statistics of the stored layers narrowed to the layers the head reads, on its device."""
        pos = [self.extract_ids.index(i) for i in self.model.layer_ids]
        return mean[pos].to(self.device), std[pos].to(self.device)

    def _head_store(self, store: RowStore) -> RowStore:
        """``store`` narrowed to the layers the head reads (a store may hold every layer)."""
        ids = self.model.layer_ids
        if store.vectors.shape[1] == len(ids):
            return store
        return store.layers([self.extract_ids.index(i) for i in ids])

    # -- training -------------------------------------------------------------------------------------
    def fit(
        self, train: TaskData, progress: Callable[[str], None] | None = None, store: RowStore | None = None
    ) -> dict:
        """Train on ``train`` (a validation split of it chooses the epoch, the lr, the layer).

        Args:
            train: the labelled examples.
            progress: called with one line per epoch.
            store: features mode: the stored vectors of ``train`` already at hand (learning curves).

        Returns:
            training facts: ``train_loss``, ``steps``, ``train_seconds``, ``val_score`` and ``choices``.
        """
        cfg = self.cfg
        seed_everything(cfg.seed)
        if cfg.from_scratch:
            _reinit(self.body, cfg.seed)
        if self.model is None:
            self.build()
        self.freeze()
        t0 = time.time()
        metric = self.spec.main_metric(self.labels)
        if cfg.uses_sklearn:
            return self._fit_logreg(train, store, t0, metric)
        if cfg.lr_grid and len(cfg.lr_grid) > 1 and cfg.val_fraction <= 0:
            raise LmforgeError("--lr-grid chooses on a validation split: set --val-fraction above 0")
        fit_idx, val_idx = validation_split(train, cfg.val_fraction, cfg.seed)
        fit_d = train.subset(fit_idx) if val_idx else train
        val_d = train.subset(val_idx) if val_idx else None
        if cfg.val_fraction > 0 and not val_idx:
            logger.info(
                "only %d training examples: no validation split, training for %d epochs", len(train), self.recipe.epochs
            )
        full = None
        if cfg.mode == "features":
            full = store if store is not None else self.features(train)
        refit = cfg.refit and bool(val_idx)
        start = snapshot(self.model) if refit or len(cfg.lr_grid or []) > 1 else None
        plan = self._fit_plan(fit_d, full.subset(fit_idx) if full is not None and val_idx else full, metric)
        if val_idx:
            plan.val = val_d
            val_store = full.subset(val_idx) if full is not None else None
            plan.val_plan = self._fit_plan(val_d, val_store, metric, standardize=False)
        out = fit_trials(self, plan, progress, start)
        if refit:  # the choices are made: train again on every example, up to the chosen epoch
            self.model.load_state_dict(start)
            refit_epochs = max(out["best_epoch"], out["least_loss_epoch"])
            again = train_trial(self, self._fit_plan(train, full, metric), out["lr"], progress, refit_epochs)
            self.load_trainable_state(again.pop("state"))
            out["steps"] += again["steps"]
            out["train_loss"], out["aux_lm_loss"] = again["train_loss"], again["aux_lm_loss"]
            out["history"] = out["history"] + [dict(r, refit=True) for r in again["history"]]
        if getattr(self, "_row_hook", None) is not None:
            self._row_hook.remove()
            self._row_hook = None
        self.model.eval()
        self.choices = {
            "val_examples": len(val_idx),
            "best_epoch": out["best_epoch"],
            "epochs_run": out["epochs_run"],
            "lr": out["lr"],
        }
        if refit:
            self.choices["refit"] = {"examples": len(train), "epochs": refit_epochs}
        if len(out["trials"]) > 1:
            self.choices["lr_trials"] = out["trials"]
        val_score = out["val_score"] if val_idx else None
        return {
            "train_loss": out["train_loss"],
            "aux_lm_loss": out.get("aux_lm_loss"),
            "history": out["history"],
            "steps": out["steps"],
            "train_seconds": round(time.time() - t0, 2),
            "val_score": val_score,
            "choices": self.choices,
        }

    def _fit_plan(self, data: TaskData, store: RowStore | None, metric: str, standardize: bool = True) -> FitPlan:
        """What a fit trains on for ``data``; with ``standardize`` frozen and features heads read vectors
        standardised over it (off for a validation split)."""
        encs = self.encode(data)
        # standardised vectors, as in features mode
        if standardize and self.cfg.mode == "frozen" and encs:
            mean, std = RowStore(*self.extract(encs)).stats()
            self.model.head.set_standardization(*self._head_stats(mean, std))
        if store is not None:
            store = self._head_store(store)
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

    def _fit_logreg(self, train: TaskData, store: RowStore | None, t0: float, metric: str) -> dict:
        """features + logreg: scikit-learn chooses the layer and the strength by cross-validation."""
        full = store if store is not None else self.features(train)
        encs = self.encode(train)
        targets = self.spec.prepare(train, encs, self.fmt, self.label_index)
        candidates = list(self.extract_ids) if self.layer == "auto" else list(self.model.layer_ids)
        probe = TaskHead(self.cfg.task, int(self.body.hidden_size), 1, 1, classifier="logreg", pair_rows=self.pair_rows)
        X_by_layer: dict[int, np.ndarray] = {}
        y = groups = None
        for layer in candidates:
            st = full.layers([self.extract_ids.index(layer)])
            xs, ys, gs = [], [], []
            with torch.no_grad():
                for k in range(0, len(st), 256):
                    idx = list(range(k, min(len(st), k + 256)))
                    blocks, mask = st.batch(idx)
                    r = probe.readout(blocks, mask)
                    if self.spec.sentence:
                        xs.append(r.numpy())
                        ys += [targets[i] for i in idx]
                        gs += [encs[i].example for i in idx]
                    else:  # one row per word (first sub-token); rows without a label are not fitted
                        for j, i in enumerate(idx):
                            t = targets[i]
                            keep = [p for p, v in enumerate(t) if v >= 0]
                            xs.append(r[j, keep].numpy())
                            ys += [t[p] for p in keep]
                            gs += [encs[i].example] * len(keep)
            X_by_layer[layer] = np.concatenate(xs) if xs else np.zeros((0, probe.out.in_features))
            y, groups = np.asarray(ys, dtype=np.int64), np.asarray(gs)
        if len(y) == 0:
            raise LmforgeError("features: the training data has no labelled rows to fit a classifier on")
        # tagging is scored like entity F1 (tags other than O), classification by accuracy
        score_classes = None if self.spec.sentence else [i for i, t in enumerate(self.labels) if t != "O"]
        score_name = "accuracy" if score_classes is None else "tag_f1"
        fit = FT.fit_logreg(
            X_by_layer, y, groups, self.cfg.cv_folds, self.cfg.seed, grouped=not self.spec.sentence,
            score_classes=score_classes,
        )
        self.build([fit["layer"]])
        FT.fold_into_linear(self.model.head.out, fit, self.spec.num_outputs(self.labels))
        self.model.eval()
        self.choices = {
            "layer": fit["layer"],
            "C": fit["C"],
            "cv_folds": self.cfg.cv_folds,
            f"cv_{score_name}_by_layer": fit["per_layer"],
        }
        cv = fit["cv_accuracy"]
        return {
            "train_loss": None,
            "history": [],
            "steps": 0,
            "train_seconds": round(time.time() - t0, 2),
            "val_score": None if math.isnan(cv) else round(cv, 6),
            "val_metric": f"cv_{score_name}",
            "choices": self.choices,
        }

    def lm_loss(self, encs: Sequence[Encoding]) -> torch.Tensor:
        """GPT-1's auxiliary LM loss: next-token prediction on the batch's own inputs."""
        from ..nn.losses import linear_cross_entropy, shift_labels

        top = self.model.last_top  # (B, T, C) of the batch just run (twins included)
        ids = collate(with_twins(encs), self.fmt.pad_id)
        labels = ids["input_ids"].masked_fill(ids["attention_mask"] == 0, -100).to(top.device)
        targets = shift_labels(labels).reshape(-1)  # (B*T,)
        return linear_cross_entropy(top.reshape(-1, top.shape[-1]).float(), self.body.lm_head.weight, targets)

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
    @torch.no_grad()
    def _logits(
        self, data: TaskData, encs: list[Encoding], use_cache: bool = True, store: RowStore | None = None
    ) -> list[torch.Tensor]:
        """Per encoding: (K,) class scores, (n, K) tag scores or (n, 2) span scores."""
        self.model.eval()
        if self.cfg.mode == "features":
            store = self._head_store(store if store is not None else self.features(data, encs, use_cache))
        out: list[torch.Tensor | None] = [None] * len(encs)
        order = sorted(range(len(encs)), key=lambda i: len(encs[i].input_ids))
        for k in range(0, len(order), self.cfg.batch_size):
            idx = order[k : k + self.cfg.batch_size]
            with self.autocast():
                if store is not None:
                    blocks, mask = (t.to(self.device) for t in store.batch(idx))
                else:
                    blocks, mask = self.body_blocks([encs[i] for i in idx])
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
            store: features mode: the stored vectors of ``data`` already at hand.

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

    # -- saving ----------------------------------------------------------------------------------------
    def save(self, out_dir: str | Path, metrics: dict, records: list[dict]) -> Path:
        """Write config.json, metrics.json, predictions.jsonl, head.safetensors (+ body.safetensors)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_safetensors({k: v.cpu() for k, v in self.model.head.state_dict().items()}, out / "head.safetensors")
        if self.cfg.mode == "finetune":
            body = self.body
            tied = set(body.tied_weight_keys()) if hasattr(body, "tied_weight_keys") else set()
            save_safetensors(
                {k: v.cpu() for k, v in body.state_dict().items() if k not in tied}, out / "body.safetensors"
            )
        elif self.trains_task_rows:
            save_safetensors(
                {"task_rows": self._wte()[list(self.task_token_ids)].detach().cpu()}, out / "task_tokens.safetensors"
            )
        extra = {
            "model_dir": str(Path(self.model_dir).resolve()) if self.model_dir else None,
            "family": self.family,
            "labels": self.labels,
            "layer_ids": self.model.layer_ids,
            "num_states": self.num_states,
            "layer_mix": self.layer == "mix",
            "pool": self.fmt.pool,
            "choices": self.choices,
            "weights_sha256": self.weights_hash() if self.model_dir else None,
        }
        save_json({"transfer": to_dict(self.cfg), **extra}, out / "config.json")
        atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2, ensure_ascii=False) + "\n")
        atomic_write_text(out / "predictions.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        from ..cards import update_card  # the run's model card (README.md), from the files written above

        update_card(out)
        return out


# -- public entry points ------------------------------------------------------------------------------
def _as_data(d: TaskData | str | Path, task: str, labelled: bool = True) -> TaskData:
    return d if isinstance(d, TaskData) else load_task(d, task, labelled)


def load_body(model: nn.Module | str | Path) -> tuple[nn.Module, str | None]:
    """A loaded body and its folder (None when ``model`` is already a module)."""
    if isinstance(model, nn.Module):
        return model, None
    from ..models import load

    return load(model), str(model)


def run_transfer(
    model: nn.Module | str | Path,
    task: str,
    train: TaskData | str | Path,
    test: TaskData | str | Path,
    mode: str = "finetune",
    out_dir: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    **options,
) -> dict:
    """Carry a pretrained body over to a labelled task and measure it.

    Args:
        model: a model folder (any family) or a loaded body with ``.tokenizer``.
        task: ``classify``, ``pair``, ``tokens``, ``qa`` or ``choice``.
        train, test: data files (see :mod:`lmforge.data.tasks`) or loaded :class:`TaskData`.
        mode: ``frozen``, ``features`` or ``finetune``.
        out_dir: when given, the run folder (metrics.json, predictions.jsonl, config.json, weights).
        progress: called with a line per epoch.
        **options: any other :class:`TransferConfig` field (epochs, lr, lr_grid, freeze_layers, ...).
    Returns:
        The metrics dict (also written to ``out_dir/metrics.json``): the task's metrics on ``test``,
        ``val_<metric>`` (the validation score the choices were made on: the held-out split, or the
        cross-validated accuracy of features + logreg), ``choices`` (epoch, lr, layer, strength), plus
        ``mode``, ``family``, ``n_train``, ``n_test``, ``train_loss``, ``train_seconds`` and, with a
        ScalarMix, ``layer_weights`` and ``gamma``.
    """
    try:
        cfg = TransferConfig(task=task, mode=mode, **options)
    except TypeError as e:
        raise LmforgeError(f"invalid transfer settings: {e}") from None
    body, model_dir = load_body(model)
    check_supported(getattr(body, "model_type", None), cfg)
    train_d = _as_data(train, task)
    test_d = _as_data(test, task)
    check_labels(train_d, test_d)
    run = TransferRun(body, cfg, train_d.labels, model_dir)
    logger.info("%s", describe(cfg.precision, run.cfg.precision, run.device))  # the choice, saved in config.json
    facts = run.fit(train_d, progress)
    metrics, records = run.evaluate(test_d)
    metric = run.spec.main_metric(run.labels)
    result = {
        **{k: round(v, 6) for k, v in metrics.items()},
        f"val_{facts.get('val_metric', metric)}": facts["val_score"],
        "task": task,
        "mode": mode,
        "family": run.family,
        "from_scratch": cfg.from_scratch,
        "n_train": len(train_d),
        "n_test": len(test_d),
        "choices": facts["choices"],
        "train_loss": facts["train_loss"],  # the task's loss; GPT's auxiliary LM loss is aux_lm_loss
        "train_seconds": facts["train_seconds"],
    }
    if run.model.head.scalar_mix is not None:
        result["layer_weights"] = [round(w, 4) for w in run.model.head.layer_weights()]
        result["gamma"] = round(run.model.head.gamma(), 4)
    if facts.get("aux_lm_loss") is not None:
        result["aux_lm_loss"] = facts["aux_lm_loss"]
    if cfg.freeze_layers is not None:
        result["freeze_layers"] = cfg.freeze_layers
    if out_dir is not None:
        run.save(out_dir, result, records)
    return result


def load_run(run_dir: str | Path) -> TransferRun:
    """Open a finished run folder for prediction: body (+ fine-tuned weights) and trained head."""
    p = Path(run_dir)
    if not (p / "config.json").is_file() or not (p / "head.safetensors").is_file():
        raise CheckpointError(
            f"{p} is not a transfer run folder (needs config.json and head.safetensors from finetune)"
        )
    data = load_json(p / "config.json")
    if "transfer" not in data:
        raise CheckpointError(f"{p / 'config.json'} is not a transfer run config")
    cfg = saved_config(data, p)
    model_dir = data.get("model_dir")
    if not model_dir or not Path(model_dir).is_dir():
        raise CheckpointError(f"the run's model folder {model_dir} is gone; the run needs it to predict")
    from ..models import load

    body = load(model_dir)
    if cfg.mode != "finetune" and data.get("weights_sha256"):
        if file_sha256(Path(model_dir) / "model.safetensors") != data["weights_sha256"]:
            raise CheckpointError(f"{model_dir} changed since this run was trained; retrain the run on this model")
    run = TransferRun(body, cfg, data["labels"], model_dir)  # (GPT: adds its task tokens to the body first)
    if cfg.mode == "finetune":
        body.load_weights(load_safetensors(p / "body.safetensors"))
    elif (p / "task_tokens.safetensors").is_file():
        rows = load_safetensors(p / "task_tokens.safetensors")["task_rows"]
        with torch.no_grad():
            body.wte.weight[list(run.task_token_ids)] = rows
    run.num_states = data.get("num_states")
    run.choices = data.get("choices", {})
    ids = data["layer_ids"]
    run.extract_ids = list(ids)
    run.build(ids)
    head_state = load_safetensors(p / "head.safetensors")
    try:
        run.model.head.load_state_dict(head_state)
    except RuntimeError as e:
        raise CheckpointError(f"{p / 'head.safetensors'} does not fit the run's config ({str(e)[:120]})") from None
    run.model.eval()
    return run
