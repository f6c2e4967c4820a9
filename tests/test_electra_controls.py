"""scripts/electra_controls.py: the controls' commands (a dry run), and the record's table from curves."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "electra_controls.py"


def _script():
    spec = importlib.util.spec_from_file_location("electra_controls", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _curve(path: Path, means: dict[str, list[float]]) -> Path:
    """A curve.json at sizes 100 and 300: each mode's seeds at 300, those less 0.1 at 100."""
    summary = {m: {"300": {"scores": s, "mean": sum(s) / len(s)},
                   "100": {"scores": [x - 0.1 for x in s], "mean": sum(s) / len(s) - 0.1}} for m, s in means.items()}
    path.mkdir(parents=True)
    (path / "curve.json").write_text(json.dumps({"summary": summary}))
    return path / "curve.json"


def test_table_shows_each_models_best_mode_with_every_seed_and_the_difference(tmp_path):
    script = _script()
    bert = {"scratch": [0.9, 0.9, 0.9], "frozen": [0.5, 0.6, 0.7], "features": [0.6, 0.6, 0.6],
            "finetune": [0.5, 0.5, 0.5]}
    electra = {"frozen": [0.4, 0.4, 0.4], "features": [0.5, 0.5, 0.5], "finetune": [0.7, 0.6, 0.8]}
    models = {}
    for name, means in (("bert", bert), ("electra", electra)):
        models[name] = {"test": _curve(tmp_path / f"t-{name}", means), "held": _curve(tmp_path / f"h-{name}", means)}
    tab = script.table(models, [100, 300])
    assert tab["columns"] == ["labels", "bert", "electra", "electra − bert"]
    # BERT's best pretrained mode: features and frozen tie at 0.6; scratch is no pretrained mode
    assert tab["rows"][1][1] in ("0.500 / 0.600 / 0.700 = 0.600 (frozen)", "0.600 / 0.600 / 0.600 = 0.600 (features)")
    assert tab["rows"][1][2] == "0.700 / 0.600 / 0.800 = 0.700 (finetune)"
    assert tab["rows"][1][3] == "+10.0" and tab["rows"][0][0] == "100" and tab["rows"][3][0] == "300, held-out"


def test_dry_run_prints_every_control_command(tmp_path, capsys):
    script = _script()
    work = tmp_path / "w"
    for run, cfg in (("bert", {"lr": 1e-3, "schedule": "cosine", "min_lr_ratio": 0.1, "warmup_steps": 100,
                               "weight_decay": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "max_steps": 4814}),
                     ("electra", {"lr": 5e-4, "max_steps": 2926})):
        (work / run).mkdir(parents=True)
        (work / run / "train_config.json").write_text(json.dumps(cfg))
    assert script.main(["zh-ner", "--work", str(work), "--shards", str(tmp_path / "shards"), "--bert",
                        str(work / "bert"), "--electra", str(work / "electra"), "--variant",
                        "gen2:generator_size_divisor=2", "--dry-run"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("would run:") and " pretrain " in x]
    sets = [x.split("--set ", 1)[1] for x in lines]
    assert sets == [
        "lr=0.001 schedule=cosine min_lr_ratio=0.1 warmup_steps=100 weight_decay=0.01 beta1=0.9 beta2=0.999 eps=1e-08",
        "max_steps=4814", "lr=0.001", "lr=0.002", "generator_size_divisor=2",  # lr 5e-4 is ELECTRA's own run
    ]
    assert all("--config electra/train_config.json" in x and "OMP_NUM_THREADS=1 lmforge pretrain electra" in x
               for x in lines)
    with pytest.raises(SystemExit):
        script.main(["zh-ner", "--work", str(work), "--variant", "no-colon"])


def test_bert_is_replayed_at_electras_cpu_seconds_when_the_plans_missed_equal_time(tmp_path, capsys):
    script = _script()
    work = tmp_path / "w"
    (work / "bert").mkdir(parents=True)
    (work / "bert" / "train_config.json").write_text(json.dumps({"max_steps": 3184}))
    r = script.Runner(work, 1, dry_run=True)
    r.done = [{"output": "bert/model.safetensors", "cpu_s": 363.4},
              {"output": "electra/model.safetensors", "cpu_s": 538.0}]
    assert script.equal_cpu_bert(r, work / "shards", work / "bert", work / "electra") == work / "bert-eq"
    line = capsys.readouterr().err.strip()
    assert "pretrain bert --data shards --out bert-eq --config bert/train_config.json" in line
    assert line.endswith("--set max_steps=4714")  # 3184 steps x 538 / 363.4 CPU seconds
    r.done[0]["cpu_s"] = 500.0  # within 10 %: the planned BERT is the reference
    assert script.equal_cpu_bert(r, work / "shards", work / "bert", work / "electra") == work / "bert"


def test_each_runs_facts_state_electras_recipe_so_a_variant_is_told_apart(tmp_path):
    script = _script()
    run = tmp_path / "electra-bias"
    run.mkdir()
    model = {"num_hidden_layers": 2, "hidden_size": 128, "generator_size_divisor": 4, "discriminator_weight": 50.0,
             "discriminator_bias_init": -2.0}
    (run / "train_config.json").write_text(json.dumps({"max_steps": 2723, "lr": 5e-4, "schedule": "linear",
                                                       "min_lr_ratio": 0.0, "warmup_steps": 100, "model": model}))
    (run / "metrics.jsonl").write_text(json.dumps({"split": "val", "loss": 20.9,
                                                     "metrics": {"token_cos": 0.268, "rtd_auc": 0.608}}))
    r = script.Runner(tmp_path, 1, dry_run=True)
    r.done = [{"output": "electra-bias/model.safetensors", "cpu_s": 494.0}]
    assert script._run_facts("electra-bias", run, r) == (
        "electra-bias: 2,723 steps of 2x128 at lr 0.0005 (linear, min_lr_ratio 0, warm-up 100, "
        "generator_size_divisor 4, discriminator_weight 50, discriminator_bias_init -2), 494 CPU s; "
        "final validation token_cos 0.268, rtd_auc 0.608")
