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
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..config import to_dict
from ..errors import CheckpointError, LmforgeError
from ..utils import atomic_write_text, save_safetensors
from . import checkpoint as ckpt
from . import compute
from . import precision as prec
from .config import TrainConfig, format_duration
from .distributed import (
    DistEnv,
    all_gather_objects,
    all_reduce_sum,
    any_rank,
    barrier,
    broadcast_flag,
    cleanup,
    init_distributed,
    wrap_model,
)
from .schedule import make_scheduler, restore_scheduler, scheduler_state

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "training_curves.png"

# Parameters of these modules are never weight-decayed (their 1-D weights are scales, not maps).
_NORM_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm)
if hasattr(nn, "RMSNorm"):
    _NORM_TYPES = (*_NORM_TYPES, nn.RMSNorm)


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


def param_groups(model: nn.Module, weight_decay: float) -> tuple[list[dict], list[str]]:
    """AdamW parameter groups: decay for matrices, none for biases, norm weights and other 1-D tensors.

    Embedding and Linear weights (2-D) are decayed and so are conv kernels, as nanoGPT does; the
    1-D rule alone already spares biases and LayerNorm gains, and the explicit norm-module check
    keeps any norm parameter out of decay whatever its shape.  Frozen parameters are left out.

    Returns:
        ``(groups, names)``: the two groups (decayed first) and the parameter names in optimizer
        index order (the index used in the checkpoint's ``opt.<idx>.*`` keys).
    """
    norm_ids = {id(p) for m in model.modules() if isinstance(m, _NORM_TYPES) for p in m.parameters(recurse=False)}
    decay: list[tuple[str, nn.Parameter]] = []
    no_decay: list[tuple[str, nn.Parameter]] = []
    for name, p in model.named_parameters():  # shared (tied) parameters appear once
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or id(p) in norm_ids else decay).append((name, p))
    groups = [
        {"params": [p for _, p in decay], "weight_decay": weight_decay},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0},
    ]
    return groups, [n for n, _ in decay] + [n for n, _ in no_decay]


def count_tokens(batch: dict[str, Any]) -> int:
    """Tokens in a batch: the attention mask's sum when there is one, else ``input_ids.numel()``."""
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        return int(mask.sum())
    ids = batch.get("input_ids")
    if isinstance(ids, torch.Tensor):
        return ids.numel()
    for v in batch.values():  # e.g. ELMo character ids (B, T, max_chars): count positions
        if isinstance(v, torch.Tensor) and v.ndim >= 2:
            return v.shape[0] * v.shape[1]
    return 0


def _ppl(x: float) -> float:
    return math.exp(x) if x < 700 else float("inf")


def add_perplexities(metrics: dict[str, float]) -> dict[str, float]:
    """Add ``<name>_ppl = exp(<name>_loss)`` for every ``*_loss`` key, and ``ppl = exp(loss)``.

    ``ppl`` is left out when the model reports two or more ``*_loss`` parts: a loss that is a sum
    of parts (BERT's MLM + NSP, ELMo's forward + backward NLL) has no perplexity of its own, and
    the parts' perplexities (``mlm_ppl``, ``lm_ppl``) are the meaningful figures.
    """
    out = dict(metrics)
    if "loss" in metrics and sum(k.endswith("_loss") for k in metrics) < 2:
        out["ppl"] = _ppl(metrics["loss"])
    for k, v in metrics.items():
        if k.endswith("_loss"):
            out[k[: -len("_loss")] + "_ppl"] = _ppl(v)
    return out


