"""Budgets: pick a model shape and a number of steps for ``lmforge pretrain FAMILY --budget 15m|20Mtok``.

A budget is wall-clock time (``90s``, ``15m``, ``1h``, ``1h30m``) or a token count (``20Mtok``,
``500ktok``).  :func:`plan_budget` turns it into a :class:`BudgetPlan`; :func:`run_plan` trains it.

How a plan is made (the numbers are the module constants below; docs/training.md explains them):

1. Candidates: the family's presets of the same kind as its default (the same non-numeric settings,
   e.g. ELMo's char-CNN presets but not ``small-word``), or only the ``--config`` one; ``--set`` model
   keys apply to every candidate.  Training hyper-parameters (lr, betas, schedule, batch size, ...)
   come from the family's ``TRAIN_DEFAULTS`` and ``--set``: the planner only chooses the shape, the
   number of steps and caps the warm-up.
2. A time budget is turned into tokens by a throughput probe on this machine: each candidate, smallest
   first, runs one warm-up optimizer step and then a few timed ones.  The probe gets at most
   ``PROBE_FRACTION`` of the budget (and ``PROBE_MAX_SECONDS``); it stops at the first shape that
   would already be under-trained (``tokens/param < TOKENS_PER_PARAM``: larger ones only more so) or
   that could not take ``MIN_STEPS`` steps.  What the probe took, and ``RESERVE`` of the rest (start-up,
   evaluation, checkpoints, the final save), is not training time.  A token budget needs no probe.
3. Each candidate gets ``D`` training tokens (``steps * tokens_per_step``) for ``N`` body parameters
   (all but the token / position embeddings and an untied output layer over the vocabulary: Kaplan et
   al. 2020 found the loss follows these, and in the small presets the embeddings are most of the
   total).  The compute of a run is ``C ~= 6 * N * D`` FLOPs; Chinchilla (Hoffmann et al. 2022) found the
   loss at a fixed ``C`` lowest near ``D ~= 20 N``.  The planner scores ``|ln((D_eff/N) / 20)|``, counting the
   under-trained side (``D/N < 20``) at ``UNDERTRAIN_WEIGHT`` (cramming, Geiping & Goldstein 2022: at
   tiny budgets the largest model that still gets enough steps learns most per token), where
   ``D_eff = min(D, FULL_VALUE_EPOCHS * unique tokens)`` (repeated text is worth about as much as new
   text for ~4 epochs, Muennighoff et al. 2023).  A shape must get ``MIN_STEPS`` steps.  The lowest
   score wins (a tie: the larger shape).
4. The steps are capped at :func:`max_epochs` passes over the training split (``MAX_EPOCHS``; BERT
   ``MAX_EPOCHS_BY_FAMILY``: masked-LM pretraining draws new masks on every pass), with a warning (prepare
   more text); a warning also says when the plan repeats the data more than ``FULL_VALUE_EPOCHS`` times.
5. Small text, large time budget (families in ``GROW_WHEN_CAPPED``): when the winner of step 3 would make
   all its passes in at most ``GROW_MAX_SHARE`` of a time budget's training time, the plan takes instead
   the smallest larger probed shape that uses the whole budget within the cap, if that shape still makes
   ``FULL_VALUE_EPOCHS`` passes and ``MIN_STEPS`` steps.  The text is exhausted for the small shape; the
   time left buys parameters.

The run then trains exactly ``max_steps`` steps (no wall-clock stop): the same plan, data and seed
give the same weights whatever the machine's load, and ``--plan plan.json`` replays a plan elsewhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..config import apply_overrides, from_dict, save_json, to_dict
from ..errors import ConfigError, LmforgeError
from ..folders import pid_alive
from ..models import get_family
from .checkpoint import find_state_dir
from .config import TrainConfig, format_duration, parse_duration
from .plan_check import check_plan_settings, plan_fields, plan_train_config
from .precision import autocast, resolve_device, resolve_precision
from .pretrain import default_train_config, family_module, open_shards, preset_config, pretrain

logger = logging.getLogger(__name__)

PLAN_FILE = "plan.json"
PLAN_FORMAT = "lmforge-budget-plan"
TOKENS_PER_PARAM = 20.0  # Chinchilla's compute-optimal D/N
UNDERTRAIN_WEIGHT = 0.5  # weight of ln(20 / (D/N)) for a shape that sees fewer than 20 tokens per parameter
MIN_STEPS = 200  # fewer optimizer steps never get far past the warm-up
FULL_VALUE_EPOCHS = 4.0  # repeated data counts fully up to this many passes
MAX_EPOCHS = 16.0  # the plan never repeats the training split more often ...
# ... except where a family measurably gains from more passes. BERT draws new masks on every pass: on two
# small corpora (2.28M Chinese, 605k tweet tokens) BERT tiny trained 24 / 32 passes instead of 16 reached a
# lower validation loss and transferred as well or better (docs/training.md "Budgets", step 4)
# ELECTRA's rows are BERT's (new masks, and new generator samples, on every pass): the same cap, not measured apart
MAX_EPOCHS_BY_FAMILY = {"bert": 32.0, "electra": 32.0}
# families whose plan moves to a larger shape when the chosen one would make all its passes in part of a time
# budget (step 5 of the module docstring). Measured for BERT only: on the tweets (605k tokens, packed rows) an
# hour gives 'tiny' its 32 passes in a quarter of the training time; 'mini' trained for all of it (27 passes)
# and fine-tuned 2.9 points above the 16-pass 'tiny' at 300 labels on held-out tweets (docs/training.md
# "Budgets", step 5)
# "electra": the same rows and the same reason, not measured apart
GROW_WHEN_CAPPED = ("bert", "electra")
GROW_MAX_SHARE = 0.5  # ... and only when those passes would take at most this share of the training time
# share of the (budget - probe) kept for start-up, evaluation, checkpoints, the save, and the machine
# running slower over an hour than in the probe's seconds: three BERT runs on a shared 2-core machine
# realized 81 %, 72 % and 64 % of the probed tokens/s (docs/training.md "Budgets")
RESERVE = 0.25
PROBE_FRACTION = 0.05  # the probe's share of a time budget
PROBE_MAX_SECONDS = 45.0  # ... and its ceiling
PROBE_STEPS = (2, 8)  # timed optimizer steps per candidate: at least, at most
PROBE_STEP_SECONDS = 4.0  # a candidate's timed steps stop once they took this long (after the minimum)
WARMUP_MAX_FRACTION = 0.1  # the warm-up of the family's defaults, capped at this share of the steps

_TOKEN_BUDGET = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([kmbg]?)(?:tok|toks|tokens?)", re.IGNORECASE)
_TOKEN_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}


@dataclasses.dataclass(frozen=True)
class Budget:
    """A parsed ``--budget``: ``kind`` is ``time`` (``seconds``) or ``tokens`` (``tokens``)."""

    text: str
    kind: str
    seconds: float | None = None
    tokens: int | None = None


def parse_budget(text: str | float | int) -> Budget:
    """``"15m"`` / ``"1h30m"`` / ``"90"`` (seconds) -> a time budget; ``"20Mtok"`` / ``"500k tokens"`` -> tokens.

    Raises:
        ConfigError: a one-line message when the text is neither.
    """
    s = str(text).strip()
    m = _TOKEN_BUDGET.fullmatch(s.replace(" ", "").replace("_", ""))
    if m:
        tokens = int(float(m.group(1)) * _TOKEN_UNITS[m.group(2).lower()])
        if tokens < 1:
            raise ConfigError(f"the token budget must be at least 1 token, got {text!r}")
        return Budget(s, "tokens", tokens=tokens)
    if re.fullmatch(r"[\d.]+\s*[MBK]", s):
        raise ConfigError(f"budget {text!r} is ambiguous; write {s[:-1].strip()}m for minutes or "
                          f"{s.replace(' ', '')}tok for tokens")
    try:
        return Budget(s, "time", seconds=parse_duration(s))
    except ConfigError:
        raise ConfigError(
            f"bad budget {text!r}; give a time (90s, 15m, 1h, 1h30m) or a token count (500ktok, 20Mtok, 1.5Btok)"
        ) from None


@dataclasses.dataclass
class ProbeResult:
    """What a throughput probe measured for one candidate shape.

    Attributes:
        tokens_per_s: training tokens per second over the timed optimizer steps.
        steps: timed optimizer steps (after one warm-up step).
        seconds: wall time of the probe of this candidate, building and warm-up included.
    """

    tokens_per_s: float
    steps: int
    seconds: float


@dataclasses.dataclass
class Candidate:
    """One shape the planner considers: a preset (or the ``--config`` file) with the ``--set`` model keys."""

    name: str
    model: dict  # the model config fields (vocab_size etc. are replaced by the tokenizer at build time)
    params: int
    body_params: int  # params outside the embeddings and an untied output layer (what the plan's rule counts)
    tokens_per_step: float  # tokens of one optimizer step, counted on the first training batch
    seq_len: int


#: probe(family, candidate, train_config, shards, max_seconds) -> ProbeResult
Probe = Callable[[str, Candidate, TrainConfig, Any, float], ProbeResult]


@dataclasses.dataclass
class BudgetPlan:
    """A pretraining run chosen from a budget; saved as ``plan.json`` in the model folder.

    Attributes:
        family: ``bert``, ``gpt``, ``elmo`` or ``word2vec``.
        budget: the budget as given (``15m``, ``20Mtok``); budget_kind: ``time`` or ``tokens``.
        preset: the chosen candidate (a preset name or the ``--config`` file).
        model: every model config field of the chosen shape (what a replay builds).
        train: the TrainConfig fields of the run (bert/gpt/elmo; ``max_steps`` and ``warmup_steps`` planned,
            the rest from the family's ``TRAIN_DEFAULTS`` and ``--set``); empty for word2vec.
        batch_size, seq_len: rows per optimizer step (batch_size * grad_accum) and tokens per row.
        max_steps: optimizer steps (``None`` for word2vec); epochs: passes over the training split.
        warmup_steps: the planned warm-up.
        tokens_per_step, expected_tokens: training tokens per step and in the whole run.
        params: parameters of the chosen shape; body_params: those outside the token / position embeddings
            and an untied output layer (0 in a plan saved before the planner counted them);
            tokens_per_param: ``expected_tokens / body_params`` (the figure the rule scores).
        probe_tokens_per_s: the probe's throughput of the chosen shape (``None`` for a token budget).
        expected_seconds: training time the probe predicts (``None`` without a probe).
        candidates: one record per shape considered (params, tok/s, steps, tokens/param, score, note).
        warnings: what the user should know (many epochs, few steps).
        data: the shards' path, tokenizer hash and training tokens.
        machine: where it was planned; lmforge_version, torch_version: with what.
    """

    family: str
    budget: str
    budget_kind: str
    preset: str
    model: dict
    train: dict
    batch_size: int
    seq_len: int
    max_steps: int | None
    epochs: float
    warmup_steps: int | None
    tokens_per_step: float
    expected_tokens: int
    params: int
    tokens_per_param: float
    probe_tokens_per_s: float | None
    expected_seconds: float | None
    candidates: list[dict]
    warnings: list[str]
    data: dict
    machine: str
    lmforge_version: str
    torch_version: str
    body_params: int = 0
    format: str = PLAN_FORMAT

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def model_config(self):
        """The family config the plan trains."""
        return from_dict(get_family(self.family).config_class, self.model, ignore=("model_type",))

    def train_config(self) -> TrainConfig | None:
        """The training settings the plan trains with (None for word2vec)."""
        return plan_train_config(self)

    def save(self, path: str | Path) -> Path:
        """Write the plan as JSON (atomically)."""
        save_json(self.to_json(), path)
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> BudgetPlan:
        """Read a ``plan.json`` (a one-line LmforgeError when it is not one)."""
        p = Path(path)
        if not p.is_file():
            raise LmforgeError(f"plan file not found: {p} (pretrain with --budget writes OUT/{PLAN_FILE})")
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise LmforgeError(f"{p} is not a readable plan ({e}); give the {PLAN_FILE} of a --budget run") from None
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise LmforgeError(f"{p} is not an lmforge budget plan; give the {PLAN_FILE} of a --budget run")
        names = {f.name for f in dataclasses.fields(cls)}
        optional = {f.name for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        missing = sorted(names - set(data) - optional)
        if missing:
            raise LmforgeError(f"{p} lacks {', '.join(missing)}; give the {PLAN_FILE} of a --budget run")
        return cls(**plan_fields(cls, data, p))

    def describe(self) -> str:
        """A few lines for the terminal: the choice, the numbers behind it, the warnings."""
        body = (f" ({self.body_params / 1e6:.2f}M outside the embeddings)"
                if self.body_params and self.body_params != self.params else "")
        lines = [f"budget {self.budget} ({self.budget_kind}) -> {self.family} '{self.preset}': "
                 f"{self.params / 1e6:.2f}M parameters{body}"]
        if self.max_steps is not None:
            lines.append(
                f"  {self.max_steps:,} steps x {self.batch_size} rows x {self.seq_len} tokens "
                f"= {self.expected_tokens:,} tokens ({self.tokens_per_param:.1f} tokens/param, "
                f"{self.epochs:.2f} epochs), warm-up {self.warmup_steps}"
            )
        else:
            lines.append(f"  {self.epochs:g} epoch(s) = {self.expected_tokens:,} tokens "
                         f"({self.tokens_per_param:.1f} tokens/param)")
        if self.probe_tokens_per_s is not None:
            lines.append(f"  probe: {self.probe_tokens_per_s:,.0f} tokens/s on {self.machine}; "
                         f"expected training time {format_duration(max(self.expected_seconds or 0.0, 0.1))}")
        for c in self.candidates:
            tps = f", {c['tokens_per_s']:,.0f} tok/s" if c.get("tokens_per_s") else ""
            steps = f", {c['steps']:,} {'steps' if self.max_steps is not None else 'epochs'}, " \
                    f"{c['tokens_per_param']:.1f} tok/param" if c.get("steps") else ""
            score = f", score {c['score']:.2f}" if c.get("score") is not None else ""
            mark = "*" if c["name"] == self.preset else " "
            body = f" ({c['body_params'] / 1e6:.2f}M body)" if c.get("body_params") else ""
            lines.append(f"  {mark} {c['name']}: {c['params'] / 1e6:.2f}M{body}{tps}{steps}{score}"
                         + (f"; {c['note']}" if c.get("note") else ""))
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


# -- candidates ------------------------------------------------------------------------------------------


def _module(family: str):
    return family_module(family)


def _is_trainer_family(module) -> bool:
    return not hasattr(module, "run_pretraining")


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
    # the rows of the run's first step, as the Trainer draws them (seed, train, step 0, row j)
    return [np.random.default_rng([train.seed, 0, 0, j]) for j in range(train.batch_size)]


def _batch_shape(batch: dict) -> tuple[int, int]:
    """(tokens, seq_len) of a sampled batch."""
    import torch

    from .trainer import count_tokens

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


def _build(family: str, module, model_cfg, shards, tokenizer):
    """(model, sampler) of a Trainer family, or ``(None, None)`` for word2vec."""
    if not _is_trainer_family(module):
        return None, None
    return module.pretraining_setup(model_cfg, shards, tokenizer)


def body_parameters(model, vocab_size: int) -> int:
    """Parameters of ``model`` outside its embeddings: every ``nn.Embedding`` (tokens, positions,
    segments, characters) and every ``nn.Linear`` onto ``vocab_size`` outputs (an untied softmax) are left
    out; a weight shared by both is left out once."""
    from torch import nn

    skip: set[int] = set()
    for m in model.modules():
        if isinstance(m, nn.Embedding) or (isinstance(m, nn.Linear) and m.out_features == vocab_size):
            skip.update(id(p) for p in m.parameters())
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def _count_params(family: str, module, model_cfg, shards, tokenizer) -> tuple[int, int]:
    """(all parameters, body parameters) of a shape."""
    import torch

    if not _is_trainer_family(module):
        # word2vec: one vector per vocabulary entry, nothing else (its body is its vectors)
        n = int(tokenizer.vocab_size) * int(getattr(model_cfg, "vector_size", 0))
        return n, n
    try:  # large presets are counted without allocating their weights
        with torch.device("meta"):
            model, _ = module.pretraining_setup(model_cfg, shards, tokenizer)
    except Exception:  # a model whose init needs real tensors
        model, _ = module.pretraining_setup(model_cfg, shards, tokenizer)
    total = sum(p.numel() for p in model.parameters())
    return total, max(1, body_parameters(model, int(tokenizer.vocab_size)))


def make_candidates(family: str, shards, train: TrainConfig, model=None, model_fields: dict | None = None,
                    name: str | None = None) -> list[Candidate]:
    """The shapes to consider, smallest first, with their parameters and tokens per optimizer step.

    ``model``: a preset name or a config object (named ``name``) is the one candidate; None: the family's
    presets of its default's kind.  ``model_fields`` are set on every candidate.
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
        params, body = _count_params(family, module, cfg, shards, tokenizer)
        if _is_trainer_family(module):
            _, sampler = _build(family, module, cfg, shards, tokenizer)
            tokens, seq = _batch_shape(sampler.batch(_first_rows(train), "train"))
            tokens *= train.grad_accum
        else:
            tokens, seq = 0, 0
        out.append(Candidate(label, to_dict(cfg), params, body, float(tokens), seq))
    out.sort(key=lambda c: (c.body_params, c.params))
    return out


# -- the probe -----------------------------------------------------------------------------------------------


def measure_throughput(family: str, cand: Candidate, train: TrainConfig, shards, max_seconds: float) -> ProbeResult:
    """Time a few optimizer steps of ``cand`` on this machine (after one warm-up step).

    The probe trains a throw-away copy of the model with AdamW on the run's own batches (in the run's
    precision); it does not change the RNG streams of the run that follows.
    """
    import torch

    from .trainer import count_tokens, param_groups

    t0 = time.perf_counter()
    module = _module(family)
    tokenizer = shards.tokenizer()
    if not _is_trainer_family(module):
        return _probe_word2vec(module, cand, shards, tokenizer, max_seconds, t0)
    cfg = from_dict(get_family(family).config_class, cand.model, ignore=("model_type",))
    device = resolve_device(train.device)
    precision = resolve_precision(train.precision, device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model, sampler = module.pretraining_setup(cfg, shards, tokenizer)
        model.to(device).train()
        groups, _ = param_groups(model, train.weight_decay)
        opt = torch.optim.AdamW(groups, lr=train.lr, betas=(train.beta1, train.beta2), eps=train.eps)
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
    return ProbeResult(tokens / took, timed_steps, time.perf_counter() - t0)


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
    cfg = from_dict(module.CONFIG_CLASS, {**cand.model, "epochs": 1}, ignore=("model_type",))
    head = _HeadShards(shards, 200_000)
    with _probe_dir() as tmp:
        level = logging.getLogger(module.__name__).level
        logging.getLogger(module.__name__).setLevel(logging.WARNING)
        try:
            res = module.run_pretraining(head, tokenizer, cfg, Path(tmp) / "w2v")
        finally:
            logging.getLogger(module.__name__).setLevel(level)
    words = float(res.tokens_seen or len(head.tokens()))
    return ProbeResult(words / max(res.elapsed or 1e-9, 1e-9), 1, time.perf_counter() - t0)


# -- the plan ------------------------------------------------------------------------------------------------


def _score(tokens_per_param: float) -> float:
    """Distance from Chinchilla's 20 tokens/param in log space; the under-trained side counts less."""
    r = max(tokens_per_param, 1e-12) / TOKENS_PER_PARAM
    return math.log(r) if r >= 1 else UNDERTRAIN_WEIGHT * -math.log(r)


def machine_description() -> str:
    """``x86_64, 2 CPU cores, 2 torch threads, torch 2.x`` (+ the GPU when there is one)."""
    import torch

    text = f"{platform.machine() or '?'}, {os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads"
    if torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


def max_epochs(family: str) -> float:
    """The most passes over the training split a plan of ``family`` makes."""
    return MAX_EPOCHS_BY_FAMILY.get(family, MAX_EPOCHS)


def plan_budget(
    family: str,
    shards: Any,
    budget: str | Budget,
    model=None,
    train: TrainConfig | None = None,
    *,
    model_fields: dict | None = None,
    name: str | None = None,
    probe: Probe | None = None,
) -> BudgetPlan:
    """Choose the shape and the number of steps of a ``family`` run on ``shards`` within ``budget``.

    Args:
        family: ``bert``, ``gpt``, ``elmo`` or ``word2vec``.
        shards: an open :class:`lmforge.data.shards.Shards` or its folder.
        budget: ``"15m"``, ``"1h"``, ``"90s"`` (wall-clock, probed) or ``"20Mtok"`` (tokens, no probe).
        model: consider only this preset name or config object (the planner then chooses only the steps).
        train: the TrainConfig of the run (default: the family's); ``max_steps``, ``warmup_steps``,
            ``decay_steps`` and ``max_time`` are the planner's.
        model_fields: model config fields set on every candidate (``--set`` model keys).
        name: how the plan names a config object given as ``model`` (a run file's name).
        probe: the throughput probe (default :func:`measure_throughput`); tests inject a fake one.
    Returns:
        The :class:`BudgetPlan`.
    Raises:
        ConfigError: a bad budget, or one too small for a single optimizer step (epoch for word2vec).
    """
    import torch

    from .. import __version__

    b = budget if isinstance(budget, Budget) else parse_budget(budget)
    if isinstance(shards, (str, Path)):
        shards = open_shards(shards)
    module = _module(family)
    trainer_family = _is_trainer_family(module)
    train = (train or default_train_config(family)) if trainer_family else TrainConfig()
    if trainer_family:  # the plan records the precision the probe measured, so a replay computes the same way
        train = dataclasses.replace(train, precision=resolve_precision(train.precision, resolve_device(train.device)))
    probe = probe or measure_throughput
    unique = int(shards.counts("train")["tokens"])
    if unique < 1:
        raise ConfigError(f"the shards in {shards.path} have no training tokens; prepare a larger corpus")
    cands = make_candidates(family, shards, train, model, model_fields, name)
    most_epochs = max_epochs(family)
    if not trainer_family:
        cands = cands[:1] if model is not None else [c for c in cands if c.name == module.DEFAULT_PRESET]

    # -- tokens each candidate gets ------------------------------------------------------------------------
    records: list[dict] = []
    probe_spent = 0.0
    if b.kind == "time":
        cap = min(PROBE_MAX_SECONDS, PROBE_FRACTION * b.seconds)
        for i, c in enumerate(cands):
            rec = {"name": c.name, "params": c.params, "body_params": c.body_params, "tokens_per_s": None,
                   "steps": None, "tokens_per_param": None, "score": None, "note": ""}
            records.append(rec)
            if i > 0:
                last = next(r for r in reversed(records[:-1]) if r["tokens_per_s"])
                est_tps = last["tokens_per_s"] * last["params"] / max(c.params, 1)
                train_s = max(0.0, b.seconds - cap) * (1 - RESERVE)
                if last["tokens_per_param"] is not None and last["tokens_per_param"] < TOKENS_PER_PARAM:
                    rec["note"] = "not probed: a smaller shape is already under-trained"
                    continue
                if trainer_family and est_tps * train_s / max(c.tokens_per_step, 1.0) < MIN_STEPS:
                    rec["note"] = f"not probed: too slow for {MIN_STEPS} steps"
                    continue
                est_step = c.tokens_per_step / max(est_tps, 1e-9) if trainer_family else 0.0
                if probe_spent + est_step * (1 + PROBE_STEPS[0]) + PROBE_STEP_SECONDS > cap:
                    rec["note"] = "not probed: the probe's time is spent"
                    continue
            res = probe(family, c, train, shards, max(cap - probe_spent, 1.0))
            probe_spent += res.seconds
            rec["tokens_per_s"], rec["probe_seconds"] = float(res.tokens_per_s), float(res.seconds)
            _fill(rec, c, b, train, unique, trainer_family, rec["tokens_per_s"] * _train_seconds(b, cap),
                  most_epochs)
        train_s = _train_seconds(b, probe_spent)
        for c, rec in zip(cands, records):  # final figures with the time the probe really took
            if rec["tokens_per_s"]:
                _fill(rec, c, b, train, unique, trainer_family, rec["tokens_per_s"] * train_s, most_epochs)
    else:
        for c in cands:
            rec = {"name": c.name, "params": c.params, "body_params": c.body_params, "tokens_per_s": None,
                   "note": ""}
            records.append(rec)
            _fill(rec, c, b, train, unique, trainer_family, float(b.tokens), most_epochs)

    # -- choose --------------------------------------------------------------------------------------------
    scored = [(c, r) for c, r in zip(cands, records) if r.get("steps")]
    warnings: list[str] = []
    unit = "steps" if trainer_family else "epochs"
    least = MIN_STEPS if trainer_family else 1
    feasible = [(c, r) for c, r in scored if r["steps"] >= least]
    if not feasible:
        small = cands[0]
        rec = records[0]
        if trainer_family and scored:
            c, r = scored[0]
            warnings.append(f"the budget buys only {r['steps']} optimizer steps of the smallest shape "
                            f"('{c.name}'); the learning rate schedule needs about {MIN_STEPS}")
            feasible = [scored[0]]
        else:
            per = _unit_cost(rec, small, b, trainer_family)
            raise ConfigError(f"budget {b.text} is too small for even one {unit[:-1]} of {family} '{small.name}' "
                              f"({per}); give a larger --budget")
    best = min(feasible, key=lambda cr: (cr[1]["score"], -cr[0].params))
    cand, rec = best
    if b.kind == "time" and rec.get("capped") and family in GROW_WHEN_CAPPED:
        cand, rec = _grow_when_capped(cand, rec, feasible, unique, most_epochs, warnings)

    steps = int(rec["steps"])
    tokens = steps * cand.tokens_per_step if trainer_family else steps * unique
    epochs = tokens / unique
    if rec.get("capped"):
        warnings.append(f"the budget is worth more than {most_epochs:g} passes over the {unique:,} training tokens; "
                        f"the plan stops at {most_epochs:g} epochs: prepare more text to use all of it")
    elif epochs > FULL_VALUE_EPOCHS:
        warnings.append(f"the plan repeats the {unique:,} training tokens {epochs:.1f} times; beyond about "
                        f"{FULL_VALUE_EPOCHS:g} epochs repeated text is worth less than new text")
    model = dict(cand.model)
    train_fields: dict = {}
    warmup = None
    if trainer_family:
        warmup = min(train.warmup_steps, max(1, int(WARMUP_MAX_FRACTION * steps))) if train.warmup_steps else 0
        eval_every = train.eval_every if train.eval_every <= steps else 0
        train_fields = to_dict(dataclasses.replace(train, max_steps=steps, warmup_steps=warmup, max_time=None,
                                                   decay_steps=None, eval_every=eval_every))
    else:
        model["epochs"] = steps
    tps = rec.get("tokens_per_s")
    expected_s = None
    if tps:
        expected_s = tokens / tps * (_eval_factor(train) if trainer_family else 1.0)
    return BudgetPlan(
        family=family,
        budget=b.text,
        budget_kind=b.kind,
        preset=cand.name,
        model=model,
        train=train_fields,
        batch_size=train.batch_size * train.grad_accum if trainer_family else 0,
        seq_len=cand.seq_len,
        max_steps=steps if trainer_family else None,
        epochs=round(epochs, 4),
        warmup_steps=warmup,
        tokens_per_step=cand.tokens_per_step,
        expected_tokens=int(tokens),
        params=cand.params,
        body_params=cand.body_params,
        tokens_per_param=round(tokens / max(cand.body_params, 1), 3),
        probe_tokens_per_s=round(tps, 1) if tps else None,
        expected_seconds=round(expected_s, 1) if expected_s is not None else None,
        candidates=[{k: v for k, v in r.items() if k not in ("capped", "uncapped_steps", "probe_seconds")}
                    for r in records],
        warnings=warnings,
        data={"path": str(shards.path), "tokenizer_hash": str(shards.tokenizer_hash), "train_tokens": unique},
        machine=machine_description() if b.kind == "time" else "",
        lmforge_version=__version__,
        torch_version=torch.__version__,
    )


def _grow_when_capped(cand: Candidate, rec: dict, feasible: list, unique: int, most_epochs: float,
                      warnings: list[str]) -> tuple[Candidate, dict]:
    """Step 5: the smallest larger shape that spends the whole time budget within the pass cap, if any."""
    larger = [(c, r) for c, r in feasible if c.params > cand.params and not r.get("capped")
              and r["steps"] * c.tokens_per_step >= FULL_VALUE_EPOCHS * unique]
    share = rec["steps"] / max(rec["uncapped_steps"], 1)
    if not larger or share > GROW_MAX_SHARE:
        return cand, rec
    grown, grown_rec = min(larger, key=lambda cr: cr[0].params)
    passes = grown_rec["steps"] * grown.tokens_per_step / unique
    rec["note"] = f"makes its {most_epochs:g} passes in {share:.0%} of the training time"
    warnings.append(f"'{cand.name}' would make all {most_epochs:g} passes over the {unique:,} training tokens in "
                    f"{share:.0%} of the training time; the plan takes '{grown.name}', which trains for all of it "
                    f"({passes:.1f} passes)")
    return grown, grown_rec


def _train_seconds(b: Budget, probe_seconds: float) -> float:
    return max(0.0, b.seconds - probe_seconds) * (1 - RESERVE)


def _eval_factor(train: TrainConfig) -> float:
    """Training time per step, evaluation included: an evaluation batch costs about a third of a step."""
    return 1.0 + (train.eval_batches / (3.0 * train.eval_every) if train.eval_every else 0.0)


def _fill(rec: dict, c: Candidate, b: Budget, train: TrainConfig, unique: int, trainer_family: bool,
          tokens: float, most_epochs: float) -> None:
    """Steps (epochs for word2vec), tokens/param and score of a candidate given ``tokens`` of budget and
    at most ``most_epochs`` passes over the ``unique`` training tokens."""
    if trainer_family:
        per_step = max(c.tokens_per_step, 1.0)
        factor = _eval_factor(train) if b.kind == "time" else 1.0
        steps = int(tokens / (per_step * factor))
        cap = max(1, int(most_epochs * unique / per_step))
        d = min(steps, cap) * per_step
    else:
        steps = int(tokens / unique)
        cap = int(most_epochs)
        d = min(steps, cap) * unique
    rec["capped"] = steps > cap
    rec["uncapped_steps"] = steps
    rec["steps"] = min(steps, cap)
    rec["tokens_per_param"] = round(d / max(c.body_params, 1), 3)
    d_eff = min(d, FULL_VALUE_EPOCHS * unique)
    rec["score"] = round(_score(d_eff / max(c.body_params, 1)), 4) if rec["steps"] else None


def _unit_cost(rec: dict, c: Candidate, b: Budget, trainer_family: bool) -> str:
    if b.kind == "tokens":
        return f"one step is {c.tokens_per_step:,.0f} tokens" if trainer_family else "one epoch is the whole split"
    tps = rec.get("tokens_per_s") or 0.0
    if trainer_family and tps:
        return f"a step takes about {c.tokens_per_step / tps:.2f}s here"
    return f"{tps:,.0f} tokens/s here"


# -- running a plan ------------------------------------------------------------------------------------------


def check_plan_data(plan: BudgetPlan, shards) -> None:
    """Refuse shards made by another tokenizer than the plan's."""
    if str(shards.tokenizer_hash) != str(plan.data.get("tokenizer_hash")):
        raise LmforgeError(
            f"the plan was made for shards of tokenizer {str(plan.data.get('tokenizer_hash'))[:8]}, but "
            f"{shards.path} holds tokenizer {str(shards.tokenizer_hash)[:8]}'s; give the plan's data"
        )


def holds_model(out: Path) -> bool:
    """Whether ``out`` already holds a model or a training state (a plan starts a new run)."""
    return (out / "config.json").exists() or find_state_dir(out) is not None


def run_plan(plan: BudgetPlan, data_dir: str | Path, out_dir: str | Path, tokenizer_dir: str | Path | None = None,
             progress: bool | None = None):
    """Train ``plan`` on the shards in ``data_dir`` into ``out_dir`` (which gets a copy as ``plan.json``).

    The run is a fixed number of steps (epochs for word2vec), with the plan's model config and
    training settings exactly, so a replay of the same plan on the same data gives the same weights.
    Returns:
        The :class:`lmforge.train.pretrain.PretrainResult`.
    """
    out = Path(out_dir)
    if holds_model(out):
        raise LmforgeError(f"{out} already holds a model; a plan starts a new run: choose another --out")
    check_plan_data(plan, open_shards(data_dir))
    fresh = not (out / PLAN_FILE).exists()
    out.mkdir(parents=True, exist_ok=True)
    plan.save(out / PLAN_FILE)
    try:
        return pretrain(plan.family, data_dir, out, plan.model_config(), plan.train_config(),
                        tokenizer_dir=tokenizer_dir, progress=progress)
    except LmforgeError:
        if fresh and not holds_model(out):  # refused before the first checkpoint: no plan left behind
            with contextlib.suppress(OSError):
                (out / PLAN_FILE).unlink()
        raise


def load_plan(path: str | Path) -> BudgetPlan:
    """:meth:`BudgetPlan.load`, its settings checked against the family; a folder means its ``plan.json``."""
    p = Path(path)
    p = p / PLAN_FILE if p.is_dir() else p
    plan = BudgetPlan.load(p)
    check_plan_settings(plan, p)
    return plan
