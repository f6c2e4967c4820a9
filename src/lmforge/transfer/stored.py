"""Stored vectors of a transfer run: one body pass over a split, the features cache, the scikit-learn fit.

:class:`RunVectors` is the stored-vectors part of :class:`~lmforge.transfer.run.TransferRun`: it reads the run's
setup from the :class:`~lmforge.transfer.state.RunState` it is given and runs the body through the run's
:class:`~lmforge.transfer.building.RunNetwork`. In ``features`` mode the body runs once over each split and the
vectors are cached (:mod:`lmforge.transfer.features`); the head is fitted on them: scikit-learn's logistic
regression for sentence and tagging tasks (:meth:`RunVectors.fit_logreg`, layer and strength chosen by
cross-validation), else a torch head trained like the other modes.
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
from .building import RunNetwork
from .encoding import Encoding
from .heads import TaskHead
from .model import RowStore
from .state import RunState


class RunVectors:
    """The stored vectors of a run and the fit on them."""

    def __init__(self, state: RunState, net: RunNetwork):
        self.state = state
        self.net = net
        self._weights_hash: str | None = None

    @torch.no_grad()
    def extract(self, encs: list[Encoding]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the (eval-mode) body over all encodings once; the stored layers are ``extract_ids``.

        Returns:
            vectors (R, L, C): every encoding's rows one after another; lengths (N,) rows per encoding.
        """
        s = self.state
        s.body.eval()
        keep = s.model.layer_ids
        s.model.layer_ids = s.extract_ids
        try:
            order = sorted(range(len(encs)), key=lambda i: len(encs[i].input_ids))  # similar lengths batch well
            per: list[torch.Tensor | None] = [None] * len(encs)
            bs = s.cfg.batch_size
            for k in range(0, len(order), bs):
                chunk = order[k : k + bs]
                with self.net.autocast():
                    blocks, mask = self.net.body_blocks([encs[i] for i in chunk])
                for j, i in enumerate(chunk):
                    per[i] = blocks[j, : int(mask[j].sum())].float().cpu().clone()  # (n_i, L, C)
        finally:
            s.model.layer_ids = keep
        lengths = torch.tensor([p.shape[0] for p in per], dtype=torch.long)
        L, C = len(s.extract_ids), int(s.body.hidden_size)
        vectors = torch.cat(per) if per else torch.zeros(0, L, C)
        return vectors, lengths

    def weights_hash(self) -> str:
        """sha256 of the body's weights file (or of its tensors when it was not loaded from a folder)."""
        s = self.state
        if self._weights_hash is None:
            f = Path(s.model_dir) / "model.safetensors" if s.model_dir else None
            if f is not None and f.is_file():
                self._weights_hash = file_sha256(f)
            else:
                h = hashlib.sha256()
                for k, v in sorted(s.body.state_dict().items()):
                    h.update(k.encode())
                    h.update(v.detach().cpu().contiguous().numpy().tobytes())
                self._weights_hash = h.hexdigest()
        return self._weights_hash

    def features(self, data: TaskData, encs: list[Encoding] | None = None, use_cache: bool = True) -> RowStore:
        """The stored vectors of ``data`` (``extract_ids`` layers): from the cache, or one body pass that is
        then cached."""
        s = self.state
        if s.model is None:
            self.net.build()
        encs = s.encode(data) if encs is None else encs
        owners = torch.tensor([e.example for e in encs], dtype=torch.long)
        if not use_cache:
            return RowStore(*self.extract(encs), owners)
        settings = {
            "family": s.family,
            "task": s.cfg.task,
            "max_len": s.cfg.max_len,
            "pool": s.fmt.pool,
            "layers": s.extract_ids,
            "doc_stride": s.cfg.doc_stride,
            "both_orders": s.cfg.both_orders,
            "tokenizer": getattr(s.body.tokenizer, "hash", None),
        }
        if s.cfg.truncation != "head":  # the default keeps the keys of caches written before the option
            settings["truncation"] = s.cfg.truncation
        if s.cfg.precision != "fp32":  # vectors computed in bf16 differ; fp32 keeps the older keys
            settings["precision"] = s.cfg.precision
        key = FT.cache_key(self.weights_hash(), data.content_hash(), settings)
        path = FT.cache_dir(s.cfg) / f"{key}.safetensors"
        meta = {"source": str(data.source), "examples": str(len(data)), "family": str(s.family)}
        return FT.load_or_compute(path, owners, lambda: self.extract(encs), meta)

    def head_stats(self, mean: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(L, C) statistics of the stored layers narrowed to the layers the head reads, on its device."""
        s = self.state
        pos = [s.extract_ids.index(i) for i in s.model.layer_ids]
        return mean[pos].to(s.device), std[pos].to(s.device)

    def head_store(self, store: RowStore) -> RowStore:
        """``store`` narrowed to the layers the head reads (a store may hold every layer)."""
        ids = self.state.model.layer_ids
        if store.vectors.shape[1] == len(ids):
            return store
        return store.layers([self.state.extract_ids.index(i) for i in ids])

    def fit_logreg(self, train: TaskData, full: RowStore, t0: float) -> dict:
        """features + logreg on ``full``, the stored vectors of ``train``: scikit-learn chooses the layer and the
        strength by cross-validation; the fit's facts, what it chose among them."""
        s = self.state
        encs = s.encode(train)
        targets = s.spec.prepare(train, encs, s.fmt, s.label_index)
        candidates = list(s.extract_ids) if s.layer == "auto" else list(s.model.layer_ids)
        probe = TaskHead(s.cfg.task, int(s.body.hidden_size), 1, 1, classifier="logreg", pair_rows=s.pair_rows)
        X_by_layer: dict[int, np.ndarray] = {}
        y = groups = None
        for layer in candidates:
            st = full.layers([s.extract_ids.index(layer)])
            xs, ys, gs = [], [], []
            with torch.no_grad():
                for k in range(0, len(st), 256):
                    idx = list(range(k, min(len(st), k + 256)))
                    blocks, mask = st.batch(idx)
                    r = probe.readout(blocks, mask)
                    if s.spec.sentence:
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
        score_classes = None if s.spec.sentence else [i for i, t in enumerate(s.labels) if t != "O"]
        score_name = "accuracy" if score_classes is None else "tag_f1"
        fit = FT.fit_logreg(
            X_by_layer, y, groups, s.cfg.cv_folds, s.cfg.seed, grouped=not s.spec.sentence,
            score_classes=score_classes,
        )
        self.net.build([fit["layer"]])
        FT.fold_into_linear(s.model.head.out, fit, s.spec.num_outputs(s.labels))
        s.model.eval()
        choices = {
            "layer": fit["layer"],
            "C": fit["C"],
            "cv_folds": s.cfg.cv_folds,
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
            "choices": choices,
        }
