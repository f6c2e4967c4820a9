"""The recorded plans in docs/plans/ replay to the same run: each loads, and the model and training configs it
builds are those recorded beside it (tests/data/plan_configs.json, built from the same files)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lmforge.config import to_dict
from lmforge.train.budget import load_plan
from lmforge.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
RECORDED = json.loads((ROOT / "tests" / "data" / "plan_configs.json").read_text(encoding="utf-8"))


def test_every_recorded_plan_has_its_configs():
    assert sorted(RECORDED) == sorted(p.name for p in (ROOT / "docs" / "plans").glob("*.json"))


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_a_recorded_plan_builds_the_same_configs(name):
    plan = load_plan(ROOT / "docs" / "plans" / name)
    recipe = plan.recipe_config()  # the data recipe: its own section of the plan, among the model fields recorded
    model = {**to_dict(plan.model_config()), **(to_dict(recipe) if recipe is not None else {})}
    pairs = ((model, RECORDED[name]["model"]), (to_dict(plan.train_config()), RECORDED[name]["train"]))
    for got, recorded in pairs:
        assert {k: got.get(k) for k in recorded} == recorded
        # a field added since the recording keeps its default, so the run is the one recorded
        defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        assert {k: v for k, v in got.items() if k not in recorded} == {k: defaults[k] for k in got if k not in recorded}
