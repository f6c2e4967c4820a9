"""What the budget planner measures: the candidate shapes (parameters, tokens per optimizer step) and their
throughput on this machine, and the arithmetic that turns a budget into steps.

The probe trains a throw-away copy of a shape for a few optimizer steps (after one warm-up step) on the run's own
batches and precision; :mod:`lmforge.train.budget` turns its tokens/s into steps.  ``--precision auto`` is resolved
for the probed shape as the Trainer resolves it when the run starts (:func:`shape_precision`): the same function,
model shape and first batch, hence the same width rule and the same cached measurement, so the plan, the probe's
throughput and the run compute alike.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..config import apply_overrides, from_dict, to_dict
from ..families import get_family
from ..storage.writing import pid_alive
from . import compute
from .config import TrainConfig
from .parameters import param_groups
from .precision import PrecisionChoice, autocast, choose_precision, needs_model, resolve_device
from .pretrain import preset_config
from .rows import count_tokens, row_rngs

logger = logging.getLogger(__name__)

PROBE_FRACTION = 0.05  # the probe's share of a time budget
PROBE_MAX_SECONDS = 45.0  # ... and its ceiling
PROBE_STEPS = (2, 8)  # timed optimizer steps per candidate: at least, at most
PROBE_STEP_SECONDS = 4.0  # a candidate's timed steps stop once they took this long (after the minimum)
# share of the (budget - probe) kept for start-up, evaluation, checkpoints and the save, and for a machine that runs
# slower over an hour than in the probe's seconds (measured on one shared 2-core machine: docs/training.md "Budgets")
RESERVE = 0.25


@dataclasses.dataclass
class ProbeResult:
    """What a throughput probe measured for one candidate shape.

    Attributes:
        tokens_per_s: training tokens per second over the timed optimizer steps.
        steps: timed optimizer steps (after one warm-up step).
        seconds: wall time of the probe of this candidate, building, warm-up and choosing the precision included.
        precision: the precision the probe trained in and why (:func:`shape_precision`); ``None`` from a probe
            that does not say (word2vec's, a test's), for which the planner chooses it itself.
    """

    tokens_per_s: float
    steps: int
    seconds: float
    precision: PrecisionChoice | None = None


@dataclasses.dataclass
class Candidate:
    """One shape the planner considers: a preset (or the ``--config`` file) with the ``--set`` model keys."""

    name: str
    model: dict  # the model config fields (vocab_size etc. are replaced by the tokenizer at build time)
    params: int
    body_params: int  # params outside the embeddings and an untied output layer (what the plan's rule counts)
    tokens_per_step: float  # tokens of one optimizer step, counted on the first training batch
    seq_len: int
    recipe: dict | None = None  # the data recipe's fields (BERT, ELECTRA)

    def recipe_config(self, family: str):
        cls = get_family(family).recipe_class
        return from_dict(cls, self.recipe or {}) if cls is not None else None


#: probe(family, candidate, train_config, shards, max_seconds) -> ProbeResult
Probe = Callable[[str, Candidate, TrainConfig, Any, float], ProbeResult]


# -- candidates ------------------------------------------------------------------------------------------


def _module(family: str):
    return get_family(family)


def _is_trainer_family(module) -> bool:
    return module.trainer


def candidate_presets(family: str) -> list[str]:
    """The presets of ``family`` of the same kind as its default (same non-numeric config settings)."""
    fam = get_family(family)
    presets = list(fam.presets)
    default = fam.default_preset
    if default is None:
        return presets
    base = to_dict(preset_config(family, default))
    keys = [k for k, v in base.items() if isinstance(v, (str, bool))]
    out = []
    for name in presets:
        cfg = to_dict(preset_config(family, name))
        if all(cfg.get(k) == base[k] for k in keys):
            out.append(name)
    return out


def _first_rows(train: TrainConfig) -> list[np.random.Generator]:
    """The rows of the run's first micro-batch, as the Trainer draws them (seed, train, step 0, rows 0..B-1)."""
    return row_rngs(train.seed, "train", 0, 0, train.batch_size)


def _batch_shape(batch: dict) -> tuple[int, int]:
    """(tokens, seq_len) of a sampled batch."""
    seq = 0
    ids = batch.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.ndim >= 2:
        seq = int(ids.shape[1])
    else:
        for v in batch.values():
            if isinstance(v, torch.Tensor) and v.ndim >= 2:
                seq = int(v.shape[1])
                break
    return count_tokens(batch), seq


def _build(family: str, module, model_cfg, shards, tokenizer, recipe=None):
    """(model, sampler) of a Trainer family, or ``(None, None)`` for word2vec."""
    if not _is_trainer_family(module):
        return None, None
    return module.pretraining_setup(model_cfg, shards, tokenizer, recipe)