class _LossOnly(nn.Module):
    """``model(**batch).loss`` as the whole forward output.

    DDP (with ``find_unused_parameters``) walks the autograd graph from every tensor a forward returns;
    logits that the loss does not use (BERT's NSP head when ``next_sentence=false``) would make their
    parameters look used and the gradient reduction would wait for them forever.  Returning only the
    loss avoids that, and the trainer needs nothing else from a training forward.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, **batch: Any) -> torch.Tensor:
        loss = getattr(self.model(**batch), "loss", None)
        if loss is None:
            raise LmforgeError("the model returned no loss: does the sampler produce labels?")
        return loss


def _row_seed_seq(seed: int, *path: int) -> np.random.Generator:
    return np.random.default_rng([seed, *path])


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

    ``config.precision`` ``auto`` is resolved here for the device (:mod:`lmforge.train.precision`) and
    logged; ``self.config`` holds the resolved choice, so the saved training state repeats it.
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
    ):
        self.plot = plot
        self.sampler = sampler
        self.out_dir = Path(out_dir)
        self.tokenizer = tokenizer
        self.progress = progress
        self.env: DistEnv = init_distributed(config.device)
        self.device = self.env.device
        self.model = model.to(self.device)
        self.config = config
        choice = self._choose_precision(config.precision)
        self.precision_line = prec.describe(config.precision, choice.precision, self.device, choice.reason)
        self.config = config = dataclasses.replace(config, precision=choice.precision)
        self._log(logging.INFO, "%s", self.precision_line)
        self.scaler = prec.grad_scaler(self.device, choice.precision)  # fp16 on CUDA only
        unused = self._unused_parameters() if self.env.distributed else []
        if unused:
            self._log(
                logging.INFO,
                "%d parameter(s) get no gradient from the loss (%s%s): DDP will look for unused parameters",
                len(unused),
                ", ".join(unused[:3]),
                ", ..." if len(unused) > 3 else "",
            )
        self.ddp_model = wrap_model(
            _LossOnly(self.model), self.env, find_unused_parameters=any_rank(bool(unused), self.env)
        )
        if config.compile:
            self.ddp_model = compute.compile_model(self.ddp_model)
        groups, self.param_names = param_groups(self.model, config.weight_decay)
        if not self.param_names:
            raise LmforgeError("the model has no trainable parameters")
        betas = (config.beta1, config.beta2)
        self.optimizer = compute.make_optimizer(groups, config.lr, betas, config.eps, self.device)
        self._prefetched: tuple[int, list[tuple[dict[str, Any], int]]] | None = None  # (step, its micro-batches)
        self.scheduler = make_scheduler(self.optimizer, config)
        self.step = 0
        self.tokens_seen = 0
        self.elapsed_before = 0.0  # training seconds of earlier (resumed) runs
        self.history: list[dict[str, Any]] = []  # every event written to metrics.jsonl (rank 0)
        self._pending_tokens = 0  # this process's tokens not yet summed over ranks
        self._tps_tokens = 0  # this process's tokens since the throughput clock was last reset

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
        return compute.to_device(batch, self.device)

    def _choose_precision(self, requested: str) -> prec.PrecisionChoice:
        """``--precision`` for this model on this device; ``auto`` may time a few steps of both (rank 0's
        choice holds for every rank)."""
        first_rows = self.env.rank * self.config.batch_size

        def batch() -> dict[str, Any]:
            return self._to_device(self.sampler.batch(self._rngs("train", 0, first_rows), "train"))

        tokens = None
        if requested == "auto" and self.device.type == "cpu" and prec.native_bf16(self.device):
            tokens = count_tokens(self.sampler.batch(self._rngs("train", 0, first_rows), "train"))
        with compute.probing(self.model, self.device):
            step = compute.precision_probe(self.model, batch, self.device)
            choice = prec.choose_precision(requested, self.device, self.model, step, tokens)
        if self.env.distributed and requested == "auto":
            bf16 = broadcast_flag(choice.precision == "bf16", self.env)
            if bf16 != (choice.precision == "bf16"):
                choice = prec.PrecisionChoice("bf16" if bf16 else "fp32", "as measured by rank 0")
        return choice

    def _rngs(self, split: str, outer: int, first_row: int) -> list[np.random.Generator]:
        """One generator per row of this process: ``[seed, 0|1, step|eval_batch, global_row]``."""
        tag = 0 if split == "train" else 1
        b = self.config.batch_size
        return [_row_seed_seq(self.config.seed, tag, outer, first_row + j) for j in range(b)]

    def _write_event(self, event: dict[str, Any]) -> None:
        self.history.append(event)
        if not self.is_main:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / METRICS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")
        if self.config.log == "tensorboard":  # the same event as TensorBoard scalars, beside metrics.jsonl
            from .tblog import log_event

            log_event(self.out_dir, event)

    def _flush_tokens(self) -> None:
        t = torch.tensor([float(self._pending_tokens)], dtype=torch.float64, device=self.device)
        self.tokens_seen += int(all_reduce_sum(t, self.env).item())
        self._pending_tokens = 0

    def _unused_parameters(self) -> list[str]:
        """Names of trainable parameters that one probe forward/backward leaves without a gradient.

        Runs on this rank's first training micro-batch under a forked RNG, then clears the gradients,
        so the training run itself is unchanged.
        """
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            batch = self.sampler.batch(self._rngs("train", 0, self.env.rank * self.config.batch_size), "train")
            with self._autocast():
                out = self.model(**self._to_device(batch))
            if getattr(out, "loss", None) is None:
                raise LmforgeError("the model returned no loss: does the sampler produce labels?")
            out.loss.backward()
        names = [n for n, p in self.model.named_parameters() if p.requires_grad and p.grad is None]
        self.model.zero_grad(set_to_none=True)
        return names

    # -- one optimizer step ----------------------------------------------------------------------
    def _step_batches(self, step: int) -> list[tuple[dict[str, Any], int]]:
        """The micro-batches of optimizer step ``step`` on the device, each with its token count."""
        cfg, env = self.config, self.env
        out = []
        for m in range(cfg.grad_accum):
            first_row = m * cfg.batch_size * env.world_size + env.rank * cfg.batch_size
            batch = self.sampler.batch(self._rngs("train", step, first_row), "train")
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
            self._pending_tokens += n_tokens
            self._tps_tokens += n_tokens
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

    # -- evaluation ------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, split: str = "val") -> dict[str, float]:
        """Mean ``loss`` and model metrics over ``eval_batches`` fixed global batches of ``split`` (all ranks).

        Each eval batch holds ``batch_size * grad_accum * world_size`` rows, seeded
        ``[seed, 1, eval_batch, global_row]``; micro-batch means are averaged (equal weights).

        Returns:
            ``{"loss", "ppl", <metric>, <name>_ppl for each <name>_loss}`` as floats.
        """
        cfg, env = self.config, self.env
        was_training = self.model.training
        self.model.eval()
        sums: dict[str, torch.Tensor] = {}
        # Evaluation must not move the training RNG, or eval_every would change the training run.
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            for b in range(cfg.eval_batches):
                # An eval batch has the rows of a global training batch, split over ranks and micro-batches
                # the same way, so validation sees the same rows however the global batch is divided.
                for m in range(cfg.grad_accum):
                    first_row = m * cfg.batch_size * env.world_size + env.rank * cfg.batch_size
                    batch = self.sampler.batch(self._rngs("val", b, first_row), split)
                    with self._autocast():
                        out = self.model(**self._to_device(batch))
                    if out.loss is None:
                        raise LmforgeError("the model returned no validation loss: does the sampler produce labels?")
                    values = {"loss": out.loss, **(getattr(out, "metrics", None) or {})}
                    for k, v in values.items():
                        v = torch.as_tensor(v, device=self.device).detach().float().reshape(())
                        sums[k] = sums[k] + v if k in sums else v
        self.model.train(was_training)
        keys = sorted(sums)
        total = all_reduce_sum(torch.stack([sums[k] for k in keys]).double(), self.env)
        n = cfg.eval_batches * cfg.grad_accum * env.world_size
        means = {k: float(total[i].item()) / n for i, k in enumerate(keys)}
        return add_perplexities(means)

    # -- checkpoints -----------------------------------------------------------------------------
    def save_model(self) -> None:
        """Write the model folder (rank 0); every process must call it."""
        if not self.is_main:
            return
        if hasattr(self.model, "save_pretrained"):
            self.model.save_pretrained(self.out_dir, self.tokenizer)
        else:
            save_safetensors(self.model.state_dict(), self.out_dir / "model.safetensors")

    def _nonfinite_parameter(self) -> str | None:
        """The name of the first parameter holding NaN or infinity (over all ranks), or ``None``."""
        bad = None
        for name, p in self.model.named_parameters():
            if p.is_floating_point() and not bool(torch.isfinite(p.detach()).all()):
                bad = name
                break
        return bad if any_rank(bad is not None, self.env) else None

    @torch.no_grad()
    def _loss_is_finite(self) -> bool:
        """Whether the current weights give a finite loss on the next step's first micro-batch (all ranks).

        Weights can be finite yet already unusable (attention scores that overflow): such a state
        must not become the checkpoint a ``--resume`` starts from.  One forward in eval mode, on a
        forked RNG, so the training run itself is unchanged.
        """
        was_training = self.model.training
        self.model.eval()
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            batch = self.sampler.batch(self._rngs("train", self.step, self.env.rank * self.config.batch_size), "train")
            with self._autocast():
                loss = getattr(self.model(**self._to_device(batch)), "loss", None)
        self.model.train(was_training)
        ok = loss is None or bool(torch.isfinite(loss.detach().float()).all())
        return not any_rank(not ok, self.env)

    def _diverged(self, what: str) -> LmforgeError:
        """The error for a run whose loss or weights became non-finite: how to resume with a lower lr."""
        lower = f"{self.config.lr / 10:g}"
        state = ckpt.find_state_dir(self.out_dir)
        if state is not None:
            try:
                saved = int(json.loads((state / "state.json").read_text(encoding="utf-8"))["step"])
            except (OSError, ValueError, KeyError, TypeError):
                saved = None
            at = f" (step {saved})" if saved is not None else ""
            how = (f"the last finite checkpoint{at} in {self.out_dir} is kept: continue from it with a lower "
                   f"learning rate by adding --resume --set lr={lower} to the same command")
        else:
            how = f"no checkpoint was saved yet: start again with a lower learning rate, e.g. --set lr={lower}"
        return LmforgeError(
            f"{what} at step {self.step}; nothing non-finite was saved; {how} "
            f"(or raise warmup_steps, keep grad_clip on)"
        )

    def save_checkpoint(self) -> None:
        """Write ``training_state/`` atomically, then the model folder.  Collective: call on every rank.

        Non-finite weights are never written: a NaN or infinity in any parameter, or weights whose
        loss on the next batch is not finite, raise a one-line error instead, and the previous
        (finite) checkpoint stays in place.  The training state also
        records the model config, so a kill after the first state but before the model folder's
        ``config.json`` still leaves a folder that ``--resume`` continues.
        """
        bad = self._nonfinite_parameter()
        if bad is not None:
            raise self._diverged(f"the weights became non-finite ({bad} holds NaN or infinity)")
        if not self._loss_is_finite():
            raise self._diverged("the weights give a non-finite loss")
        self._flush_tokens()
        rngs = all_gather_objects(ckpt.rng_states(), self.env)
        if self.is_main:
            opt_tensors, opt_meta = ckpt.flatten_optimizer(self.optimizer.state_dict())
            rng_tensors = {f"rng.{kind}.{r}": t for r, st in enumerate(rngs) for kind, t in st.items()}
            state = {
                "step": self.step,
                "tokens_seen": self.tokens_seen,
                "elapsed": self._elapsed(),
                "world_size": self.env.world_size,
                "seed": self.config.seed,
                "scheduler": scheduler_state(self.scheduler),
                "optimizer": opt_meta,
                "param_names": self.param_names,
                "train_config": to_dict(self.config),
            }
            if self.scaler is not None:
                state["grad_scaler"] = self.scaler.state_dict()
            model_config = getattr(self.model, "config", None)
            if dataclasses.is_dataclass(model_config) and getattr(self.model, "model_type", None):
                state["model_config"] = {"model_type": self.model.model_type, **to_dict(model_config)}
            files = {
                "model.safetensors": self.model.state_dict(),
                "optimizer.safetensors": opt_tensors,
                "rng.safetensors": rng_tensors,
            }
            ckpt.write_state_dir(self.out_dir, files, state)
            self.save_model()
            logger.debug("checkpoint at step %d written to %s", self.step, self.out_dir / ckpt.STATE_DIR)
        barrier(self.env)

    def load_checkpoint(self) -> None:
        """Restore everything :meth:`save_checkpoint` wrote; the next step continues the run exactly.

        Hyperparameters come from the *current* config (so ``--set lr=...`` on resume takes effect
        from there); with an unchanged config the run is bit-identical to an uninterrupted one.
        """
        path, state, files = ckpt.read_state_dir(self.out_dir)
        where = f"the training state in {path}"
        if state.get("param_names") != self.param_names:
            raise CheckpointError(f"{where} was saved for a different model (its parameters differ from this config's)")
        try:
            self.model.load_state_dict(files["model.safetensors"])
            opt = ckpt.unflatten_optimizer(files["optimizer.safetensors"], state["optimizer"])
            self.optimizer.load_state_dict(opt)
        except (KeyError, ValueError, RuntimeError) as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(f"{where} does not fit this model: {msg}") from None
        cfg = self.config
        for group, wd in zip(self.optimizer.param_groups, (cfg.weight_decay, 0.0)):
            group.update(betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=wd, initial_lr=cfg.lr)
        if self.scaler is not None and "grad_scaler" in state:
            self.scaler.load_state_dict(state["grad_scaler"])
        n_groups = len(self.optimizer.param_groups)
        restore_scheduler(self.scheduler, {**state["scheduler"], "base_lrs": [cfg.lr] * n_groups})
        self.step = int(state["step"])
        self.tokens_seen = int(state["tokens_seen"])
        self.elapsed_before = float(state.get("elapsed", 0.0))
        rng = files["rng.safetensors"]
        keys = {kind: f"rng.{kind}.{self.env.rank}" for kind in ("cpu", "cuda")}
        mine = {kind: rng[key] for kind, key in keys.items() if key in rng}
        if int(state.get("world_size", 1)) == self.env.world_size and "cpu" in mine:
            ckpt.set_rng_states(mine)
        else:
            self._log(
                logging.WARNING,
                "checkpoint was written by %s process(es), this run has %d: dropout RNG reseeded, "
                "the data order is unchanged",
                state.get("world_size"),
                self.env.world_size,
            )
            self._seed_dropout(self.step)
        self._log(logging.INFO, "resumed from %s at step %d (%d tokens seen)", path, self.step, self.tokens_seen)

    def _seed_dropout(self, step: int) -> None:
        seed = int(np.random.SeedSequence([self.config.seed, 2, step, self.env.rank]).generate_state(1)[0])
        torch.manual_seed(seed)

    def _truncate_metrics(self) -> None:
        """On resume, drop events a killed run logged after its last checkpoint (they are redone)."""
        path = self.out_dir / METRICS_FILE
        if not self.is_main or not path.is_file():
            return
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by the kill
            if event.get("step", 0) <= self.step:
                kept.append(line)
                self.history.append(event)
        atomic_write_text(path, "".join(x + "\n" for x in kept))

    def _elapsed(self) -> float:
        return self.elapsed_before + (time.monotonic() - self._t_start)

    # -- the loop --------------------------------------------------------------------------------
    def train(self, resume: bool = False) -> TrainResult:
        """Train until ``max_steps`` (or ``max_time``), evaluating, logging and checkpointing on the way.

        Args:
            resume: continue from ``out_dir/training_state`` (exactly: same batches, same dropout).
        Returns:
            A :class:`TrainResult` with the final validation metrics.
        """
        from tqdm.auto import tqdm

        cfg, env = self.config, self.env
        self._t_start = time.monotonic()
        if resume:
            self.load_checkpoint()
            self._truncate_metrics()
        else:
            self._seed_dropout(0)
            if self.is_main:
                (self.out_dir / METRICS_FILE).unlink(missing_ok=True)
        if self.step >= cfg.max_steps:
            self._log(logging.INFO, "already at step %d >= max_steps %d: nothing to train", self.step, cfg.max_steps)

        if not self.is_main or self.progress is False:
            disable: bool | None = True
        else:
            disable = False if self.progress else None  # None: tqdm shows it only on a terminal
        bar = tqdm(
            total=cfg.max_steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True, disable=disable
        )
        self._train_log_level = logging.DEBUG if not bar.disable else logging.INFO  # the bar shows the loss
        self.model.train()
        stop_reason = "max_steps"
        self._interval_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self._interval_steps = 0
        self._interval_t, self._tps_tokens = time.monotonic(), 0
        self._last_train_loss = float("nan")
        last_log = last_eval = last_save = -1
        val: dict[str, float] | None = None
        with contextlib.ExitStack() as stack:
            if not bar.disable:  # log lines are written above the bar instead of through it
                from tqdm.contrib.logging import logging_redirect_tqdm

                stack.enter_context(logging_redirect_tqdm(loggers=[logging.getLogger("lmforge")]))
            stack.callback(bar.close)
            while self.step < cfg.max_steps:
                loss, grad_norm = self._train_step()
                self.step += 1
                bar.update(1)
                self._interval_loss += loss.double()
                self._interval_steps += 1
                if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                    self._log_train(grad_norm, bar)
                    last_log = self.step
                if cfg.eval_every and self.step % cfg.eval_every == 0:
                    val = self._eval_and_log()
                    last_eval = self.step
                if cfg.save_every and self.step % cfg.save_every == 0:
                    self.save_checkpoint()
                    last_save = self.step
                if self.step in (last_eval, last_save):  # time spent there is not training throughput
                    self._interval_t, self._tps_tokens = time.monotonic(), 0
                if cfg.max_time is not None:
                    out_of_time = broadcast_flag(time.monotonic() - self._t_start >= cfg.max_time, env)
                    if out_of_time and self.step < cfg.max_steps:
                        stop_reason = "max_time"
                        break

        if last_log != self.step and self._interval_steps:
            self._log_train(None, None)
        if last_eval != self.step or val is None:
            val = self._eval_and_log()
        if last_save != self.step:
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
        if self.is_main and self.config.log == "tensorboard":
            from .tblog import close

            close(self.out_dir)
        if self.is_main and self.plot:
            self._plot()
        return TrainResult(
            step=self.step,
            tokens_seen=self.tokens_seen,
            stop_reason=stop_reason,
            val=val,
            train_loss=self._last_train_loss,
            elapsed=self._elapsed(),
            out_dir=self.out_dir,
        )

    def _log_train(self, grad_norm: torch.Tensor | None, bar: Any) -> None:
        """Average the interval's loss over steps and ranks, count tokens/s, append a train event."""
        cfg, env = self.config, self.env
        counts = torch.tensor([self._pending_tokens, self._tps_tokens], dtype=torch.float64, device=self.device)
        stats = all_reduce_sum(torch.cat([self._interval_loss.reshape(1), counts]), env)
        loss = float(stats[0].item()) / (self._interval_steps * env.world_size)
        if not math.isfinite(loss):
            raise self._diverged(f"the training loss became {loss}")
        dt = max(time.monotonic() - self._interval_t, 1e-9)
        tps = float(stats[2].item()) / dt  # over all ranks
        self.tokens_seen += int(stats[1].item())
        self._pending_tokens = 0
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
        self._write_event(event)
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tps:,.0f}", refresh=False)
        self._log(self._train_log_level, "step %d | loss %.4f | lr %.3g | %.0f tok/s", self.step, loss, lr, tps)
        if cfg.max_time and self.is_main and not getattr(self, "_warned_budget", False):
            self._warned_budget = True
            self._warn_budget(dt / self._interval_steps)
        self._last_train_loss = loss
        self._interval_loss.zero_()
        self._interval_steps = 0
        self._interval_t, self._tps_tokens = time.monotonic(), 0

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
        self._write_event(event)
        self._log(logging.INFO, "step %d | val %s", self.step, " | ".join(f"{k} {v:.4g}" for k, v in val.items()))
        return val

    def _warn_budget(self, sec_per_step: float) -> None:
        cfg = self.config
        left = cfg.max_time - (time.monotonic() - self._t_start)
        fit = self.step + int(left / max(sec_per_step, 1e-9))
        if fit < cfg.max_steps:
            self._log(
                logging.WARNING,
                "at %.3g s/step the time budget of %s ends near step %d, before max_steps %d: the learning "
                "rate will not have decayed (set max_steps or decay_steps near %d to fit the schedule)",
                sec_per_step,
                format_duration(cfg.max_time),
                fit,
                cfg.max_steps,
                fit,
            )

    def _plot(self) -> None:
        from .plots import plot_metrics

        try:
            plot_metrics(self.out_dir / METRICS_FILE, self.out_dir / CURVES_FILE)
        except Exception as e:  # a plot must never cost a finished training run
            logger.warning("could not draw %s: %s", CURVES_FILE, e)

    def close(self) -> None:
        """Leave the process group if this trainer joined it (call once at the very end)."""
        cleanup(self.env)
