"""``--precision auto`` in a budget plan: the planner resolves it for the shape it probes as the Trainer resolves it
for the run (lmforge.train.budget_probe.shape_precision), so the plan, the probe's throughput, the run and a
``--plan`` replay compute in one precision, and the plan says why.

The machine is made one with native bf16 (its /proc/cpuinfo flags) and the measurement of fp32 against bf16
is given by replacing ``autotune.best_times``, as in tests/test_precision.py; the probe itself runs for real
on tiny GPTs (a few steps).
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
from safetensors.torch import load_file

from lmforge.cli import main
from lmforge.data.shards import Shards
from lmforge.errors import ConfigError
from lmforge.nn import autotune
from lmforge.train import budget as B
from lmforge.train import budget_probe
from lmforge.train import precision as P
from lmforge.train.pretrain import default_train_config, preset_config, pretrain

NARROW = {"n_positions": 32, "n_embd": 32, "n_head": 2}  # width 32: below MIN_BF16_WIDTH
WIDE = {"n_positions": 32, "n_embd": 64, "n_head": 2}  # width 64: measured


def timings(monkeypatch, seconds: dict[str, float]) -> list[dict]:
    """fp32 and bf16 steps take ``seconds`` on this 'machine' (the kernel routes tie); returns each precision
    measurement's candidates."""
    asked: list[dict] = []

    def best_times(candidates, reps=5, warmup=1):
        if "bf16" not in candidates:
            return {k: 1.0 for k in candidates}
        asked.append(candidates)
        for fn in candidates.values():
            fn()
        return {k: seconds[k] for k in candidates}

    monkeypatch.setattr(autotune, "best_times", best_times)
    return asked


def probe_precisions(monkeypatch) -> list[str]:
    """The precisions the throughput probe trains its steps in."""
    used: list[str] = []
    real = budget_probe.autocast

    @contextmanager
    def recording(device, precision):
        used.append(precision)
        with real(device, precision):
            yield

    monkeypatch.setattr(budget_probe, "autocast", recording)
    return used


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["-q", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def saved_precision(folder) -> str:
    return json.loads((folder / "train_config.json").read_text())["precision"]


def test_a_narrow_shape_plans_probes_and_trains_fp32_as_a_plain_run(bpe_shards, tmp_path, capsys, monkeypatch,
                                                                     native_bf16):
    """The reported case: ``pretrain gpt --budget 15m`` of a model of width 32 on a CPU with native bf16 plans,
    probes and trains fp32 (the width rule, nothing timed), as ``pretrain`` without a budget does."""
    asked = timings(monkeypatch, {"fp32": 1.0, "bf16": 0.5})
    used = probe_precisions(monkeypatch)
    monkeypatch.setattr(B, "MAX_EPOCHS", 0.05)  # a few steps: the pass cap, not the 15 minutes, decides
    sets = ["--device", "cpu", "--set", *(f"{k}={v}" for k, v in NARROW.items()), "batch_size=2", "eval_batches=1"]
    planned, plain = tmp_path / "planned", tmp_path / "plain"
    rc, out, err = run_cli(capsys, "pretrain", "gpt", "--data", str(bpe_shards), "--out", str(planned),
                           "--config", "tiny", "--budget", "15m", *sets)
    assert rc == 0, err
    plan = json.loads((planned / "plan.json").read_text())
    assert plan["train"]["precision"] == "fp32" and plan["candidates"][0]["precision"] == "fp32"
    assert plan["precision_choice"].startswith("auto: fp32, the model's width 32 is below 64")
    assert "precision auto: fp32, the model's width 32" in out
    assert used and set(used) == {"fp32"}  # the probe's tokens/s are fp32's
    assert saved_precision(planned) == "fp32"
    rc, out, err = run_cli(capsys, "pretrain", "gpt", "--data", str(bpe_shards), "--out", str(plain),
                           "--config", "tiny", *sets, "max_steps=2")
    assert rc == 0, err
    assert saved_precision(plain) == "fp32" and not asked


def test_a_wide_shape_is_measured_once_for_the_plan_its_probe_and_the_run(bpe_shards, tmp_path, monkeypatch,
                                                                          native_bf16):
    """Width 64: the plan's probe measures fp32 against bf16 on the run's model and first batch, trains its timed
    steps in the winner, and a plain run of the same shape reads the same cache entry (nothing timed again)."""
    asked = timings(monkeypatch, {"fp32": 1.4, "bf16": 1.0})
    used = probe_precisions(monkeypatch)
    shards = Shards.open(bpe_shards)
    train = default_train_config("gpt", batch_size=2, eval_batches=1, device="cpu")
    plan = B.plan_budget("gpt", shards, "15m", "tiny", train, model_fields=WIDE)
    assert len(asked) == 1 and plan.train["precision"] == "bf16" and plan.candidates[0]["precision"] == "bf16"
    assert plan.precision_choice.startswith("auto: bf16, measured on this CPU: bf16 1.40x fp32's speed")
    assert plan.probe_tokens_per_s and set(used) == {"bf16"}
    assert "precision auto: bf16, measured" in plan.describe() and "tok/s in bf16" in plan.describe()
    model = preset_config("gpt", "tiny", **WIDE)
    pretrain("gpt", bpe_shards, tmp_path / "plain", model, default_train_config(
        "gpt", batch_size=2, eval_batches=1, eval_every=0, device="cpu", max_steps=1), progress=False)
    assert saved_precision(tmp_path / "plain") == "bf16" and len(asked) == 1


def test_a_token_budget_records_the_choice_and_a_replay_keeps_it(bpe_shards, tmp_path, capsys, monkeypatch,
                                                                 native_bf16):
    """No throughput probe for a token budget, yet the precision is chosen for the shape and recorded; a
    ``--plan`` replay on a CPU without native bf16 trains in the recorded bf16 and gives the same weights."""
    asked = timings(monkeypatch, {"fp32": 2.0, "bf16": 1.0})
    sets = ["--set", *(f"{k}={v}" for k, v in WIDE.items()), "batch_size=2", "eval_batches=1", "--device", "cpu"]
    a, b = tmp_path / "a", tmp_path / "b"
    rc, out, err = run_cli(capsys, "pretrain", "gpt", "--data", str(bpe_shards), "--out", str(a),
                           "--config", "tiny", "--budget", "256tok", *sets)
    assert rc == 0, err
    plan = json.loads((a / "plan.json").read_text())
    assert plan["probe_tokens_per_s"] is None and len(asked) == 1
    assert plan["train"]["precision"] == "bf16" and plan["precision_choice"].startswith("auto: bf16, measured")
    assert saved_precision(a) == "bf16"
    without = tmp_path / "cpuinfo-without"  # another machine: auto would be fp32 there
    without.write_text("processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: avx2 avx512f\n")
    monkeypatch.setattr(P, "CPUINFO_PATH", str(without))
    rc, out, err = run_cli(capsys, "pretrain", "gpt", "--data", str(bpe_shards), "--out", str(b),
                           "--plan", str(a / "plan.json"))
    assert rc == 0, err
    assert saved_precision(b) == "bf16" and len(asked) == 1
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)


