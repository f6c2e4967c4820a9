"""scripts/heldout_curve.py: the held-out examples are training-side, outside the pool and outside the test set."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from lmforge.transfer.benchmarks import example_key, load_benchmark

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "heldout_curve.py"


def _script():
    spec = importlib.util.spec_from_file_location("heldout_curve", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name,pool,held", [("en-tweets", 3000, 500), ("zh-ner", 400, 200)])
def test_held_out_examples_are_new_to_the_pool_and_to_the_test_set(name, pool, held):
    script = _script()
    drawn, rest = script.split_training_side(name, pool, held)
    _, test = load_benchmark(name, 1, 1000, seed=0)
    key = example_key
    assert len(drawn.examples) == pool and 0.9 * held <= len(rest.examples) <= held
    assert not {key(ex) for ex in drawn.examples} & {key(ex) for ex in rest.examples}
    assert not {key(ex) for ex in rest.examples} & {key(ex) for ex in test.examples}
    assert drawn.labels == rest.labels and drawn.task == rest.task
    again, again_rest = script.split_training_side(name, pool, held)  # the same split on every call
    assert [key(ex) for ex in again_rest.examples] == [key(ex) for ex in rest.examples]


def test_the_script_scores_a_curve_on_the_held_out_examples(tmp_path, capsys):
    from test_benchmarks import _tweets_bert

    _, body = _tweets_bert(48)
    body.save_pretrained(tmp_path / "bert")
    rc = _script().main(["en-tweets", str(tmp_path / "bert"), "--out", str(tmp_path / "curve"), "--sizes", "30",
                         "--seeds", "0", "--modes", "features", "--pool", "200", "--held", "100", "--max-len", "32"])
    assert rc == 0
    curve = (tmp_path / "curve" / "curve.json").read_text()
    assert '"features"' in curve and "(held out)" in curve
    assert "| 30 |" in capsys.readouterr().out
