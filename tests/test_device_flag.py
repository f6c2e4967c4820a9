"""Every command that runs a trained model takes ``--device``: the model goes there, a GPU that torch does not
see is one line before anything is written, and a run keeps its own setting unless the flag is given."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch
from test_cli_consistency import _subparser, one_line_error, run_cli

from lmforge.cli import build_parser
from lmforge.commands._common import device_arg
from lmforge.transfer import load_run

MODEL_COMMANDS = (("encode",), ("embed",), ("neighbors",), ("fill-mask",), ("generate",), ("serve",),
                  ("evaluate", "wic"), ("evaluate", "lm"))
RUN_COMMANDS = (("predict",), ("evaluate", "run"))
CONVERTS = {"export-hf", "export-onnx"}  # a folder written in another layout (export-onnx traces on the CPU)
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer of a machine without a CUDA GPU")


def _device_action(path):
    return next(a for a in _subparser(*path)._actions if a.dest == "device")


@pytest.mark.parametrize("path", MODEL_COMMANDS + RUN_COMMANDS, ids=" ".join)
def test_every_command_that_runs_a_model_takes_device(path):
    action = _device_action(path)
    assert action.option_strings == ["--device"] and action.type is device_arg
    assert action.default == ("auto" if path in MODEL_COMMANDS else None)  # a run: its own saved setting
    parser = _subparser(*path)
    with pytest.raises(SystemExit):
        parser.parse_args(["--device", "tpu"])


def test_no_command_that_runs_a_model_is_left_without_device():
    """Any command that loads a model folder or a run (it names one among its inputs) to run it takes --device."""
    missing = []

    def walk(parser, path):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, (*path, name))
        if subs:
            return
        reads = parser.get_default("reads") or ()
        dests = {a.dest for a in parser._actions}
        runs_one = any(r in ("model_dir", "model_dirs", "run_dir", "items", "paths") for r in reads)
        if runs_one and "device" not in dests and " ".join(path) not in CONVERTS:
            missing.append(" ".join(path))

    walk(build_parser(), ())
    assert not missing, f"these commands run a model but take no --device: {missing}"


def test_encode_on_the_cpu_named_or_chosen_gives_the_same_vectors(model_folders, tmp_path, capsys):
    for device in ("cpu", "auto"):
        rc, out, err = run_cli(capsys, "encode", model_folders["bert"], "--file", model_folders["texts"], "--out",
                               tmp_path / f"{device}.npy", "--device", device, "--json")
        assert rc == 0, err
        expected = "cuda:0" if device == "auto" and torch.cuda.is_available() else "cpu"
        assert json.loads(out)["device"] == expected
    if not torch.cuda.is_available():  # auto is the CPU here
        assert np.array_equal(np.load(tmp_path / "cpu.npy"), np.load(tmp_path / "auto.npy"))


@NO_GPU
@pytest.mark.parametrize("argv", [
    ["encode", "{bert}", "--file", "{texts}", "--out", "{out}/v.npy"],
    ["fill-mask", "{bert}", "the [MASK] is a snake"],
    ["generate", "{gpt}", "--prompt", "the python", "--max-new-tokens", "2"],
    ["neighbors", "{bert}", "python", "--corpus", "{texts}"],
    ["embed", "{bert}", "python is a snake", "python is a language", "--word", "python"],
    ["predict", "{run}", "--text", "a good day"],
    ["evaluate", "run", "{run}", "--test", "{data}"],
], ids=lambda argv: argv[0] if argv[0] != "evaluate" else "evaluate run")
def test_a_gpu_torch_does_not_see_is_one_line_and_nothing_is_written(model_folders, tmp_path, capsys, argv):
    names = {**{k: str(v) for k, v in model_folders.items()}, "out": str(tmp_path)}
    rc, _, err = run_cli(capsys, *[a.format(**names) for a in argv], "--device", "cuda")
    one_line_error(rc, err, "--device cuda: torch sees no CUDA GPU here")
    assert list(tmp_path.iterdir()) == []


def test_a_run_keeps_its_own_device_unless_told(model_folders):
    saved = json.loads((model_folders["run"] / "config.json").read_text())["transfer"]["device"]
    assert saved == "cpu"
    assert load_run(model_folders["run"]).device == torch.device("cpu")
    assert load_run(model_folders["run"], device="auto").cfg.device == "auto"
    with pytest.raises(Exception, match="device must be auto, cpu, cuda or cuda:N"):
        load_run(model_folders["run"], device="tpu")


def test_serve_lists_where_each_folder_computes(model_folders):
    from fastapi.testclient import TestClient

    from lmforge.serve import create_app

    with TestClient(create_app([model_folders["bert"], model_folders["run"]], device="cpu")) as client:
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert listed["bert"]["device"] == "cpu" and listed["run"]["device"] == "cpu"
        app = client.app
        assert {e.device for e in app.state.server.entries.values()} == {"cpu"}  # a reload opens them there again
