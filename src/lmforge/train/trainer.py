"""One Trainer for every family: it knows models only through ``model(**batch) -> ModelOutput``.

What a step does (``B`` = ``batch_size`` per process, ``W`` = world size, ``A`` = ``grad_accum``)::

    for micro-batch m in 0..A-1:
        rows g = m*B*W + rank*B + j  (j in 0..B-1)   # the global row index of this process's rows
        rng_g = np.random.default_rng([seed, 0, step, g])
        batch = sampler.batch([rng_g ...], "train")   # each row is a pure function of its rng
        (model(**batch).loss / A).backward()          # DDP averages the gradients over ranks
    clip the gradient norm, AdamW step, scheduler step

so the global batch of a step is the same set of rows whatever ``W`` and ``A`` are (DDP with 2x B
rows equals one process with 2B rows), and the data cursor of a checkpoint is just the step.
Validation rows use ``[seed, 1, eval_batch, row]``: the same rows at every evaluation.

The pieces around the loop live beside it: the row seeding in :mod:`~lmforge.train.rows`, validation in
:mod:`~lmforge.train.evaluation`, the checkpoint's contents in :mod:`~lmforge.train.run_state`, and
``metrics.jsonl`` in :mod:`~lmforge.train.metrics_log`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..cpu_quota import AutoThreads, auto_threads
from ..devices import Compute
from ..errors import LmforgeError
from ..nn.cpu_share import advise_threads
from ..storage.files import save_safetensors
from ..utils import check_memory
from . import checkpoint as ckpt
from . import compute as steps
from . import precision as prec
from . import run_state
from .config import TrainConfig, format_duration
from .distributed import (
    DistEnv,
    all_gather_objects,
    any_rank,
    barrier,
    broadcast_flag,
    cleanup,
    init_distributed,
    wrap_model,
)
from .evaluation import evaluate
from .metrics_log import Interval, MetricsLog, warn_if_over_budget
from .parameters import LossOnly, param_groups, unused_parameters
from .rows import count_tokens, first_row, row_rngs
from .schedule import make_scheduler

logger = logging.getLogger(__name__)

@dataclasses.dataclass
class TrainResult:
    """What :meth:`Trainer.train` returns.

    Attributes:
        step: optimizer steps done in total (incl. earlier runs when resumed).
        tokens_seen: training tokens consumed in total, over all processes.
        stop_reason: ``"max_steps"`` or ``"max_time"``.
        val: the final validation metrics (``loss``, ``ppl``, the model's metrics and their ``*_ppl``).
        train_loss: mean training loss of the last logging interval (``nan`` if no step was run).
        elapsed: training seconds in total (incl. earlier runs).
        out_dir: the model folder.
    """

    step: int
    tokens_seen: int
    stop_reason: str
    val: dict[str, float]
    train_loss: float
    elapsed: float
    out_dir: Path


@dataclasses.dataclass
class _Done:
    """The steps at which the loop last logged, evaluated and saved, and the last validation metrics."""

    log: int = -1
    eval: int = -1
    save: int = -1
    val: dict[str, float] | None = None


class Trainer:
    """Train any lmforge model with AdamW, a warm-up/decay schedule, evaluation, checkpoints and DDP.

    Args:
        model: a module whose ``forward(**batch)`` returns an object with ``.loss`` (scalar) and
            ``.metrics`` (dict of detached scalars), e.g. :class:`lmforge.models.base.ModelOutput`.
        sampler: has ``batch(rngs: list[np.random.Generator], split: str) -> dict[str, Tensor]``,
            one row per rng (see the module docstring).
        config: the :class:`TrainConfig`.
        out_dir: the model folder: ``metrics.jsonl``, ``training_curves.png``, ``training_state/`` and
            the model itself (``model.save_pretrained(out_dir, tokenizer)``) are written there.
        tokenizer: saved with the model so that the folder is complete.
        progress: show a tqdm bar on stderr (rank 0 only); ``None`` = only when stderr is a terminal.
        plot: draw ``training_curves.png`` at the end (rank 0).

    Under ``torchrun`` the trainer joins the process group itself (gloo on CPU, NCCL on GPU), wraps
    the model in DDP, and only rank 0 writes files, logs and shows progress.

    ``compute`` is the command's device and precision (:class:`lmforge.devices.Compute`); without it they are
    resolved here from ``config.device`` and ``config.precision``.  A pending ``auto`` is settled here for the
    model (:func:`lmforge.train.precision.settle`) and logged; ``self.config`` holds the concrete choice, so the
    saved training state repeats it.
    """

    def __init__(
        self,
        model: nn.Module,
        sampler: Any,
        config: TrainConfig,
        out_dir: str | Path,
        tokenizer: Any = None,
        progress: bool | None = None,
        plot: bool = True,
        compute: Compute | None = None,
    ):
        self.plot = plot
        self.sampler = sampler
        self.out_dir = Path(out_dir)
        self.tokenizer = tokenizer
        self.progress = progress
        compute = compute or prec.resolve_compute(config.device, config.precision)
        self.env: DistEnv = init_distributed(compute.device)
        self.device = self.env.device
        check_batch_fits(model, sampler, config.batch_size, self.device)
        self.model = model.to(self.device)
        self.threads = self._settle_threads()  # before the precision probe, which times steps at this count
        self.config = config
        self.compute = compute = self._settle(compute)
        self.precision_line = prec.describe(compute.requested, compute.precision, self.device, compute.reason)
        self.config = config = dataclasses.replace(config, precision=compute.precision)
        self._log(logging.INFO, "%s", self.precision_line)
        self.scaler = prec.grad_scaler(self.device, compute.precision)  # fp16 on CUDA only
        self.ddp_model = self._wrap_model()
        groups, self.param_names = param_groups(self.model, config.weight_decay)
        if not self.param_names:
            raise LmforgeError("the model has no trainable parameters")
        betas = (config.beta1, config.beta2)
        self.optimizer = steps.make_optimizer(groups, config.lr, betas, config.eps, self.device)
        self._prefetched: tuple[int, list[tuple[dict[str, Any], int]]] | None = None  # (step, its micro-batches)
        self.scheduler = make_scheduler(self.optimizer, config)
        self.step = 0
        self.tokens_seen = 0
        self.elapsed_before = 0.0  # training seconds of earlier (resumed) runs
        self.metrics = MetricsLog(self.out_dir, self.is_main, config.log == "tensorboard")
        self.history: list[dict[str, Any]] = self.metrics.history  # every event written to metrics.jsonl
        self.interval = Interval(self.device)  # loss, steps and tokens since the last train event

    # -- small helpers ---------------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        return self.env.is_main

    def _log(self, level: int, msg: str, *args: Any) -> None:
        """Log from rank 0 only (every rank would say the same)."""
        if self.is_main:
            logger.log(level, msg, *args)

    def _autocast(self):
        return prec.autocast(self.device, self.config.precision)

    def _to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        return steps.to_device(batch, self.device)

    def _rngs(self, split: str, outer: int, first: int) -> list[np.random.Generator]:
        """One generator per row of this process: ``[seed, 0|1, step|eval_batch, global_row]``."""
        return row_rngs(self.config.seed, split, outer, first, self.config.batch_size)

    def _settle_threads(self) -> AutoThreads | None:
        """On a CPU, torch's threads for the CPUs other processes leave free, re-checked between steps, where the
        ``lmforge`` command left the choice to lmforge (:mod:`lmforge.cpu_quota`); else a warning when other
        processes hold cores the threads count on."""
        if self.device.type != "cpu":
            return None
        auto = auto_threads()
        line = auto.settle() if auto is not None else advise_threads(torch.get_num_threads())
        if line:
            self._log(logging.INFO if auto is not None else logging.WARNING, "%s", line)
        return auto

    def _settle(self, compute: Compute) -> Compute:
        """``compute`` with a pending ``auto`` chosen for this model: a few timed steps of both precisions on the
        first micro-batch (rank 0's choice holds for every rank)."""
        if not compute.pending:
            return compute
        first_rows = first_row(0, self.config.batch_size, self.env)

        def batch() -> dict[str, Any]:
            return self._to_device(self.sampler.batch(self._rngs("train", 0, first_rows), "train"))

        tokens = count_tokens(self.sampler.batch(self._rngs("train", 0, first_rows), "train"))
        with steps.probing(self.model, self.device):
            settled = prec.settle(compute, self.model, steps.precision_probe(self.model, batch, self.device), tokens)
        if self.env.distributed:
            bf16 = broadcast_flag(settled.precision == "bf16", self.env)
            if bf16 != (settled.precision == "bf16"):
                settled = dataclasses.replace(settled, precision="bf16" if bf16 else "fp32",
                                              reason="as measured by rank 0", speedup=None)
        return settled

    def _wrap_model(self) -> nn.Module:
        """The training forward: the loss alone, in DDP under torchrun, compiled with ``compile``."""
        def first_batch() -> dict[str, Any]:  # this rank's first training micro-batch
            rngs = self._rngs("train", 0, first_row(0, self.config.batch_size, self.env))
            return self._to_device(self.sampler.batch(rngs, "train"))

        unused = unused_parameters(self.model, first_batch, self._autocast, self.device) if self.env.distributed else []
        if unused:
            self._log(
                logging.INFO,
                "%d parameter(s) get no gradient from the loss (%s%s): DDP will look for unused parameters",
                len(unused),
                ", ".join(unused[:3]),
                ", ..." if len(unused) > 3 else "",
            )
        ddp_model = wrap_model(LossOnly(self.model), self.env, find_unused_parameters=any_rank(bool(unused), self.env))
        return steps.compile_model(ddp_model) if self.config.compile else ddp_model

    def _elapsed(self) -> float:
        return self.elapsed_before + (time.monotonic() - self._t_start)

    # -- one optimizer step ----------------------------------------------------------------------
    def _step_batches(self, step: int) -> list[tuple[dict[str, Any], int]]:
        """The micro-batches of optimizer step ``step`` on the device, each with its token count."""
        cfg = self.config
        out = []
        for m in range(cfg.grad_accum):
            batch = self.sampler.batch(self._rngs("train", step, first_row(m, cfg.batch_size, self.env)), "train")
            out.append((self._to_device(batch), count_tokens(batch)))
        return out

    def _train_step(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run one optimizer step; returns this process's mean loss (detached) and the grad norm.

        Nothing is read back from the device here (the loss and the norm stay tensors until a log step),
        so on a GPU the host runs ahead: once this step's work is queued it builds the next step's batches
        (pinned, copied without blocking) while the GPU computes.
        """
        cfg, env = self.config, self.env
        accum = cfg.grad_accum
        pre, self._prefetched = self._prefetched, None
        batches = pre[1] if pre is not None and pre[0] == self.step else self._step_batches(self.step)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        for m, (batch, n_tokens) in enumerate(batches):
            self.interval.add_tokens(n_tokens)
            # Gradients are all-reduced only on the last micro-batch of the step.
            sync = env.distributed and m < accum - 1
            with self.ddp_model.no_sync() if sync else contextlib.nullcontext():
                with self._autocast():
                    loss = self.ddp_model(**batch)
                scaled = loss / accum
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            loss_sum += loss.detach().float()
        self._step_lr = self.optimizer.param_groups[0]["lr"]  # the lr this step uses (decayed group's)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients
        grad_norm = None
        if cfg.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skips the step when fp16 gradients overflowed
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        if self.step + 1 < cfg.max_steps:
            self._prefetched = (self.step + 1, self._step_batches(self.step + 1))
        return loss_sum / accum, grad_norm

    def evaluate(self, split: str = "val") -> dict[str, float]:
        """Mean ``loss`` and model metrics over ``eval_batches`` fixed global batches of ``split`` (all ranks);
        see :func:`lmforge.train.evaluation.evaluate`."""
        return evaluate(self.model, self.sampler, self.config, self.env, self.device, split)

    # -- checkpoints -----------------------------------------------------------------------------
    def save_model(self) -> None:
        """Write the model folder (rank 0); every process must call it."""
        if not self.is_main:
            return
        if hasattr(self.model, "save_pretrained"):
            self.model.save_pretrained(self.out_dir, self.tokenizer)
        else:
            save_safetensors(self.model.state_dict(), self.out_dir / "model.safetensors")

    def _diverged(self, what: str) -> LmforgeError:
        return run_state.diverged_error(what, self.step, self.config.lr, self.out_dir)

    def save_checkpoint(self) -> None:
        """Write ``training_state/`` atomically, then the model folder.  Collective: call on every rank.

        Non-finite weights are never written: a NaN or infinity in any parameter, or weights whose
        loss on the next batch is not finite, raise a one-line error instead, and the previous
        (finite) checkpoint stays in place (:mod:`lmforge.train.run_state` says what the state holds).
        """
        bad = run_state.nonfinite_parameter(self.model, self.env)
        if bad is not None:
            raise self._diverged(f"the weights became non-finite ({bad} holds NaN or infinity)")
        if not run_state.loss_is_finite(self.model, self.sampler, self.config, self.env, self.device, self.step):
            raise self._diverged("the weights give a non-finite loss")
        self.tokens_seen += self.interval.take_tokens(self.env)
        rngs = all_gather_objects(ckpt.rng_states(), self.env)
        if self.is_main:
            files, state = run_state.state_files(self, rngs, self._elapsed())
            ckpt.write_state_dir(self.out_dir, files, state)
            self.save_model()
            logger.debug("checkpoint at step %d written to %s", self.step, self.out_dir / ckpt.STATE_DIR)
        barrier(self.env)

    def load_checkpoint(self) -> None:
        """Restore everything :meth:`save_checkpoint` wrote; the next step continues the run exactly.

        Hyperparameters come from the *current* config (so ``--set lr=...`` on resume takes effect
        from there); with an unchanged config the run is bit-identical to an uninterrupted one.
        """
        path = run_state.restore(self)
        self._log(logging.INFO, "resumed from %s at step %d (%d tokens seen)", path, self.step, self.tokens_seen)

    # -- the loop --------------------------------------------------------------------------------
    def train(self, resume: bool = False) -> TrainResult:
        """Train until ``max_steps`` (or ``max_time``), evaluating, logging and checkpointing on the way.

        Args:
            resume: continue from ``out_dir/training_state`` (exactly: same batches, same dropout).
        Returns:
            A :class:`TrainResult` with the final validation metrics.
        """
        self._t_start = time.monotonic()
        self._begin(resume)
        bar = self._progress_bar()
        self.model.train()
        self.interval.restart()
        self._last_train_loss = float("nan")
        with contextlib.ExitStack() as stack:
            if not bar.disable:  # log lines are written above the bar instead of through it
                stack.enter_context(logging_redirect_tqdm(loggers=[logging.getLogger("lmforge")]))
            stack.callback(bar.close)
            stop_reason, done = self._run_steps(bar)
        val = self._finish(stop_reason, done)
        return TrainResult(
            step=self.step,
            tokens_seen=self.tokens_seen,
            stop_reason=stop_reason,
            val=val,
            train_loss=self._last_train_loss,
            elapsed=self._elapsed(),
            out_dir=self.out_dir,
        )

    def _begin(self, resume: bool) -> None:
        """Load the training state to resume from, or start the metrics afresh with dropout seeded for step 0."""
        if resume:
            self.load_checkpoint()
            self.metrics.truncate_after(self.step)
        else:
            run_state.seed_dropout(self.config.seed, 0, self.env.rank)
            self.metrics.start_fresh()
        if self.step >= self.config.max_steps:
            self._log(logging.INFO, "already at step %d >= max_steps %d: nothing to train", self.step,
                      self.config.max_steps)

    def _progress_bar(self) -> Any:
        """The tqdm bar of the run (rank 0; shown when asked, or on a terminal); the bar shows the loss."""
        if not self.is_main or self.progress is False:
            disable: bool | None = True
        else:
            disable = False if self.progress else None  # None: tqdm shows it only on a terminal
        bar = tqdm(
            total=self.config.max_steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True,
            disable=disable,
        )
        self._train_log_level = logging.DEBUG if not bar.disable else logging.INFO  # the bar shows the loss
        return bar

    def _run_steps(self, bar: Any) -> tuple[str, _Done]:
        """Step until ``max_steps`` or the time budget; returns why it stopped and what it last did."""
        cfg, done = self.config, _Done()
        while self.step < cfg.max_steps:
            loss, grad_norm = self._train_step()
            self.step += 1
            bar.update(1)
            self.interval.add_step(loss)
            self._due_events(grad_norm, bar, done)
            if self.threads is not None and (line := self.threads.poll()):  # a clock read between looks
                self._log(logging.INFO, "%s", line)
            if cfg.max_time is not None:
                out_of_time = broadcast_flag(time.monotonic() - self._t_start >= cfg.max_time, self.env)
                if out_of_time and self.step < cfg.max_steps:
                    return "max_time", done
        return "max_steps", done

    def _due_events(self, grad_norm: torch.Tensor | None, bar: Any, done: _Done) -> None:
        """Log, evaluate and checkpoint where this step is due for them."""
        cfg = self.config
        if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
            self._log_train(grad_norm, bar)
            done.log = self.step
        if cfg.eval_every and self.step % cfg.eval_every == 0:
            done.val = self._eval_and_log()
            done.eval = self.step
        if cfg.save_every and self.step % cfg.save_every == 0:
            self.save_checkpoint()
            done.save = self.step
        if self.step in (done.eval, done.save):  # time spent there is not training throughput
            self.interval.restart_clock()

    def _finish(self, stop_reason: str, done: _Done) -> dict[str, float]:
        """Log, evaluate and save the last step where the loop did not; returns the final validation metrics."""
        cfg = self.config
        if done.log != self.step and self.interval.steps:
            self._log_train(None, None)
        val = done.val
        if done.eval != self.step or val is None:
            val = self._eval_and_log()
        if done.save != self.step:
            self.save_checkpoint()
        if stop_reason == "max_time":
            self._log(
                logging.WARNING,
                "time budget of %s reached at step %d of %d: checkpoint saved in %s; "
                "continue with --resume (and a new --max-time)",
                format_duration(cfg.max_time),
                self.step,
                cfg.max_steps,
                self.out_dir,
            )
        self.metrics.finish(self.plot)
        return val

    # -- what the loop logs ----------------------------------------------------------------------
    def _log_train(self, grad_norm: torch.Tensor | None, bar: Any) -> None:
        """Average the interval's loss over steps and ranks, count tokens/s, append a train event."""
        loss, tokens, tps, dt = self.interval.close(self.env)
        if not math.isfinite(loss):
            raise self._diverged(f"the training loss became {loss}")
        self.tokens_seen += tokens
        lr = self._step_lr
        event = {
            "step": self.step,
            "split": "train",
            "loss": loss,
            "metrics": {} if grad_norm is None else {"grad_norm": float(grad_norm)},
            "lr": lr,
            "tokens_per_s": tps,
            "tokens": self.tokens_seen,
            "elapsed": self._elapsed(),
        }
        self.metrics.write(event)
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tps:,.0f}", refresh=False)
        self._log(self._train_log_level, "step %d | loss %.4f | lr %.3g | %.0f tok/s", self.step, loss, lr, tps)
        if self.config.max_time and self.is_main and not getattr(self, "_warned_budget", False):
            self._warned_budget = True
            seconds_left = self.config.max_time - (time.monotonic() - self._t_start)
            warn_if_over_budget(self.config, self.step, seconds_left, dt / self.interval.steps)
        self._last_train_loss = loss
        self.interval.restart()

    def _eval_and_log(self) -> dict[str, float]:
        val = self.evaluate()
        event = {
            "step": self.step,
            "split": "val",
            "loss": val["loss"],
            "metrics": {k: v for k, v in val.items() if k != "loss"},
            "lr": getattr(self, "_step_lr", self.optimizer.param_groups[0]["lr"]),
            "tokens": self.tokens_seen,
            "elapsed": self._elapsed(),
        }
        self.metrics.write(event)
        self._log(logging.INFO, "step %d | val %s", self.step, " | ".join(f"{k} {v:.4g}" for k, v in val.items()))
        return val

    def close(self) -> None:
        """Leave the process group if this trainer joined it (call once at the very end)."""
        cleanup(self.env)


def check_batch_fits(model: nn.Module, sampler: Any, batch_size: int, device: torch.device) -> None:
    """Refuse a batch size whose rows cannot be held where the model computes, before a row is drawn.

    The bound is one that every family's forward pass needs at least: the rows' ids (int64) and one (B, T, C)
    activation in 16 bits; so a batch that could fit is never refused, and a typo (``--batch-size 100000000``)
    is one line instead of memory growing until the machine swaps.
    """
    seq = getattr(sampler, "seq_len", None) or getattr(sampler, "max_seq_length", None)
    if not isinstance(seq, int):
        return
    cfg = getattr(model, "config", None)
    width = next((w for w in (getattr(cfg, k, None) for k in ("n_embd", "hidden_size", "projection_dim"))
                  if isinstance(w, int)), 0)
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    check_memory(batch_size * seq * (8 + 2 * width), f"a batch of {batch_size:,} rows of {seq} tokens",
                 "use a smaller batch size (--batch-size N, or --set batch_size=N)", free)
