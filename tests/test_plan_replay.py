"""The recorded plans in docs/plans/ replay to the same run: each loads, and the model and training configs it
builds are those recorded beside it (tests/data/plan_configs.json, built from the same files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmforge.config import to_dict
from lmforge.train.budget import load_plan

ROOT = Path(__file__).resolve().parents[1]
RECORDED = json.loads((ROOT / "tests" / "data" / "plan_configs.json").read_text(encoding="utf-8"))


def test_every_recorded_plan_has_its_configs():
    assert sorted(RECORDED) == sorted(p.name for p in (ROOT / "docs" / "plans").glob("*.json"))


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_a_recorded_plan_builds_the_same_configs(name):
    plan = load_plan(ROOT / "docs" / "plans" / name)
    assert to_dict(plan.model_config()) == RECORDED[name]["model"]
    assert to_dict(plan.train_config()) == RECORDED[name]["train"]
