"""One typed run configuration for ``lmforge pretrain``: presets, ``--config``, ``--set``, ``--init``,
``--resume``, ``--plan``, ``--budget`` and the compute flags, resolved once.

The command line parses its arguments into a :class:`RunRequest` (the strings as given) and hands it over;
:func:`resolve_run` checks it and returns the :class:`RunConfig`: the model config, the training settings, the
data recipe, the :class:`lmforge.devices.Compute` (device and precision, resolved once), the ``--init`` folder
and, for a planned run, the budget or the plan.  :func:`train_run` trains it as given and
:func:`plan_run` plans a ``--budget`` run from it; neither resolves a setting again.

A run file (``--config run.toml``, ``.json`` or ``.yaml``) holds a whole run: model fields under ``[model]``,
training fields under ``[train]``, the data recipe (BERT, ELECTRA) under ``[data]``, or all as flat keys (each
goes to the config that has it: model, then recipe, then training), and optionally ``preset = "tiny"`` as the
base of the model fields.  ``train_config.json`` is such a file, so ``--config MODEL_DIR/train_config.json``
repeats a run.  Which wins: the saved config (``--resume``), ``--init``'s or ``--config``'s, then the run
file's training and recipe fields, then ``--set``, then ``--max-time``, ``--device``, ``--precision`` and
``--compile``.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from pathlib import Path
from typing import Any

from ..config import apply_overrides, field_types, from_dict, load_config_file, parse_overrides, synonyms_in
from ..devices import Compute
from ..errors import ConfigError, LmforgeError
from ..families import FAMILIES, get_family
from ..families.result import PretrainResult
from .budget import Budget, BudgetPlan, check_plan_data, holds_model, load_plan, parse_budget, plan_budget
from .checkpoint import restore_model_config
from .config import TrainConfig, parse_duration
from .precision import resolve_compute
from .pretrain import (
    check_fresh_out,
    check_init,
    check_resumable,
    default_train_config,
    open_shards,
    preset_config,
    recipe_config,
    saved_model_config,
    saved_recipe,
    saved_train_config,
    train_configs,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """What ``lmforge pretrain`` was asked, as given on the command line (``None``: not given)."""

    family: str
    out: str
    data: str | None = None
    config: str | None = None
    overrides: tuple[str, ...] = ()
    max_time: str | None = None
    device: str | None = None
    precision: str | None = None
    compile: bool | None = None
    init: str | None = None
    resume: bool = False
    overwrite: bool = False
    budget: str | None = None
    plan: str | None = None
    search_shape: bool = False


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A pretraining run, every setting resolved.

    Attributes:
        family: a key of :data:`lmforge.families.FAMILIES`.
        model: the model config; for a ``--budget`` run what the planner starts from (a config object, a
            preset name, or ``None``: the default preset, or with ``search_shape`` every preset).
        train: the training settings (``None`` for word2vec, trained by gensim).
        recipe: the data recipe (BERT, ELECTRA), else ``None``.
        compute: device and precision (``None`` for word2vec); a pending ``auto`` is settled on the model.
        init: the ``--init`` model folder, checked.
        resume: continue the run saved in the output folder.
        budget: the ``--budget`` to plan within (:func:`plan_run`).
        plan: the ``--plan`` to replay (its configs are ``model``, ``train`` and ``recipe``).
        model_fields: the ``--set`` model keys a ``--budget`` run sets on every candidate shape.
        name: how the plan names a run file given as ``--config``.
        search_shape: choose the shape of a ``--budget`` run among the presets.
    """

    family: str
    model: Any
    train: TrainConfig | None
    recipe: Any
    compute: Compute | None
    init: Path | None = None
    resume: bool = False
    budget: Budget | None = None
    plan: BudgetPlan | None = None
    model_fields: dict = dataclasses.field(default_factory=dict)
    name: str | None = None
    search_shape: bool = False


