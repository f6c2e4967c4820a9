"""``--precision`` on the commands that run a trained model: ``encode``, ``generate`` and ``serve`` (default fp32,
the library's own results), ``predict`` and ``evaluate run`` (default: the precision the run trained in).  bf16
runs the model under autocast, in the thread that computes; fp16 off a GPU is one line."""

from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from test_cli_consistency import _subparser, one_line_error, run_cli
from test_device_flag import NO_GPU

import lmforge
from lmforge.commands import generate as generate_command
from lmforge.serve import create_app
from lmforge.serve import registry as serve_registry
from lmforge.transfer import load_run

TEXTS = ["the python is a snake", "python is a language", "and god said let there be light"]


@pytest.mark.parametrize("path, default", [(("encode",), "fp32"), (("generate",), "fp32"), (("serve",), None),
                                           (("predict",), None), (("evaluate", "run"), None)], ids=str)
def test_the_commands_that_run_a_model_take_precision(path, default):
    action = next(a for a in _subparser(*path)._actions if a.dest == "precision")
    assert action.default == default
    assert list(action.choices) == ["auto", "fp32", "bf16", "fp16"]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _client(model_folders, **kw):
    paths = [model_folders["bert"], model_folders["gpt"], model_folders["run"]]
    return TestClient(create_app(paths, **kw))


def _embeddings(client, model="bert"):
    r = client.post("/v1/embeddings", json={"model": model, "input": TEXTS, "normalize": False})
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


def _precisions(client):
    return {c["id"]: c["precision"] for c in client.get("/v1/models").json()["data"]}


def test_serve_computes_models_in_fp32_unless_told(model_folders):
    model = lmforge.load(model_folders["bert"])
    with _client(model_folders) as client:
        assert _precisions(client) == {"bert": "fp32", "gpt": "fp32", "run": "fp32"}
        assert np.array_equal(_embeddings(client), model.encode(TEXTS))


def test_serve_bf16_runs_every_operation_under_autocast(model_folders, monkeypatch):
    """The vectors come out of bf16 arithmetic (close to fp32's, not equal), and each model operation runs with
    autocast on in its worker thread."""
    fp32 = lmforge.load(model_folders["bert"]).encode(TEXTS)
    seen = {}
    compute = serve_registry.Entry.compute

    def spy(self, fn, *args, **kwargs):
        def inner(*a, **k):
            seen[getattr(fn, "__name__", str(fn))] = (torch.is_autocast_enabled("cpu"),
                                                      torch.get_autocast_dtype("cpu"))
            return fn(*a, **k)
        return compute(self, inner, *args, **kwargs)

    monkeypatch.setattr(serve_registry.Entry, "compute", spy)
    with _client(model_folders, precision="bf16") as client:
        assert _precisions(client) == {"bert": "bf16", "gpt": "bf16", "run": "bf16"}
        got = _embeddings(client)
        assert client.post("/v1/fill-mask", json={"model": "bert", "text": "the [MASK] is a snake"}).status_code == 200
        for route in ("/v1/embed", "/v1/projection"):  # the playground's word across texts, and its 2-D map
            r = client.post(route, json={"model": "bert", "texts": TEXTS[:2] + ["a python bit him"], "word": "python"})
            assert r.status_code == 200, r.text
        r = client.post("/v1/generate", json={"model": "gpt", "prompt": "the python", "max_new_tokens": 4})
        assert r.status_code == 200, r.text
        r = client.post("/v1/completions", json={"model": "gpt", "prompt": "the python", "max_tokens": 4})
        assert r.status_code == 200, r.text
        r = client.post("/v1/predict", json={"model": "run", "text": "a good film"})
        assert r.status_code == 200, r.text
    assert seen == {name: (True, torch.bfloat16) for name in ("encode", "embed", "fill_mask", "generate_one")}
    assert not np.array_equal(got, fp32)
    assert _cosines(got, fp32).min() > 0.99


def test_a_run_served_in_bf16_predicts_under_its_autocast(model_folders):
    run = load_run(model_folders["run"], device="cpu", precision="bf16")
    assert run.cfg.precision == "bf16"
    assert load_run(model_folders["run"], device="cpu").cfg.precision == "fp32"  # the run's own
    with run.autocast():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_predict_in_bf16_gives_close_probabilities(model_folders, tmp_path, capsys):
    outs = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / f"{precision}.jsonl"
        rc, _, err = run_cli(capsys, "predict", model_folders["run"], "--file", model_folders["data"], "--out", out,
                             "--device", "cpu", "--precision", precision)
        assert rc == 0, err
        outs[precision] = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(outs["fp32"]) == len(outs["bf16"]) == 16
    diffs = [abs(a["probs"][k] - b["probs"][k]) for a, b in zip(outs["fp32"], outs["bf16"]) for k in a["probs"]]
    assert 0 < max(diffs) < 0.05, max(diffs)


def test_generate_runs_under_autocast_and_records_it(model_folders, capsys, monkeypatch):
    seen = []
    real = generate_command.generate_text

    def spy(*a, **k):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return real(*a, **k)

    monkeypatch.setattr(generate_command, "generate_text", spy)
    for precision in ("fp32", "bf16"):
        rc, out, err = run_cli(capsys, "generate", model_folders["gpt"], "--prompt", "the python",
                               "--max-new-tokens", "3", "--device", "cpu", "--precision", precision, "--json")
        assert rc == 0, err
        assert json.loads(out)["precision"] == precision
    assert seen == [(False, torch.get_autocast_dtype("cpu")), (True, torch.bfloat16)]


def test_auto_keeps_fp32_for_a_narrow_model_and_says_why(model_folders, capsys, tmp_path):
    """The tiny model is narrower than bf16 autocast gains at (or the CPU lacks native bf16): fp32, with the reason."""
    rc, out, err = run_cli(capsys, "encode", model_folders["bert"], "--file", model_folders["texts"], "--out",
                           tmp_path / "v.npy", "--precision", "auto", "--device", "cpu", "--json")
    assert rc == 0, err
    assert json.loads(out)["precision"] == "fp32"
    assert "precision fp32 (auto: " in err and "--precision bf16 forces bf16" in err, err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@NO_GPU
@pytest.mark.parametrize("command", ["encode", "generate", "serve", "predict"])
def test_fp16_on_a_cpu_is_one_line(model_folders, tmp_path, capsys, command):
    args = {
        "encode": ["encode", model_folders["bert"], "--file", model_folders["texts"], "--out", tmp_path / "v.npy"],
        "generate": ["generate", model_folders["gpt"], "--prompt", "the python"],
        "serve": ["serve", model_folders["bert"], "--port", _free_port()],
        "predict": ["predict", model_folders["run"], "--file", model_folders["data"], "--out", tmp_path / "p.jsonl"],
    }[command]
    rc, _, err = run_cli(capsys, *args, "--device", "cpu", "--precision", "fp16")
    one_line_error(rc, err, "--precision fp16 needs a CUDA GPU")
    assert not list(tmp_path.iterdir())