def body_parameters(model, vocab_size: int) -> int:
    """Parameters of ``model`` outside its embeddings: every ``nn.Embedding`` (tokens, positions,
    segments, characters) and every ``nn.Linear`` onto ``vocab_size`` outputs (an untied softmax) are left
    out; a weight shared by both is left out once."""
    skip: set[int] = set()
    for m in model.modules():
        if isinstance(m, nn.Embedding) or (isinstance(m, nn.Linear) and m.out_features == vocab_size):
            skip.update(id(p) for p in m.parameters())
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def _count_params(family: str, module, model_cfg, shards, tokenizer, recipe=None) -> tuple[int, int]:
    """(all parameters, body parameters) of a shape."""
    if not _is_trainer_family(module):
        # word2vec: one vector per vocabulary entry, nothing else (its body is its vectors)
        n = int(tokenizer.vocab_size) * int(getattr(model_cfg, "vector_size", 0))
        return n, n
    try:  # large presets are counted without allocating their weights
        with torch.device("meta"):
            model, _ = module.pretraining_setup(model_cfg, shards, tokenizer, recipe)
    except Exception:  # a model whose init needs real tensors
        model, _ = module.pretraining_setup(model_cfg, shards, tokenizer, recipe)
    total = sum(p.numel() for p in model.parameters())
    return total, max(1, body_parameters(model, int(tokenizer.vocab_size)))


def make_candidates(family: str, shards, train: TrainConfig, model=None, model_fields: dict | None = None,
                    name: str | None = None, recipe=None) -> list[Candidate]:
    """The shapes to consider, smallest first, with their parameters and tokens per optimizer step.

    ``model``: a preset name or a config object (named ``name``) is the one candidate; None: the family's
    presets of its default's kind.  ``model_fields`` are set on every candidate; ``recipe``: the data recipe
    (BERT, ELECTRA).
    """
    module = _module(family)
    tokenizer = shards.tokenizer()
    if model is None:
        shapes = [(n, preset_config(family, n)) for n in candidate_presets(family)]
    elif isinstance(model, str):
        shapes = [(model, preset_config(family, model))]
    else:
        shapes = [(name or "custom", model)]
    out = []
    for label, base in shapes:
        cfg = apply_overrides(base, dict(model_fields or {}))
        params, body = _count_params(family, module, cfg, shards, tokenizer, recipe)
        if _is_trainer_family(module):
            _, sampler = _build(family, module, cfg, shards, tokenizer, recipe)
            tokens, seq = _batch_shape(sampler.batch(_first_rows(train), "train"))
            tokens *= train.grad_accum
        else:
            tokens, seq = 0, 0
        out.append(Candidate(label, to_dict(cfg), params, body, float(tokens), seq,
                             to_dict(recipe) if recipe is not None else None))
    out.sort(key=lambda c: (c.body_params, c.params))
    return out


# -- the probe -----------------------------------------------------------------------------------------------