def resolve_run(request: RunRequest) -> RunConfig:
    """The :class:`RunConfig` of ``request``; every problem a one-line error before any data is read.

    With ``--resume`` the saved configs are read from ``request.out`` (its ``config.json`` restored first from
    the training state where a kill left only that).
    """
    r = request
    if r.max_time is not None:
        parse_duration(r.max_time)
    if r.resume and r.overwrite:
        raise LmforgeError("--resume continues the run in --out and --overwrite starts afresh; give one of them")
    init = check_init(r.init, r.family, r.resume, r.config) if r.init is not None else None
    model_over, train_over, recipe_over = split_sets(list(r.overrides), r.family)
    plan = check_budget_request(r) if r.budget is not None or r.plan is not None or r.search_shape else None
    if plan is not None:
        if r.device is not None or r.precision is not None:  # checked as ever, though the plan's own are used
            resolve_compute(r.device or "auto", r.precision or "auto")
        train = plan.train_config()
        compute = resolve_compute(train.device, train.precision) if train is not None else None
        return RunConfig(r.family, plan.model_config(), train, plan.recipe_config(), compute, plan=plan)
    train = _train(r, train_over)
    compute = resolve_compute(train.device, train.precision) if train is not None else None
    recipe = _recipe(r, init, recipe_over)
    if r.budget is None:
        return RunConfig(r.family, _model(r, init, model_over), train, recipe, compute, init=init, resume=r.resume)
    for key in ("max_steps", "max_time", "decay_steps"):
        if key in train_over:
            raise ConfigError(f"--budget plans {key} itself; drop --set {key} (or train without --budget)")
    chosen = model_from_choice(r.family, r.config)
    apply_overrides(chosen, model_over)  # an unknown preset or key: now, before any probe
    model, name = (chosen, Path(r.config).name) if is_config_file(r.config) else (r.config, None)
    return RunConfig(r.family, model, train, recipe, compute, budget=parse_budget(r.budget), model_fields=model_over,
                     name=name, search_shape=r.search_shape)


def plan_run(run: RunConfig, data_dir: str | Path) -> BudgetPlan:
    """The plan a run replays: ``--plan``'s, checked against the shards, or one probed here for ``--budget``."""
    shards = open_shards(data_dir)
    if run.plan is not None:
        check_plan_data(run.plan, shards)
        return run.plan
    if run.budget is None:
        raise LmforgeError("a run without --budget or --plan has no plan")
    return plan_budget(run.family, shards, run.budget, run.model, run.train, run.recipe, model_fields=run.model_fields,
                       name=run.name, search_shape=run.search_shape, compute=run.compute)


def check_budget_request(r: RunRequest) -> BudgetPlan | None:
    """One-line errors for ``--budget`` / ``--plan`` with clashing options, a bad budget or plan file; the plan of
    ``--plan``."""
    if r.search_shape and (r.budget is None or r.config is not None):
        raise LmforgeError("--search-shape chooses the shape of a --budget run among the presets; give --budget "
                           "and drop --config")
    if r.budget is not None and r.plan is not None:
        raise LmforgeError("give --budget (plan a run here) or --plan (replay a saved plan), not both")
    flag = "--budget" if r.budget is not None else "--plan"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise LmforgeError(f"{flag} plans and replays one-process runs; run it without torchrun")
    for given, name in ((r.resume, "--resume"), (r.max_time is not None, "--max-time"), (r.init, "--init")):
        if given:
            raise LmforgeError(f"{flag} runs a planned number of steps from scratch; drop {name}")
    out = Path(r.out)
    if not r.overwrite and holds_model(out):
        raise LmforgeError(f"{out} already holds a model; a planned run starts afresh: choose another --out "
                           f"(or add --overwrite)")
    if r.plan is not None:
        if r.config is not None or r.overrides:
            raise LmforgeError("--plan replays a plan exactly; drop --config and --set (or plan again with --budget)")
        plan = load_plan(r.plan)
        if plan.family != r.family:
            raise LmforgeError(f"{r.plan} plans a {plan.family} run, not a {r.family} one")
        return plan
    parse_budget(r.budget)
    return None


def _model(r: RunRequest, init: Path | None, model_over: dict):
    """The model config: the saved one (``--resume``), the ``--init`` folder's or ``--config``'s, with ``--set``."""
    if r.resume:
        restore_model_config(r.out)  # a kill between the first checkpoint and config.json left only the state
        check_resumable(Path(r.out), r.family)
        if r.config is not None:
            logger.warning("--resume: ignoring the model config of --config %s; it comes from %s", r.config, r.out)
        base = saved_model_config(r.family, r.out)
    elif init is not None:
        base = get_family(r.family).model_class.config_from_folder(init)
    else:
        base = model_from_choice(r.family, r.config)
    return apply_overrides(base, model_over)


