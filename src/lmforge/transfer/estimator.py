"""A transfer run with scikit-learn's face: ``Transfer(body, task=..., mode=..., **settings).fit(train)``.

::

    from lmforge.transfer import Transfer

    clf = Transfer("models/bert", task="classify", mode="finetune", epochs=4, seed=0).fit("train.jsonl")
    clf.predict(["what a lovely day", "a dull film"])   # ['pos', 'neg']
    clf.score("test.jsonl")                              # the task's main metric (accuracy here)
    clf.lr_, clf.epochs_, clf.classes_                   # what fitting chose
    clf.save("runs/ft")                                  # the same run folder `lmforge finetune` writes
    Transfer.load("runs/ft").predict(["another text"])   # any run folder, the CLI's included

It is a thin layer over :class:`~lmforge.transfer.run.TransferRun` (which holds every rule of how a run
trains, chooses and predicts): the settings are :class:`~lmforge.transfer.config.TransferConfig` fields,
what fitting chose lands in attributes ending in ``_``, and the same data, settings and seed give the
same weights and predictions as ``lmforge finetune``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from torch import nn

from ..config import load_json
from ..data.tasks import (
    ChoiceExample,
    QAExample,
    TaskData,
    TextExample,
    TokensExample,
    check_labels,
    example_from_fields,
)
from ..errors import ConfigError, LmforgeError
from ..storage.writing import output_folder, staged_folder
from .config import TransferConfig
from .folder import as_data, fit_summary, load_body, load_run, save_run
from .modes import DEFAULT_MODE
from .run import TransferRun

_EXAMPLES = (TextExample, TokensExample, QAExample, ChoiceExample)


class Transfer:
    """A pretrained body carried over to a labelled task, fitted and used as a scikit-learn estimator.

    Args:
        body: a model folder (any family) or a loaded body (a ``TransferBody`` with ``.tokenizer``; in
            ``finetune`` mode it is trained in place, as :func:`~lmforge.transfer.run_transfer` does).
        task: ``classify``, ``pair``, ``tokens``, ``qa`` or ``choice``.
        mode: ``frozen``, ``features`` or ``finetune``.
        **settings: any other :class:`~lmforge.transfer.config.TransferConfig` field (``epochs``, ``lr``,
            ``lr_grid``, ``seed``, ``max_len``, ``freeze_layers``, ...); checked here, before any training.

    Attributes (after :meth:`fit` or :meth:`load`):
        run_: the fitted :class:`~lmforge.transfer.run.TransferRun`.
        classes_: the class names (classify / pair) or tags (tokens); empty for qa and choice.
        lr_: the peak learning rate the run trained with (None for features + logistic regression).
        epochs_: the epochs of the kept model (the refit's, else the best validation epoch; None for
            features + logistic regression).
        layer_: the hidden state the head reads (an index), or ``"mix"`` for a learned ScalarMix.
        C_: the logistic regression's inverse strength (features + logreg only, else None).
        val_score_: the score the choices were made on (validation split, ``dev``, or cross-validation).
        choices_: everything chosen on validation data, as ``metrics.json`` records it.
        history_: one record per epoch (train loss, validation score and loss); empty after :meth:`load`
            of a folder that does not keep it.
    """

    def __init__(self, body: nn.Module | str | Path, task: str = "classify", mode: str = DEFAULT_MODE, **settings):
        self.body = body
        self.task = task
        self.mode = mode
        self.settings = dict(settings)
        self._config()  # bad settings fail now, not after loading a model

    # -- scikit-learn's parameter protocol (clone, grid search) -------------------------------------------
    def get_params(self, deep: bool = True) -> dict:
        return {"body": self.body, "task": self.task, "mode": self.mode, **self.settings}

    def set_params(self, **params) -> Transfer:
        for key in ("body", "task", "mode"):
            if key in params:
                setattr(self, key, params.pop(key))
        self.settings.update(params)
        self._config()
        return self

    def __repr__(self) -> str:
        body = self.body if isinstance(self.body, (str, Path)) else type(self.body).__name__
        extra = "".join(f", {k}={v!r}" for k, v in self.settings.items())
        return f"Transfer({str(body)!r}, task={self.task!r}, mode={self.mode!r}{extra})"

    def _config(self) -> TransferConfig:
        try:
            return TransferConfig(task=self.task, mode=self.mode, **self.settings)
        except TypeError as e:
            raise ConfigError(f"invalid transfer settings: {e}") from None

    # -- fitting ----------------------------------------------------------------------------------------
    def fit(
        self,
        train: TaskData | str | Path,
        dev: TaskData | str | Path | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Transfer:
        """Train on labelled ``train`` (a data file or :class:`~lmforge.data.tasks.TaskData`).

        Args:
            train: the labelled examples.
            dev: labelled examples that choose the epoch and the learning rate instead of a validation
                split held out of ``train`` (then every ``train`` example trains and there is no refit);
                features + logistic regression chooses by cross-validation on ``train`` and only scores it.
            progress: called with one line per epoch.
        Returns:
            ``self``, fitted.
        """
        cfg = self._config()
        body, model_dir = load_body(self.body)
        train_d = as_data(train, self.task)
        dev_d = as_data(dev, self.task) if dev is not None else None
        if dev_d is not None:
            check_labels(train_d, dev_d)
        run = TransferRun(body, cfg, train_d.labels, model_dir)
        facts = run.fit(train_d, progress, val=dev_d)
        self._fitted(run, fit_summary(run, facts, len(train_d)), facts["history"])
        return self

    def _fitted(self, run: TransferRun, summary: dict, history: list[dict]) -> None:
        self.run_ = run
        self.summary_ = summary
        self.classes_ = list(run.labels)
        self.choices_ = dict(run.choices)
        self.history_ = list(history)
        self.val_score_ = next((v for k, v in summary.items() if k.startswith("val_")), None)
        self.lr_ = self.choices_.get("lr")
        refit = self.choices_.get("refit")
        self.epochs_ = refit["epochs"] if refit else self.choices_.get("best_epoch")
        self.layer_ = "mix" if run.model.head.scalar_mix is not None else int(run.model.layer_ids[0])
        self.C_ = self.choices_.get("C")

    def _check_fitted(self) -> TransferRun:
        if not hasattr(self, "run_"):
            raise LmforgeError("this Transfer is not fitted yet: call fit(train) or Transfer.load(run_folder) first")
        return self.run_

    # -- using it ---------------------------------------------------------------------------------------
    def _as_examples(self, X) -> TaskData:
        run = self._check_fitted()
        if isinstance(X, TaskData):
            return X
        if isinstance(X, (str, Path)) or not isinstance(X, Iterable):
            raise LmforgeError(
                "predict takes a list of texts, (text, text_pair) or (context, choices) pairs or examples, or a "
                "TaskData; to read a file, pass lmforge.data.tasks.load_task(path, task, labelled=False)"
            )
        examples = [self._example(x) for x in X]
        return TaskData(self.task, examples, list(run.labels), "<predict>")

    def _example(self, x):
        if isinstance(x, _EXAMPLES):
            return x
        if isinstance(x, str):
            return example_from_fields(self.task, x)
        if isinstance(x, Sequence) and len(x) == 2 and isinstance(x[0], str):
            if isinstance(x[1], str):
                return example_from_fields(self.task, x[0], text_pair=x[1])
            return example_from_fields(self.task, x[0], choices=list(x[1]))
        raise LmforgeError(f"cannot read {x!r} as a {self.task} example: give a text, a pair of texts or an example")

    def predict_records(self, X) -> list[dict]:
        """What ``lmforge predict`` prints for each input: the prediction with its probabilities, tags or span."""
        return self._check_fitted().predict(self._as_examples(X), use_cache=False)

    def predict(self, X) -> list:
        """One prediction per input: a class name (classify / pair), a list of tags (tokens), an answer
        string (qa) or the index of the chosen choice (choice).

        Args:
            X: texts (tokens: words separated by spaces), ``(text, text_pair)`` pairs (pair; qa: question and
                context), ``(context, [choices])`` (choice), examples of :mod:`lmforge.data.tasks`, or a
                :class:`~lmforge.data.tasks.TaskData`.
        """
        key = self._check_fitted().spec.answer_key
        return [r[key] for r in self.predict_records(X)]

    def predict_proba(self, X) -> list[list[float]]:
        """Per input, one probability per class (``classes_`` order) or per choice (classify, pair, choice)."""
        records = self.predict_records(X)
        if records and "probs" not in records[0]:
            raise LmforgeError(f"predict_proba serves tasks that score classes or choices, not {self.task}")
        # classes come as {class: probability}, choices as a list in their order
        return [[r["probs"][c] for c in self.classes_] if isinstance(r["probs"], dict) else r["probs"] for r in records]

    def score(self, data: TaskData | str | Path) -> float:
        """The task's main metric (accuracy, entity F1, token accuracy or QA F1) on labelled ``data``."""
        run = self._check_fitted()
        return run.score(as_data(data, self.task))

    # -- the run folder -----------------------------------------------------------------------------------
    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write the fitted run as the folder ``lmforge finetune`` writes (``lmforge predict``, ``serve`` and
        ``export-hf`` read it); the folder is complete or untouched, never the model folder.  An existing folder
        needs ``overwrite=True``, which replaces it keeping the files lmforge did not write there."""
        run = self._check_fitted()
        if not run.model_dir:
            raise LmforgeError(
                "save needs a body read from a model folder (Transfer('models/bert', ...)): a run folder names "
                "the model folder it was trained on"
            )
        with output_folder(path, "run", overwrite, inputs=[run.model_dir], beside=True, option="path",
                           hint="pass overwrite=True to replace it (files lmforge did not write there are kept)"):
            with staged_folder(path, "run") as tmp:
                save_run(run, tmp, {**self.summary_, "history": self.history_}, [])
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> Transfer:
        """A fitted estimator from a run folder (written by :meth:`save` or ``lmforge finetune``)."""
        run = load_run(path)
        settings = {k: v for k, v in dataclasses.asdict(run.cfg).items() if k not in ("task", "mode")}
        defaults = dataclasses.asdict(TransferConfig(task=run.cfg.task, mode=run.cfg.mode))
        est = cls(run.model_dir, task=run.cfg.task, mode=run.cfg.mode,
                  **{k: v for k, v in settings.items() if v != defaults[k]})
        metrics_file = Path(path) / "metrics.json"
        summary = load_json(metrics_file) if metrics_file.is_file() else {}
        est._fitted(run, summary, summary.get("history", []))
        return est
