"""The strings of ``lmforge pretrain`` turned into config objects: ``--config PRESET|FILE``, ``--set k=v`` and the
compute flags.

A run file (``--config run.toml``, ``.json`` or ``.yaml``) holds a whole run: model fields under ``[model]``,
training fields under ``[train]``, the data recipe (BERT, ELECTRA) under ``[data]``, or all as flat keys (each
goes to the config that has it: model, then recipe, then training), and optionally ``preset = "tiny"`` as the
base of the model fields.  ``train_config.json`` is such a
file, so ``--config MODEL_DIR/train_config.json`` repeats a run.  The library
(:func:`lmforge.train.pretrain.pretrain`, :func:`lmforge.train.budget.plan_budget`) takes the objects built here.
"""

from __future__ import annotations

import argparse
import difflib
import logging
from pathlib import Path

from ..config import apply_overrides, field_types, from_dict, load_config_file, parse_overrides, synonyms_in
from ..errors import ConfigError
from ..families import FAMILIES, get_family
from ..train.config import TrainConfig, parse_duration
from ..train.pretrain import (
    check_resumable,
    default_train_config,
    preset_config,
    recipe_config,
    saved_model_config,
    saved_recipe,
    saved_train_config,
)

logger = logging.getLogger(__name__)


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


def compute_flags(args: argparse.Namespace) -> dict[str, str | bool]:
    """``--device``, ``--precision`` and ``--compile`` where given (they override a run file and ``--set``)."""
    return {k: v for k in ("device", "precision", "compile") if (v := getattr(args, k, None)) is not None}


def model_config(args: argparse.Namespace, model_over: dict):
    """The model config of ``lmforge pretrain``: the saved one (``--resume``), the ``--init`` folder's or
    ``--config``'s, with the ``--set`` model keys."""
    if args.resume:
        check_resumable(Path(args.out), args.family)
        if args.config is not None:
            logger.warning("--resume: ignoring the model config of --config %s; it comes from %s", args.config,
                           args.out)
        base = saved_model_config(args.family, args.out)
    elif args.init is not None:
        base = get_family(args.family).model_class.config_from_folder(args.init)
    else:
        base = model_from_choice(args.family, args.config)
    return apply_overrides(base, model_over)


def train_config(args: argparse.Namespace, train_over: dict) -> TrainConfig | None:
    """The training settings of ``lmforge pretrain``: the saved ones (``--resume``) or the family's defaults,
    then the run file's, ``--set``, ``--max-time``, ``--device`` and ``--precision``; None for word2vec."""
    family = args.family
    if not get_family(family).trainer:
        if args.max_time is not None:
            logger.warning("%s trains without the Trainer and has no time budget: --max-time is not used", family)
        if args.device not in (None, "auto", "cpu") or args.precision not in (None, "auto", "fp32"):
            logger.warning("%s trains with gensim on the CPU in fp32: --device and --precision are not used", family)
        return None
    base = (saved_train_config(args.out) if args.resume else None) or default_train_config(family)
    cfg = apply_overrides(apply_overrides(base, run_file_train(family, args.config)), train_over)
    if args.max_time is not None:
        cfg = apply_overrides(cfg, {"max_time": parse_duration(args.max_time)})
    return apply_overrides(cfg, compute_flags(args))


def recipe_of(args: argparse.Namespace, recipe_over: dict):
    """The data recipe of ``lmforge pretrain``: the saved one (``--resume``, ``--init``) or the defaults, then
    the run file's and ``--set``; None for a family without one."""
    family = args.family
    if get_family(family).recipe_class is None:
        return None
    if args.resume:
        base = saved_recipe(family, args.out)
    elif args.init is not None:
        base = saved_recipe(family, args.init)
    else:
        base = recipe_config(family)
    return apply_overrides(apply_overrides(base, run_file_recipe(family, args.config)), recipe_over)
