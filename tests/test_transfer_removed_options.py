"""Options that left lmforge (CHANGELOG.md): the CLI no longer takes them, and a run folder that records one is
refused like any unknown key, in one line naming the key and the closest one it has; a setting that still exists
but no longer means what it meant is refused in one line saying what to do."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from test_transfer_families import cls_files, tiny_bert  # noqa: F401

from lmforge.cli import main
from lmforge.data.tasks import TaskData, TextExample
from lmforge.transfer import load_run, run_transfer

TEXTS = ["good fine happy", "bad awful sad", "the python"]


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, wordpiece_tokenizer, cls_files):  # noqa: F811
    d = tmp_path_factory.mktemp("saved")
    tiny_bert(wordpiece_tokenizer).save_pretrained(d / "bert", wordpiece_tokenizer)
    run_transfer(str(d / "bert"), "classify", *cls_files, mode="frozen", epochs=1, max_len=32, seed=0,
                 out_dir=d / "run")
    return d / "run"


def _recorded(run_dir, tmp_path, **fields):
    """A copy of ``run_dir`` whose config.json records ``fields`` among its transfer settings."""
    out = tmp_path / "old_run"
    shutil.copytree(run_dir, out)
    data = json.loads((out / "config.json").read_text())
    data["transfer"].update(fields)
    (out / "config.json").write_text(json.dumps(data))
    return out


def _predict(run_dir) -> list[dict]:
    run = load_run(run_dir)
    return run.predict(TaskData("classify", [TextExample(t) for t in TEXTS], run.labels), use_cache=False)


def test_a_setting_at_its_default_loads_silently(saved_run, tmp_path, caplog, capsys):
    old = _recorded(saved_run, tmp_path, lm_weight=0.0)
    with caplog.at_level(logging.WARNING):
        assert _predict(old) == _predict(saved_run)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert main(["predict", str(old), "--text", TEXTS[0]]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        # keys lmforge no longer has: the ordinary unknown-key error, with the closest key where one is close
        ({"prompt": None}, "unknown config key 'prompt' for TransferConfig"),
        ({"verbalizer": {"pos": "good", "neg": "bad"}}, "unknown config key 'verbalizer' for TransferConfig"),
        ({"layer_mix": True}, "unknown config key 'layer_mix' for TransferConfig (did you mean 'layer'?)"),
        ({"lm_weight": 0.5}, "BERT's auxiliary masked-LM loss (--lm-weight)"),
    ],
)
def test_a_dead_setting_is_refused_in_one_line(saved_run, tmp_path, capsys, fields, says):
    old = _recorded(saved_run, tmp_path, **fields)
    assert main(["predict", str(old), "--text", TEXTS[0]]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert main(["export-hf", str(old), "--out", str(tmp_path / "hf")]) == 2  # export reads the settings the same way
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("gone", [["--prompt", "[MASK] {text}"], ["--verbalizer", "pos=good"], ["--layer-mix"],
                                  ["--top-layer"]])
def test_finetune_no_longer_takes_them(saved_run, cls_files, tmp_path, capsys, gone):  # noqa: F811
    model_dir = json.loads((saved_run / "config.json").read_text())["model_dir"]
    argv = ["finetune", model_dir, "--task", "classify", "--train", str(cls_files[0]), "--test", str(cls_files[1]),
            "--out", str(tmp_path / "run"), *gone]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"unknown option {gone[0]}" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
