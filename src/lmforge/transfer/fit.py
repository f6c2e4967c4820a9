"""The training loop of a transfer run that trains by steps (every mode but features + logreg).

One trial trains the head (and the body in finetune mode) with AdamW under the linear warm-up /
linear decay of :class:`lmforge.train.schedule.LRSchedule`, scores the validation split after every
epoch with the task's main metric and its loss, keeps the best state (the best metric; of equal
metrics, the lower loss) and stops after ``patience`` epochs in which neither the metric nor the loss
improved (counted once the warm-up is over).  The loss matters where the metric sits flat for a while:
a tagger first learns to predict ``O`` everywhere (entity F1 0) and only then finds the entities.
:func:`fit_trials` runs one trial per learning rate of the grid from the same initial state and keeps
the trial that scored best on validation.  A refit (``stop_epoch``) trains once more on every
training example, held-out ones included, under the same per-epoch schedule, and stops at the later
of the best-metric epoch and the least-loss epoch: on a small validation split the metric can peak
early by chance while the loss says the model is still learning, and more training data rarely wants
fewer epochs.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import numpy as np
import torch

from ..train.precision import grad_scaler
from ..train.schedule import LRSchedule

logger = logging.getLogger(__name__)

LOSS_PROGRESS = 1e-3  # a validation loss this much (relative) below the least so far counts as progress


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of every tensor of ``module``'s state: the start that lr trials and the refit return to."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _batch_losses(run, plan, b_units: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(loss, task loss, LM loss)`` of one batch of units: the LM loss on its texts with an auxiliary LM weight
    (None without), the loss that trains their weighted sum."""
    idx = [i for u in b_units for i in u]
    b_encs = [plan.encs[i] for i in idx]
    y = run.spec.batch(plan.targets, b_units).to(run.device)
    with run.net.autocast():
        if plan.store is not None:
            blocks, mask = plan.store.batch(idx)
            blocks, mask = blocks.to(run.device), mask.to(run.device)
        else:
            blocks, mask = run.net.body_blocks(b_encs, grad=run.net.body_needs_grad)
        logits = run.model.head(blocks, mask).float()
        task_loss = run.spec.loss(logits, y, b_encs, b_units)
        lm_loss = run.net.lm_loss(b_encs) if run.recipe.lm_weight > 0 else None
        loss = task_loss if lm_loss is None else task_loss + run.recipe.lm_weight * lm_loss
    return loss, task_loss, lm_loss


def _optimizer_step(loss: torch.Tensor, opt, scaler, params: list) -> None:
    """Backward, clip the gradients at norm 1 and step (through the fp16 scaler when there is one)."""
    opt.zero_grad(set_to_none=True)
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if scaler is not None:
        scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()


def _epoch_line(rec: dict, lr: float, last_epoch: int, metric: str, refit: bool) -> str:
    tag = "refit on all, " if refit else ""
    return f"{tag}lr {lr:g} epoch {rec['epoch']}/{last_epoch}: train loss {rec['train_loss']:.4f}" + (
        f", val {metric} {rec['val']:.4f}, val loss {rec['val_loss']:.4f}" if "val" in rec else ""
    ) + (f", aux LM loss {rec['aux_lm_loss']:.4f}" if "aux_lm_loss" in rec else "")


class _Optimization:
    """AdamW over the run's parameter groups at peak ``lr``, under the linear warm-up / linear decay schedule
    that spans the recipe's epochs (through the fp16 gradient scaler on CUDA)."""

    def __init__(self, run, plan, lr: float):
        cfg, recipe = run.cfg, run.recipe
        groups = run.net.param_groups(lr)
        self.params = [p for g in groups for p in g["params"]]
        self.opt = torch.optim.AdamW(groups, lr=lr, weight_decay=cfg.weight_decay)
        self.scaler = grad_scaler(run.device, cfg.precision)  # fp16 on CUDA only
        total = math.ceil(len(plan.units) / cfg.batch_size) * recipe.epochs
        self.schedule = LRSchedule(int(recipe.warmup * total), total, kind="linear", min_lr_ratio=0.0)
        self.base = [g["lr"] for g in self.opt.param_groups]
        self.steps = 0

    @property
    def warm(self) -> bool:
        """True once the warm-up is over."""
        return self.steps >= self.schedule.warmup_steps

    def step(self, loss: torch.Tensor) -> None:
        """One optimizer step on ``loss`` at the schedule's learning rates."""
        factor = self.schedule(self.steps)
        for g, b in zip(self.opt.param_groups, self.base):
            g["lr"] = b * factor
        _optimizer_step(loss, self.opt, self.scaler, self.params)
        self.steps += 1


def _train_epoch(run, plan, optim: _Optimization, order: np.ndarray, epoch: int) -> dict:
    """One pass over the training units in ``order``; the epoch's record with its mean losses."""
    run.net.train_mode()
    ep_loss, ep_lm, ep_n = 0.0, 0.0, 0
    for k in range(0, len(order), run.cfg.batch_size):
        b_units = [plan.units[u] for u in order[k : k + run.cfg.batch_size].tolist()]
        loss, task_loss, lm_loss = _batch_losses(run, plan, b_units)
        optim.step(loss)
        # the task's loss and the auxiliary LM loss are reported apart (their weighted sum is what trains)
        ep_loss += float(task_loss.detach()) * len(b_units)
        ep_lm += float(lm_loss.detach()) * len(b_units) if lm_loss is not None else 0.0
        ep_n += len(b_units)
    rec = {"epoch": epoch, "train_loss": round(ep_loss / max(1, ep_n), 5)}
    if run.recipe.lm_weight > 0:
        rec["aux_lm_loss"] = round(ep_lm / max(1, ep_n), 5)
    return rec