def test_an_asked_precision_is_recorded_as_asked_and_fp16_refused_before_a_probe(bpe_shards, monkeypatch,
                                                                                 native_bf16):
    asked = timings(monkeypatch, {"fp32": 2.0, "bf16": 1.0})
    shards = Shards.open(bpe_shards)
    train = default_train_config("gpt", batch_size=2, device="cpu", precision="fp32")
    plan = B.plan_budget("gpt", shards, "256tok", "tiny", train, model_fields=WIDE)
    assert plan.train["precision"] == "fp32" and plan.precision_choice == "fp32, asked for" and not asked

    def no_probe(*a):
        raise AssertionError("probed a run that cannot start")

    with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
        B.plan_budget("gpt", shards, "15m", "tiny", default_train_config("gpt", device="cpu", precision="fp16"),
                      model_fields=WIDE, probe=no_probe)


def test_a_fake_probe_still_gets_the_precision_of_the_run(bpe_shards, monkeypatch, native_bf16):
    """A probe that does not say its precision (a test's, word2vec's): the planner chooses it for the shape."""
    timings(monkeypatch, {"fp32": 1.0, "bf16": 0.5})
    shards = Shards.open(bpe_shards)
    train = default_train_config("gpt", batch_size=2, device="cpu")
    plan = B.plan_budget("gpt", shards, "15m", "tiny", train, model_fields=NARROW,
                         probe=lambda *a: B.ProbeResult(1e6, 3, 1.0))
    assert plan.train["precision"] == "fp32" and "width 32 is below 64" in plan.precision_choice
    w2v = B.plan_budget("word2vec", shards, f"{2 * shards.counts('train')['tokens']}tok")
    assert w2v.precision_choice == "" and "precision" not in w2v.candidates[0]