def _train(r: RunRequest, train_over: dict) -> TrainConfig | None:
    """The training settings: the saved ones (``--resume``) or the family's defaults, then the run file's,
    ``--set``, ``--max-time``, ``--device``, ``--precision`` and ``--compile``; None for word2vec."""
    if not get_family(r.family).trainer:
        if r.max_time is not None:
            logger.warning("%s trains without the Trainer and has no time budget: --max-time is not used", r.family)
        if r.device not in (None, "auto", "cpu") or r.precision not in (None, "auto", "fp32"):
            logger.warning("%s trains with gensim on the CPU in fp32: --device and --precision are not used",
                           r.family)
        return None
    base = (saved_train_config(r.out) if r.resume else None) or default_train_config(r.family)
    cfg = apply_overrides(apply_overrides(base, run_file_train(r.family, r.config)), train_over)
    if r.max_time is not None:
        cfg = apply_overrides(cfg, {"max_time": parse_duration(r.max_time)})
    flags = {k: v for k in ("device", "precision", "compile") if (v := getattr(r, k)) is not None}
    return apply_overrides(cfg, flags)


def _recipe(r: RunRequest, init: Path | None, recipe_over: dict):
    """The data recipe: the saved one (``--resume``, ``--init``) or the defaults, then the run file's and
    ``--set``; None for a family without one."""
    if get_family(r.family).recipe_class is None:
        return None
    if r.resume:
        base = saved_recipe(r.family, r.out)
    elif init is not None:
        base = saved_recipe(r.family, init)
    else:
        base = recipe_config(r.family)
    return apply_overrides(apply_overrides(base, run_file_recipe(r.family, r.config)), recipe_over)


# -- run files and --set ------------------------------------------------------------------------------------


def is_config_file(choice: str | None) -> bool:
    """Whether ``--config`` names a file (a path or a config suffix) rather than a preset."""
    if choice is None:
        return False
    path = Path(choice)
    return (path.suffix.lower() in (".json", ".toml", ".yaml", ".yml") or path.exists()
            or any(sep in choice for sep in "/\\"))


def _sections(p: Path, family: str) -> tuple[dict, dict, dict, dict]:
    """``(flat keys, [model], [train], [data])`` of a run file, its family checked."""
    if p.is_dir():
        raise ConfigError(f"--config {p} is a directory; give a preset name or a config file (.toml, .json, .yaml)")
    data = dict(load_config_file(p))
    model = data.pop("model", {})
    train = data.pop("train", {})
    recipe = data.pop("data", {})
    if not all(isinstance(x, dict) for x in (model, train, recipe)):
        raise ConfigError(f"{p}: 'model', 'train' and 'data' must be tables of settings")
    model, train, recipe = dict(model), dict(train), dict(recipe)
    for where in (data, model):
        mt = where.pop("model_type", None) or (where.pop("family", None) if where is data else None)
        if mt is not None and mt != family:
            raise ConfigError(f"{p} is a '{mt}' config, not a '{family}' one")
    return data, model, train, recipe


def read_run_file(family: str, path: str | Path) -> tuple[str | None, dict, dict, dict]:
    """``(preset, model fields, training fields, recipe fields)`` of a run file (see the module docstring).

    Raises:
        ConfigError: an unreadable file, another family's config, or a key of neither config.
    """
    p = Path(path)
    fam = get_family(family)
    data, model, train, recipe = _sections(p, family)
    preset = data.pop("preset", None)
    if preset is not None and preset not in fam.presets:
        raise ConfigError(f"{p}: unknown {family} preset '{preset}'; presets: {', '.join(fam.presets)}")
    model_fields = set(field_types(fam.config_class))
    recipe_fields = _recipe_fields(family)
    train_fields = set(field_types(TrainConfig)) if fam.trainer else set()
    # a train_config.json written before the recipe had its own config keeps it under "model"
    recipe.update({k: model.pop(k) for k in list(model) if k in recipe_fields and k not in model_fields})
    for k, v in data.items():
        if k in model_fields:
            model[k] = v
        elif k in recipe_fields:
            recipe[k] = v
        elif k in train_fields:
            train[k] = v
        else:
            raise unknown_key(k, fam.config_class, sorted(train_fields | recipe_fields), file=str(p))
    if train and not fam.trainer:
        raise ConfigError(f"{p}: {family} trains in one gensim pass; its settings are model keys, not [train]")
    return preset, model, train, recipe


