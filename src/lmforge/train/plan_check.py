"""Checks of a budget plan read back from ``plan.json``: a hand-edited plan is one clear line, before any folder
is made.

Every field must have the type and range the planner writes (whole numbers, finite numbers >= 0, JSON
objects and lists of the right shape), and the plan's model and training settings must build the
family's configs, exactly as :func:`lmforge.train.budget.run_plan` will build them.
"""

from __future__ import annotations

import math
import typing
from pathlib import Path
from typing import Any

from ..config import apply_overrides, coerce, field_types, from_dict
from ..errors import ConfigError, LmforgeError
from ..families import get_family
from .config import TrainConfig


def _refuse(path: Path, problem: str) -> LmforgeError:
    return LmforgeError(f"{path} is not a valid budget plan: {problem}; give the plan.json a --budget run wrote, "
                        f"or plan again with --budget")


def plan_fields(cls: type, data: dict, path: Path) -> dict[str, Any]:
    """The fields of the plan dataclass ``cls`` in ``data``, each of its type (numbers finite and >= 0)."""
    out: dict[str, Any] = {}
    for name, kind in field_types(cls).items():
        if name not in data:
            continue
        value = data[name]
        origin = typing.get_origin(kind) or kind
        if origin in (dict, list):
            if not isinstance(value, origin):
                raise _refuse(path, f"'{name}' must be a JSON {'object' if origin is dict else 'list'}, got {value!r}")
            item = (typing.get_args(kind) or (object,))[0] if origin is list else object
            if not all(isinstance(v, item) for v in value):
                raise _refuse(path, f"every entry of '{name}' must be a JSON {'object' if item is dict else 'string'}")
        else:
            try:
                value = coerce(value, kind, name)
            except ConfigError as e:
                raise _refuse(path, str(e)) from None
            if isinstance(value, (int, float)) and not isinstance(value, bool) and (
                    not math.isfinite(value) or value < 0):
                raise _refuse(path, f"'{name}' must be a finite number >= 0, got {value!r}")
        out[name] = value
    for c in out.get("candidates", []):
        if not isinstance(c.get("name"), str) or isinstance(c.get("params"), bool) or not isinstance(
                c.get("params"), (int, float)):
            raise _refuse(path, "every candidate needs a 'name' and a number of 'params'")
    return out


def plan_train_config(plan) -> TrainConfig | None:
    """The training settings a replay of ``plan`` runs with: the family's defaults, then the plan's (None for
    word2vec)."""
    family = get_family(plan.family)
    if not family.trainer:
        return None
    keys = set(field_types(TrainConfig))
    fields = {k: v for k, v in plan.train.items() if k in keys and k != "max_time"}
    return apply_overrides(apply_overrides(TrainConfig(), family.train_defaults), fields)


def check_plan_settings(plan, path: str | Path) -> None:
    """Refuse a plan whose family, model fields or training fields do not build (one line naming the file)."""
    p = Path(path)
    try:
        family = get_family(plan.family)
        from_dict(family.config_class, plan.model, ignore=("model_type",))
        plan_train_config(plan)
        plan.recipe_config()
    except ConfigError as e:
        raise _refuse(p, str(e)) from None
    if family.trainer and (plan.max_steps is None or plan.max_steps < 1):
        raise _refuse(p, f"'max_steps' must be 1 or more for {plan.family}, got {plan.max_steps!r}")
    for key in ("max_steps", "warmup_steps"):  # written twice by the planner: one setting
        top, inner = getattr(plan, key, None), plan.train.get(key)
        if top is not None and inner is not None and top != inner:
            raise _refuse(p, f"'{key}' is {top!r} but 'train.{key}' is {inner!r}; the two must agree")
