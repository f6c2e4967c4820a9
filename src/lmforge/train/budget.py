"""Budgets: the number of steps (and, with ``--search-shape``, the model shape) of ``lmforge pretrain FAMILY
--budget 15m|20Mtok``.

The default plan, in three sentences: a time budget is turned into tokens by timing a few optimizer steps of the
chosen preset on this machine (the ``--config`` one, else the family's default), a token budget needs no probe;
the steps are those tokens over the tokens of one step (after the probe and a reserve of the time for start-up,
evaluation and the save); the steps stop at ``MAX_EPOCHS`` passes over the training split (BERT and ELECTRA draw
new masks on every pass: 32), with a warning to prepare more text.  Training hyper-parameters come from the
family's defaults and ``--set``; the planner only sets the steps and caps the warm-up.  ``search_shape=True``
also chooses the shape (:mod:`lmforge.train.budget_search`).  ``--precision auto`` is resolved for the chosen shape
as the Trainer resolves it (the probe trains in that precision; :func:`lmforge.train.budget_probe.shape_precision`),
and the plan records the concrete precision with its reason.

The run then trains exactly ``max_steps`` steps (no wall-clock stop): the same plan, data and seed give the same
weights whatever the machine's load, and ``--plan plan.json`` replays a plan elsewhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import re
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..config import from_dict, to_dict
from ..cpu_quota import auto_threads
from ..devices import Compute
from ..errors import ConfigError, LmforgeError
from ..families import get_family
from ..nn.cpu_share import advise_threads
from ..storage.files import save_json
from . import budget_search
from .budget_probe import (
    PROBE_FRACTION,
    PROBE_MAX_SECONDS,
    Candidate,
    Probe,
    ProbeResult,
    eval_factor,
    machine_description,
    make_candidates,
    measure_throughput,
    shape_precision,
    step_tokens,
    steps_for,
    train_seconds,
)
from .checkpoint import find_state_dir
from .config import TrainConfig, format_duration, parse_duration
from .plan_check import check_plan_settings, plan_fields, plan_train_config
from .precision import fixed_precision, resolve_compute
from .pretrain import default_train_config, open_shards, pretrain, recipe_in

__all__ = ["Budget", "BudgetPlan", "Candidate", "ProbeResult", "parse_budget", "plan_budget", "run_plan",
           "load_plan", "measure_throughput", "make_candidates", "max_epochs"]

logger = logging.getLogger(__name__)

PLAN_FILE = "plan.json"
PLAN_FORMAT = "lmforge-budget-plan"
MIN_STEPS = 200  # fewer optimizer steps never get far past the warm-up: a warning below it
MAX_EPOCHS = 16.0  # the plan never repeats the training split more often, except where a family gains from it
# (its Family.max_epochs: BERT draws new masks on every pass)
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
        probe_tokens_per_s: the probe's throughput of the chosen shape (``None`` for a token budget), in the
            precision the plan trains in.
        precision_choice: how ``train['precision']`` was chosen, e.g. ``auto: fp32, the model's width 32 is below
            64 ...`` or ``bf16, asked for`` (empty for word2vec, or a plan saved before the planner said so).
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
    recipe: dict | None = None
    precision_choice: str = ""
    format: str = PLAN_FORMAT

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def model_config(self):
        """The family config the plan trains."""
        return from_dict(get_family(self.family).config_class, self.model, ignore=("model_type",))

    def recipe_config(self):
        """The data recipe the plan trains with (BERT, ELECTRA; a plan written before the recipe had its own
        config keeps it among the model fields); None for a family without one."""
        return recipe_in(self.family, self.recipe if self.recipe is not None else self.model)

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
        if self.precision_choice:
            lines.append(f"  precision {self.precision_choice}")
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
            tps += f" in {c['precision']}" if tps and c.get("precision") else ""
            steps = f", {c['steps']:,} {'steps' if self.max_steps is not None else 'epochs'}, " \
                    f"{c['tokens_per_param']:.1f} tok/param" if c.get("steps") else ""
            score = f", score {c['score']:.2f}" if c.get("score") is not None else ""
            mark = "*" if c["name"] == self.preset else " "
            body = f" ({c['body_params'] / 1e6:.2f}M body)" if c.get("body_params") else ""
            lines.append(f"  {mark} {c['name']}: {c['params'] / 1e6:.2f}M{body}{tps}{steps}{score}"
                         + (f"; {c['note']}" if c.get("note") else ""))
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)




def max_epochs(family: str) -> float:
    """The most passes over the training split a plan of ``family`` makes."""
    own = get_family(family).max_epochs
    return MAX_EPOCHS if own is None else own


def plan_budget(
    family: str,
    shards: Any,
    budget: str | Budget,
    model=None,
    train: TrainConfig | None = None,
    recipe=None,
    *,
    model_fields: dict | None = None,
    name: str | None = None,
    search_shape: bool = False,
    probe: Probe | None = None,
    compute: Compute | None = None,
) -> BudgetPlan:
    """The number of steps (and with ``search_shape`` the shape) of a ``family`` run on ``shards`` within ``budget``.

    Args:
        family: a key of :data:`lmforge.families.FAMILIES`.
        shards: an open :class:`lmforge.data.shards.Shards` or its folder.
        budget: ``"15m"``, ``"1h"``, ``"90s"`` (wall-clock, probed) or ``"20Mtok"`` (tokens, no probe).
        model: the preset name or config object to train (default: the family's default preset); with
            ``search_shape``, None means every preset of the default's kind.
        train: the TrainConfig of the run (default: the family's); ``max_steps``, ``warmup_steps``,
            ``decay_steps`` and ``max_time`` are the planner's.
        recipe: the data recipe (BERT, ELECTRA; default: the family's).
        model_fields: model config fields set on every candidate (``--set`` model keys).
        name: how the plan names a config object given as ``model`` (a run file's name).
        search_shape: choose the shape among the presets too (:mod:`lmforge.train.budget_search`).
        probe: the throughput probe (default :func:`measure_throughput`); tests inject a fake one.
        compute: the run's device and precision, resolved once (default: resolved from ``train``).
    Raises:
        ConfigError: a bad budget, or one too small for a single optimizer step (epoch for word2vec).
    """
    b = budget if isinstance(budget, Budget) else parse_budget(budget)
    shards = open_shards(shards) if isinstance(shards, (str, Path)) else shards
    trainer_family = get_family(family).trainer
    train = (train or default_train_config(family)) if trainer_family else TrainConfig()
    # fp16 on a CPU, a GPU torch does not see: refused before any probe
    compute = compute or resolve_compute(train.device, train.precision if trainer_family else "fp32")
    busy = None  # other processes holding cores slow the probe, and a time budget then plans fewer steps
    if probe is None and b.kind == "time" and compute.device.type == "cpu":
        auto = auto_threads()  # the command's count, for the CPUs free now (lmforge/cpu_quota.py); else advice
        busy = auto.settle() if auto is not None else advise_threads(torch.get_num_threads())
    probe = probe or functools.partial(measure_throughput, compute=compute)
    unique = int(shards.counts("train")["tokens"])
    if unique < 1:
        raise ConfigError(f"the shards in {shards.path} have no training tokens; prepare a larger corpus")
    if model is None and not (search_shape and trainer_family):
        model = get_family(family).default_preset
    if recipe is None and get_family(family).recipe_class is not None:
        recipe = get_family(family).recipe_class()
    cands = make_candidates(family, shards, train, model, model_fields, name, recipe)
    if search_shape and model is None:
        records = _search_records(family, cands, b, train, unique, shards, probe)
    else:
        cands = cands[:1]
        records = [_probe_one(family, cands[0], b, train, unique, shards, probe)]
    warnings: list[str] = [f"{busy}; the probe timed the machine as it is now, so the plan has fewer steps than "
                           "free cores would give"] if busy else []
    feasible = _feasible(family, cands, records, b, trainer_family, warnings)
    if search_shape and model is None:
        cand, rec = budget_search.choose(family, feasible, b.kind == "time", unique, max_epochs(family), warnings)
    else:
        cand, rec = feasible[0]
    train, chosen = _plan_precision(family, cand, rec, train, shards, compute)
    return _assemble(family, b, cand, rec, records, warnings, train, unique, shards, chosen)


def _plan_precision(family: str, cand: Candidate, rec: dict, train: TrainConfig, shards,
                    compute: Compute) -> tuple[TrainConfig, str]:
    """``(train with the concrete precision, how it was chosen)`` for the chosen shape: the precision its probe
    trained in, else (a token budget, a probe that does not say) chosen here as the Trainer chooses it.  The plan
    records the concrete precision, so the run and a replay compute as the probe did."""
    if not get_family(family).trainer:
        return train, ""
    choice = rec.get("precision_choice") or shape_precision(family, cand, train, shards, compute=compute)
    rec["precision"] = choice.precision
    return dataclasses.replace(train, precision=choice.precision), choice.summary(train.precision)


def _probe_one(family: str, cand: Candidate, b: Budget, train: TrainConfig, unique: int, shards,
               probe: Probe) -> dict:
    """The default plan's one record: the chosen shape's tokens/s (a time budget), steps and tokens/param."""
    trainer_family = get_family(family).trainer
    rec = budget_search.record(cand)
    del rec["score"]
    tokens = float(b.tokens or 0)
    if b.kind == "time":
        res = probe(family, cand, train, shards, max(min(PROBE_MAX_SECONDS, PROBE_FRACTION * b.seconds), 1.0))
        rec["tokens_per_s"] = float(res.tokens_per_s)
        budget_search.note_precision(rec, res.precision)
        tokens = rec["tokens_per_s"] * train_seconds(b.seconds, res.seconds)
    steps, uncapped = steps_for(cand, tokens, b.kind == "time", train, unique, trainer_family, max_epochs(family))
    rec.update(capped=uncapped > steps, steps=steps,
               tokens_per_param=round(step_tokens(cand, steps, unique, trainer_family) / max(cand.body_params, 1), 3))
    return rec


def _search_records(family: str, cands: list[Candidate], b: Budget, train: TrainConfig, unique: int, shards,
                    probe: Probe) -> list[dict]:
    """Every candidate's record with its score (``--search-shape``)."""
    trainer_family = get_family(family).trainer
    if b.kind == "time":
        return budget_search.probe_ladder(family, cands, b.seconds, train, unique, shards, probe, trainer_family,
                                          max_epochs(family), MIN_STEPS)
    records = []
    for c in cands:
        rec = budget_search.record(c)
        budget_search.fill(rec, c, False, train, unique, trainer_family, float(b.tokens), max_epochs(family))
        records.append(rec)
    return records


def _feasible(family: str, cands: list[Candidate], records: list[dict], b: Budget, trainer_family: bool,
              warnings: list[str]) -> list[tuple[Candidate, dict]]:
    """The shapes with enough steps; else the smallest with a warning, or a one-line error for none."""
    scored = [(c, r) for c, r in zip(cands, records) if r.get("steps")]
    least = MIN_STEPS if trainer_family else 1
    feasible = [(c, r) for c, r in scored if r["steps"] >= least]
    if feasible:
        return feasible
    if trainer_family and scored:
        c, r = scored[0]
        warnings.append(f"the budget buys only {r['steps']} optimizer steps of the smallest shape "
                        f"('{c.name}'); the learning rate schedule needs about {MIN_STEPS}")
        return [scored[0]]
    unit = "step" if trainer_family else "epoch"
    raise ConfigError(f"budget {b.text} is too small for even one {unit} of {family} '{cands[0].name}' "
                      f"({_unit_cost(records[0], cands[0], b, trainer_family)}); give a larger --budget")


def _unit_cost(rec: dict, c: Candidate, b: Budget, trainer_family: bool) -> str:
    if b.kind == "tokens":
        return f"one step is {c.tokens_per_step:,.0f} tokens" if trainer_family else "one epoch is the whole split"
    tps = rec.get("tokens_per_s") or 0.0
    if trainer_family and tps:
        return f"a step takes about {c.tokens_per_step / tps:.2f}s here"
    return f"{tps:,.0f} tokens/s here"


def _epoch_warning(rec: dict, epochs: float, unique: int, most_epochs: float) -> str | None:
    if rec.get("capped"):
        return (f"the budget is worth more than {most_epochs:g} passes over the {unique:,} training tokens; "
                f"the plan stops at {most_epochs:g} epochs: prepare more text to use all of it")
    if epochs > budget_search.FULL_VALUE_EPOCHS:
        return (f"the plan repeats the {unique:,} training tokens {epochs:.1f} times; beyond about "
                f"{budget_search.FULL_VALUE_EPOCHS:g} epochs repeated text is worth less than new text")
    return None


def _run_fields(family: str, cand: Candidate, steps: int, train: TrainConfig) -> tuple[dict, dict, int | None]:
    """``(model fields, training fields, warm-up)`` of the plan: the planned steps and a capped warm-up."""
    model = dict(cand.model)
    if not get_family(family).trainer:
        return {**model, "epochs": steps}, {}, None
    warmup = min(train.warmup_steps, max(1, int(WARMUP_MAX_FRACTION * steps))) if train.warmup_steps else 0
    eval_every = train.eval_every if train.eval_every <= steps else 0
    fields = to_dict(dataclasses.replace(train, max_steps=steps, warmup_steps=warmup, max_time=None,
                                         decay_steps=None, eval_every=eval_every))
    return model, fields, warmup


def _assemble(family: str, b: Budget, cand: Candidate, rec: dict, records: list[dict], warnings: list[str],
              train: TrainConfig, unique: int, shards, precision_choice: str) -> BudgetPlan:
    trainer_family = get_family(family).trainer
    steps = int(rec["steps"])
    tokens = step_tokens(cand, steps, unique, trainer_family)
    epochs = tokens / unique
    if warning := _epoch_warning(rec, epochs, unique, max_epochs(family)):
        warnings.append(warning)
    model, train_fields, warmup = _run_fields(family, cand, steps, train)
    tps = rec.get("tokens_per_s")
    expected_s = tokens / tps * (eval_factor(train) if trainer_family else 1.0) if tps else None
    return BudgetPlan(
        family=family, budget=b.text, budget_kind=b.kind, preset=cand.name, model=model, train=train_fields,
        batch_size=train.batch_size * train.grad_accum if trainer_family else 0, seq_len=cand.seq_len,
        max_steps=steps if trainer_family else None, epochs=round(epochs, 4), warmup_steps=warmup,
        tokens_per_step=cand.tokens_per_step, expected_tokens=int(tokens), params=cand.params,
        body_params=cand.body_params, tokens_per_param=round(tokens / max(cand.body_params, 1), 3),
        recipe=cand.recipe, precision_choice=precision_choice,
        probe_tokens_per_s=round(tps, 1) if tps else None,
        expected_seconds=round(expected_s, 1) if expected_s is not None else None,
        candidates=[{k: v for k, v in r.items()
                     if k not in ("capped", "uncapped_steps", "probe_seconds", "precision_choice")}
                    for r in records],
        warnings=warnings,
        data={"path": str(shards.path), "tokenizer_hash": str(shards.tokenizer_hash), "train_tokens": unique},
        machine=machine_description() if b.kind == "time" else "",
        lmforge_version=__version__, torch_version=torch.__version__,
    )


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
             progress: bool | None = None, compute: Compute | None = None):
    """Train ``plan`` on the shards in ``data_dir`` into ``out_dir`` (which gets a copy as ``plan.json``).

    The run is a fixed number of steps (epochs for word2vec), with the plan's model config and
    training settings exactly, so a replay of the same plan on the same data gives the same weights.
    ``compute``: the command's device (default: the plan's), computing in the precision the plan recorded.
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
        train = plan.train_config()
        if compute is not None and train is not None:
            compute = fixed_precision(compute, train.precision)
        return pretrain(plan.family, data_dir, out, plan.model_config(), train, plan.recipe_config(),
                        tokenizer_dir=tokenizer_dir, progress=progress, compute=compute)
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