def _recipe_fields(family: str) -> set[str]:
    cls = get_family(family).recipe_class
    return set(field_types(cls)) if cls is not None else set()


def model_from_choice(family: str, choice: str | None):
    """The model config of ``--config PRESET|FILE`` (``None``: the family's default preset).

    A file's model fields start from its ``preset`` when it names one, else from the config class's
    defaults (a complete ``config.json``); a file without model fields gives the family's default preset.
    """
    fam = get_family(family)
    if choice is None or (choice in fam.presets and not Path(choice).is_file()):
        return preset_config(family, choice)
    if not is_config_file(choice):
        return preset_config(family, choice)  # the unknown-preset error
    preset, model, _, _ = read_run_file(family, choice)
    if preset is None and not model:
        preset = fam.default_preset
    base = dict(fam.presets[preset]) if preset is not None else {}
    base.pop("model_type", None)
    return from_dict(fam.config_class, {**base, **model})


def run_file_train(family: str, choice: str | None) -> dict:
    """The training fields of a run file given as ``--config`` (empty for a preset)."""
    return read_run_file(family, choice)[2] if is_config_file(choice) else {}


def run_file_recipe(family: str, choice: str | None) -> dict:
    """The data-recipe fields of a run file given as ``--config`` (empty for a preset)."""
    return read_run_file(family, choice)[3] if is_config_file(choice) else {}


def unknown_key(key: str, model_cls: type, train_fields: list[str], file: str | None = None) -> ConfigError:
    """The error for a key of neither config: this family's name for it, a close key, or the valid keys."""
    model_fields = list(field_types(model_cls))
    what = f"unknown config key '{key}' in {file}" if file else f"unknown --set key '{key}'"
    same = synonyms_in(model_cls, key)
    if same:
        return ConfigError(f"{what}: {model_cls.__name__} calls it {' or '.join(same)} (e.g. {same[0]} = ...)")
    close = difflib.get_close_matches(key, model_fields + train_fields, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    msg = f"{what}{hint}; model keys ({model_cls.__name__}): {', '.join(sorted(model_fields))}"
    if train_fields:
        msg += f"; training keys: {', '.join(sorted(train_fields))}"
    return ConfigError(msg)


def split_sets(pairs: list[str] | None, family: str) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """Split ``--set k=v`` pairs into (model keys, training keys, data-recipe keys); a key in none is an error.

    A key naming a field of several configs goes to the model config, then the recipe; for families trained
    without the Trainer (word2vec) every key is a model key.
    """
    fam = get_family(family)
    model_cls = fam.config_class
    over = parse_overrides(pairs)
    model_fields = set(field_types(model_cls))
    recipe_fields = _recipe_fields(family)
    train_fields = list(field_types(TrainConfig)) if fam.trainer else []
    model_over, train_over, recipe_over = {}, {}, {}
    for k, v in over.items():
        if k in model_fields:
            model_over[k] = v
        elif k in recipe_fields:
            recipe_over[k] = v
        elif k in train_fields:
            train_over[k] = v
        elif not fam.trainer and k in field_types(TrainConfig):
            trained = ", ".join(n for n, f in FAMILIES.items() if f.trainer)
            raise ConfigError(f"'{k}' is a training key of the Trainer's families ({trained}); "
                              f"{model_cls.__name__} trains in one gensim pass and takes model keys only")
        else:
            raise unknown_key(k, model_cls, train_fields + sorted(recipe_fields))
    if "max_time" in train_over and train_over["max_time"].lower() not in ("none", "null"):
        train_over["max_time"] = str(parse_duration(train_over["max_time"]))
    return model_over, train_over, recipe_over


def train_run(run: RunConfig, data_dir: str | Path, out_dir: str | Path, *, tokenizer_dir: str | Path | None = None,
              progress: bool | None = None) -> PretrainResult:
    """Train the resolved ``run`` (:func:`lmforge.train.run_config.resolve_run`) on the shards in ``data_dir`` into
    ``out_dir``, as :func:`pretrain` does; its settings are used as given, none resolved again."""
    out = Path(out_dir)
    if run.resume:
        check_resumable(out, run.family)
    else:
        check_fresh_out(out, run.family)
    return train_configs(run.family, data_dir, out, (run.model, run.train, run.recipe), run.compute, init_dir=run.init,
                resume=run.resume, tokenizer_dir=tokenizer_dir, progress=progress)