class _Selection:
    """The best state on validation (the best metric; of equal metrics, the lower loss) and the epochs of
    progress that patience counts from."""

    def __init__(self):
        self.best = {"score": -math.inf, "loss": math.inf, "epoch": 0, "state": None}
        self.least_loss, self.progress_epoch = math.inf, 0
        self.least_loss_any, self.least_loss_epoch = math.inf, 0

    def update(self, run, epoch: int, score: float, vloss: float) -> None:
        """Take the validation ``score`` and loss of ``epoch`` into account (keeping the run's state if best)."""
        if score > self.best["score"] or (score == self.best["score"] and vloss < self.best["loss"]):
            self.best = {"score": score, "loss": vloss, "epoch": epoch, "state": run.net.trainable_state()}
            self.progress_epoch = epoch
        if vloss < self.least_loss * (1 - LOSS_PROGRESS):
            self.least_loss, self.progress_epoch = vloss, epoch
        if vloss < self.least_loss_any:
            self.least_loss_any, self.least_loss_epoch = vloss, epoch

    def out_of_patience(self, epoch: int, warm_epoch: int | None, patience: int) -> bool:
        """True when ``patience`` epochs have passed without progress, counted once the warm-up is over."""
        return warm_epoch is not None and epoch - max(self.progress_epoch, warm_epoch) >= patience


def train_trial(
    run, plan, lr: float, progress: Callable[[str], None] | None = None, stop_epoch: int | None = None
) -> dict:
    """Train once at peak learning rate ``lr``; return the trial's facts and its best state.

    Args:
        run: the :class:`~lmforge.transfer.run.TransferRun` (model built, body frozen as its mode says).
        plan: the run's :class:`~lmforge.transfer.run.FitPlan` (training encodings, targets, units,
            stored vectors, validation split).
        lr: peak learning rate of the top layer and the head.
        stop_epoch: stop after this epoch (a refit on all the data); the learning-rate schedule still
            spans the recipe's epochs, so the first ``stop_epoch`` epochs see the rates the chosen trial saw.
    """
    cfg, recipe = run.cfg, run.recipe
    optim = _Optimization(run, plan, lr)
    rng = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)  # dropout: every trial draws the same masks
    sel = _Selection()
    history: list[dict] = []
    warm_epoch = None
    t0 = time.time()
    last_epoch = recipe.epochs if stop_epoch is None else min(stop_epoch, recipe.epochs)
    for epoch in range(1, last_epoch + 1):
        rec = _train_epoch(run, plan, optim, rng.permutation(len(plan.units)), epoch)
        if plan.val is not None:
            score, vloss = run.validate(plan.val_plan, plan.val)
            rec["val"], rec["val_loss"] = round(score, 5), round(vloss, 5)
            sel.update(run, epoch, score, vloss)
        history.append(rec)
        msg = _epoch_line(rec, lr, last_epoch, plan.metric, refit=stop_epoch is not None)
        logger.info(msg)
        if progress is not None:
            progress(msg)
        # patience counts from the end of the warm-up: a score flat at chance while the lr still rises says nothing
        if warm_epoch is None and optim.warm:
            warm_epoch = epoch
        if plan.val is not None and sel.out_of_patience(epoch, warm_epoch, recipe.patience):
            logger.info("early stop after epoch %d: best val %s %.4f at epoch %d", epoch, plan.metric,
                        sel.best["score"], sel.best["epoch"])
            break
    return _trial_facts(run, plan, lr, sel, history, optim.steps, t0)


def _trial_facts(run, plan, lr: float, sel: _Selection, history: list[dict], steps: int, t0: float) -> dict:
    """What :func:`train_trial` returns: what validation chose, the last losses, the history and the best state."""
    best = sel.best
    if plan.val is None:  # nothing to choose on: the last state
        best = {"score": math.nan, "epoch": len(history), "state": run.net.trainable_state()}
    return {
        "lr": lr,
        "val_score": best["score"],
        "val_loss": best.get("loss", math.nan),
        "best_epoch": best["epoch"],
        "least_loss_epoch": sel.least_loss_epoch,
        "epochs_run": len(history),
        "steps": steps,
        "train_loss": history[-1]["train_loss"] if history else None,
        "aux_lm_loss": history[-1].get("aux_lm_loss") if history else None,
        "history": history,
        "seconds": round(time.time() - t0, 2),
        "state": best["state"],
    }


def fit_trials(
    run, plan, progress: Callable[[str], None] | None = None, start: dict[str, torch.Tensor] | None = None
) -> dict:
    """One trial per learning rate of ``cfg.lr_grid`` (or the recipe's one lr), each from the same start;
    the run ends in the state of the best trial's best epoch.  Returns that trial's facts plus
    ``trials``: ``[{"lr", "val_score", "best_epoch"}]``."""
    lrs = run.cfg.lr_grid or [run.recipe.lr]
    if start is None and len(lrs) > 1:
        start = snapshot(run.model)
    trials = []
    best = None
    for i, lr in enumerate(lrs):
        if i > 0:
            run.model.load_state_dict(start)
        out = train_trial(run, plan, lr, progress)
        trials.append({"lr": lr, "val_score": round(out["val_score"], 5), "best_epoch": out["best_epoch"]})
        if best is None or (out["val_score"], -out["val_loss"]) > (best["val_score"], -best["val_loss"]):
            best = out
        else:
            out["state"] = None
    run.net.load_trainable_state(best.pop("state"))
    best["trials"] = trials
    return best