def measure_throughput(family: str, cand: Candidate, train: TrainConfig, shards, max_seconds: float) -> ProbeResult:
    """Time a few optimizer steps of ``cand`` on this machine (after one warm-up step).

    The probe trains a throw-away copy of the model with the Trainer's AdamW (fused where torch has the kernel)
    on the run's own batches (in the run's precision); it does not change the RNG streams of the run that follows.
    """
    t0 = time.perf_counter()
    module = _module(family)
    tokenizer = shards.tokenizer()
    if not _is_trainer_family(module):
        return _probe_word2vec(module, cand, shards, tokenizer, max_seconds, t0)
    cfg = from_dict(get_family(family).config_class, cand.model, ignore=("model_type",))
    device = resolve_device(train.device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model, sampler = module.pretraining_setup(cfg, shards, tokenizer, cand.recipe_config(family))
        model.to(device).train()
        choice = shape_precision(family, cand, train, shards, (model, sampler))
        precision = choice.precision
        groups, _ = param_groups(model, train.weight_decay)
        opt = compute.make_optimizer(groups, train.lr, (train.beta1, train.beta2), train.eps, device)  # the run's
        lo, hi = PROBE_STEPS
        timed_steps, tokens, t_start = 0, 0, 0.0
        for step in range(hi + 1):
            if step == 1:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t_start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            for m in range(train.grad_accum):
                rngs = [np.random.default_rng([train.seed, 0, step, m * train.batch_size + j])
                        for j in range(train.batch_size)]
                batch = sampler.batch(rngs, "train")
                if step > 0:
                    tokens += count_tokens(batch)
                batch = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
                with autocast(device, precision):
                    loss = model(**batch).loss
                (loss / train.grad_accum).backward()
            if train.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
            opt.step()
            if step == 0:
                continue
            timed_steps += 1
            if device.type == "cuda":
                torch.cuda.synchronize()
            took = time.perf_counter() - t_start
            if timed_steps >= lo and (took >= PROBE_STEP_SECONDS or time.perf_counter() - t0 >= max_seconds):
                break
        took = max(time.perf_counter() - t_start, 1e-9)
    return ProbeResult(tokens / took, timed_steps, time.perf_counter() - t0, choice)


def shape_precision(family: str, cand: Candidate, train: TrainConfig, shards,
                    built: tuple[nn.Module, Any] | None = None) -> PrecisionChoice:
    """``train.precision`` for the run of ``cand``, chosen as the Trainer chooses it when that run starts.

    The same call (:func:`lmforge.train.precision.choose_precision`) on a model of the shape, with the step the
    Trainer times (:func:`lmforge.train.compute.precision_probe` on the run's first training micro-batch) and the
    same token count, so a narrow shape gets fp32 by the width rule and a wide one the measurement cached for
    its shape, whoever asks first.  The RNG streams of the run are left as they were.

    Args:
        built: the shape's ``(model, sampler)``, the model on the run's device, when the caller has them (the
            probe); else they are built here, and only where the choice depends on the model.
    Raises:
        ConfigError: an unknown precision, or fp16 on a CPU.
    """
    device = resolve_device(train.device)
    module = _module(family)
    if not _is_trainer_family(module) or not needs_model(train.precision, device):
        return choose_precision(train.precision, device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if built is None:
            cfg = from_dict(get_family(family).config_class, cand.model, ignore=("model_type",))
            built = module.pretraining_setup(cfg, shards, shards.tokenizer(), cand.recipe_config(family))
            built[0].to(device).train()
        model, sampler = built
        tokens = count_tokens(sampler.batch(_first_rows(train), "train"))

        def batch() -> dict[str, Any]:
            return compute.to_device(sampler.batch(_first_rows(train), "train"), device)

        with compute.probing(model, device):
            return choose_precision(train.precision, device, model, compute.precision_probe(model, batch, device),
                                    tokens)


class _HeadShards:
    """The first ``n`` tokens (whole sentences) of a shard folder's train split, for the word2vec probe."""

    def __init__(self, shards, n: int):
        self._shards = shards
        starts = shards.sentences("train")
        k = max(1, int(np.searchsorted(starts, n, side="right")) - 1)
        self._starts = np.asarray(starts[: k + 1])
        self._tokens = shards.tokens("train")[: int(self._starts[-1])]

    def check_tokenizer(self, tok) -> None:
        self._shards.check_tokenizer(tok)

    def tokens(self, split: str = "train"):
        return self._tokens

    def sentences(self, split: str = "train"):
        return self._starts


def _probe_dir() -> tempfile.TemporaryDirectory:
    """A temporary folder for a probe, named by this process; those of killed probes are removed first."""
    root = Path(tempfile.gettempdir())
    for old in root.glob("lmforge-probe-*"):
        pid = old.name.split("-")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"lmforge-probe-{os.getpid()}-")


def _probe_word2vec(module, cand: Candidate, shards, tokenizer, max_seconds: float, t0: float) -> ProbeResult:
    cfg = from_dict(module.config_class, {**cand.model, "epochs": 1}, ignore=("model_type",))
    head = _HeadShards(shards, 200_000)
    with _probe_dir() as tmp:
        quiet = logging.getLogger(type(module).__module__)  # the family's package: its one-pass run logs below it
        level = quiet.level
        quiet.setLevel(logging.WARNING)
        try:
            res = module.run_pretraining(head, tokenizer, cfg, Path(tmp) / "w2v")
        finally:
            quiet.setLevel(level)
    words = float(res.tokens_seen or len(head.tokens()))
    return ProbeResult(words / max(res.elapsed or 1e-9, 1e-9), 1, time.perf_counter() - t0)



def machine_description() -> str:
    """``x86_64, 2 CPU cores, 2 torch threads, torch 2.x`` (+ the GPU when there is one)."""
    text = f"{platform.machine() or '?'}, {os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads"
    if torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text




def train_seconds(budget_seconds: float, probe_seconds: float) -> float:
    """The training time of a time budget: what the probe left, less the reserve."""
    return max(0.0, budget_seconds - probe_seconds) * (1 - RESERVE)


def eval_factor(train: TrainConfig) -> float:
    """Training time per step, evaluation included: an evaluation batch costs about a third of a step."""
    return 1.0 + (train.eval_batches / (3.0 * train.eval_every) if train.eval_every else 0.0)


def steps_for(c: Candidate, tokens: float, timed: bool, train: TrainConfig, unique: int, trainer_family: bool,
              most_epochs: float) -> tuple[int, int]:
    """``(steps, steps before the cap)`` that ``tokens`` of budget buy ``c`` (epochs for word2vec), at most
    ``most_epochs`` passes over the ``unique`` training tokens; ``timed``: a time budget (evaluation costs time)."""
    if trainer_family:
        per_step = max(c.tokens_per_step, 1.0)
        steps = int(tokens / (per_step * (eval_factor(train) if timed else 1.0)))
        cap = max(1, int(most_epochs * unique / per_step))
    else:
        steps = int(tokens / unique)
        cap = int(most_epochs)
    return min(steps, cap), steps


def step_tokens(c: Candidate, steps: int, unique: int, trainer_family: bool) -> float:
    """Training tokens of ``steps`` steps of ``c`` (epochs over ``unique`` tokens for word2vec)."""
    return steps * c.tokens_per_step if trainer_family else steps * unique
