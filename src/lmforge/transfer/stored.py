"""Stored vectors of a transfer run: one body pass over a split, the features cache, the scikit-learn fit.

:class:`RunFeatures` is the features half of :class:`~lmforge.transfer.run.TransferRun` (see
:mod:`lmforge.transfer.building` for the attributes a run sets up). In ``features`` mode the body runs
once over each split and the vectors are cached (:mod:`lmforge.transfer.features`); the head is fitted
on them: scikit-learn's logistic regression for sentence and tagging tasks (:meth:`RunFeatures._fit_logreg`,
layer and strength chosen by cross-validation), else a torch head trained like the other modes.
"""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path

import numpy as np
import torch

from ..data.tasks import TaskData
from ..errors import LmforgeError
from ..storage.files import file_sha256
from . import features as FT
from .encoding import Encoding
from .heads import TaskHead
from .model import RowStore


class RunFeatures:
    """The stored vectors of a run and the fit on them."""

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
