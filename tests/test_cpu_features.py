"""lmforge.nn.cpu_features, and every command that takes ``--precision`` as on a CPU with AVX2 only.

``LMFORGE_CPU_FEATURES=avx2`` makes lmforge take the routes of a CPU without native bf16 on any machine: bf16
asked for still runs (PyTorch's own kernels under autocast) and says once that fp32 is faster; fp16 is one line.
Run the suite under ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` as well to have PyTorch's kernels capped
too (CONTRIBUTING.md).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from test_cli_consistency import one_line_error, run_cli
from test_device_flag import NO_GPU
from test_transfer_families import tiny_elmo

from lmforge.nn import autotune, cpu_features, cpu_ops
from lmforge.serve import create_app
from lmforge.train import precision as P

SLOW = "has no native bf16: bf16 runs on PyTorch's emulated kernels, slower than --precision fp32"


@pytest.fixture
def avx2(monkeypatch):
    """As on a CPU with AVX2 only, whatever this one has (the CPU flags say AMX, the switch overrides them)."""
    monkeypatch.setenv(cpu_features.FEATURES_ENV, "avx2")
    cpu_features.forget()
    P._warn_once.cache_clear()  # each test sees the once-per-process warning
    yield
    cpu_features.forget()
    P._warn_once.cache_clear()


def test_the_switch_turns_every_feature_off(native_bf16, monkeypatch):
    """native: torch's own probes (and /proc/cpuinfo for the precision rule); avx2: none of them, whatever the CPU."""
    onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and torch.backends.mkldnn.is_available()
    amx = bool(torch.cpu._is_amx_tile_supported()) and onednn
    for value in (None, "native", "NATIVE", "unknown"):
        if value is None:
            monkeypatch.delenv(cpu_features.FEATURES_ENV, raising=False)
        else:
            monkeypatch.setenv(cpu_features.FEATURES_ENV, value)
        assert cpu_features.level() == "native" and not cpu_features.forced_avx2()
        assert (cpu_features.onednn_bf16(), cpu_features.amx(), P.cpu_native_bf16()) == (onednn, amx, True)
    monkeypatch.setenv(cpu_features.FEATURES_ENV, " AVX2 ")
    assert cpu_features.level() == "avx2" and cpu_features.forced_avx2()
    assert (cpu_features.onednn_bf16(), cpu_features.amx(), P.cpu_native_bf16()) == (False, False, False)
    assert P.choose_precision("auto", torch.device("cpu")).reason == "this CPU has no native bf16"
    assert "CPU features: avx2 (LMFORGE_CPU_FEATURES; oneDNN bf16: no, AMX: no)" in cpu_ops.describe_routes()


def test_a_route_that_raises_is_tried_once(monkeypatch):
    monkeypatch.delenv(cpu_features.FEATURES_ENV, raising=False)
    cpu_features.forget()
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("could not create a primitive descriptor")

    assert [cpu_features.runs("q:broken", broken) for _ in range(3)] == [False] * 3
    assert [cpu_features.runs("q:fine", lambda: calls.append(2)) for _ in range(2)] == [True] * 2
    assert calls == [1, 2] and cpu_features.failed_routes() == ["q:broken"]
    monkeypatch.setenv(cpu_features.FEATURES_ENV, "avx2")  # another level asks again
    assert not cpu_features.runs("q:broken", broken) and calls == [1, 2, 1]
    with pytest.raises(ValueError):  # only a kernel that cannot run here is a fallback; other errors are bugs
        cpu_features.runs("q:bug", lambda: int("x"))
    cpu_features.forget()


def test_the_choices_cache_keeps_capped_instruction_sets_apart(monkeypatch):
    """A measurement under ONEDNN_MAX_CPU_ISA=AVX2 (or the switch) is not the answer of the whole CPU."""
    for name in autotune.ISA_ENVS:
        monkeypatch.delenv(name, raising=False)
    plain = autotune.machine_key()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = autotune.machine_key()
    monkeypatch.setenv(cpu_features.FEATURES_ENV, "avx2")
    assert len({plain, capped, autotune.machine_key()}) == 3
    assert capped == plain + " | ONEDNN_MAX_CPU_ISA=AVX2"


def _said_once(err: str) -> bool:
    return err.count(SLOW) == 1


def _no_onednn_bf16() -> bool:
    return not any(q.startswith("matmul_t:bfloat16") and r == "onednn" for q, r in cpu_ops.chosen_routes().items())


@pytest.mark.parametrize("family", ["gpt", "bert"])
def test_pretrain_in_bf16_trains(avx2, family, bpe_shards, wordpiece_shards, tmp_path, capsys):
    shards = bpe_shards if family == "gpt" else wordpiece_shards
    rc, _, err = run_cli(capsys, "pretrain", family, "--data", shards, "--out", tmp_path / "m", "--config", "tiny",
                         "--device", "cpu", "--precision", "bf16", "--set", "max_steps=2", "eval_batches=1")
    assert rc == 0, err
    assert "precision bf16 (asked for) on cpu; this CPU " + SLOW in err and _said_once(err)
    losses = [json.loads(line) for line in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(e["loss"]) for e in losses if "loss" in e) and _no_onednn_bf16()


def test_finetune_predict_and_evaluate_in_bf16(avx2, model_folders, tmp_path, capsys):
    run = tmp_path / "run"
    rc, _, err = run_cli(capsys, "finetune", model_folders["gpt"], "--task", "classify", "--train",
                         model_folders["data"], "--test", model_folders["data"], "--mode", "finetune", "--epochs", "1",
                         "--max-len", "32", "--out", run, "--device", "cpu", "--precision", "bf16")
    assert rc == 0, err
    assert _said_once(err) and json.loads((run / "config.json").read_text())["transfer"]["precision"] == "bf16"
    P._warn_once.cache_clear()
    rc, _, err = run_cli(capsys, "predict", run, "--file", model_folders["data"], "--out", tmp_path / "p.jsonl")
    assert rc == 0 and _said_once(err), err  # the run's own precision, bf16
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 16
    rc, out, err = run_cli(capsys, "evaluate", "run", run, "--test", model_folders["data"], "--json")
    assert rc == 0, err
    assert 0 <= json.loads(out)["accuracy"] <= 1 and SLOW not in err  # said once per process
    assert _no_onednn_bf16()


@pytest.mark.parametrize("model", ["bert", "gpt", "elmo"])
def test_encode_in_bf16_gives_the_fp32_vectors_closely(avx2, model, model_folders, bpe_tokenizer, tmp_path, capsys):
    folder = model_folders.get(model)
    if folder is None:
        folder = tmp_path / model
        tiny_elmo(bpe_tokenizer).save_pretrained(folder, bpe_tokenizer)
    vectors = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / f"{precision}.npy"
        rc, _, err = run_cli(capsys, "encode", folder, "--file", model_folders["texts"], "--out", out,
                             "--device", "cpu", "--precision", precision)
        assert rc == 0, err
        assert _said_once(err) == (precision == "bf16")
        vectors[precision] = np.load(out)
    a, b = vectors["fp32"], vectors["bf16"]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() > 0.99, cos


def test_generate_in_bf16(avx2, model_folders, capsys):
    rc, out, err = run_cli(capsys, "generate", model_folders["gpt"], "--prompt", "the python", "--max-new-tokens",
                           "4", "--device", "cpu", "--precision", "bf16", "--json")
    assert rc == 0, err
    record = json.loads(out)
    assert record["precision"] == "bf16" and record["text"] and _said_once(err)


def test_serve_in_bf16_says_it_once(avx2, model_folders, caplog):
    paths = [model_folders["bert"], model_folders["gpt"], model_folders["run"]]
    with caplog.at_level(logging.WARNING, logger="lmforge"), TestClient(create_app(paths, precision="bf16")) as c:
        r = c.post("/v1/embeddings", json={"model": "bert", "input": ["the python is a snake"]})
        assert r.status_code == 200, r.text
        r = c.post("/v1/generate", json={"model": "gpt", "prompt": "the python", "max_new_tokens": 3})
        assert r.status_code == 200, r.text
        r = c.post("/v1/predict", json={"model": "run", "text": "a good film"})
        assert r.status_code == 200, r.text
    assert sum(SLOW in rec.getMessage() for rec in caplog.records) == 1


def test_benchmark_curve_in_bf16(avx2, model_folders, tmp_path, capsys):
    rc, out, err = run_cli(capsys, "benchmark", "curve", "en-tweets", model_folders["bert"], "--out", tmp_path / "c",
                           "--sizes", "30", "--seeds", "0", "--n-test", "40", "--pool", "200", "--max-len", "32",
                           "--modes", "frozen", "--device", "cpu", "--precision", "bf16")
    assert rc == 0, err
    res = json.loads((tmp_path / "c" / "curve.json").read_text())
    assert [0 <= r["score"] <= 1 for r in res["runs"]] == [True] and _said_once(err)


@NO_GPU
@pytest.mark.parametrize("command", ["finetune", "evaluate", "curve", "demo"])
def test_fp16_on_a_cpu_is_one_line_on_the_other_commands(avx2, command, model_folders, tmp_path, capsys):
    """encode, generate, serve and predict: test_inference_precision; pretrain: test_cli_consistency."""
    args = {
        "finetune": ["finetune", model_folders["bert"], "--task", "classify", "--train", model_folders["data"],
                     "--max-len", "32", "--out", tmp_path / "run"],
        "evaluate": ["evaluate", "run", model_folders["run"], "--test", model_folders["data"]],
        "curve": ["benchmark", "curve", "en-tweets", model_folders["bert"], "--out", tmp_path / "c", "--sizes", "30"],
        "demo": ["demo", "--out", tmp_path / "demo"],
    }[command]
    rc, _, err = run_cli(capsys, *args, "--device", "cpu", "--precision", "fp16")
    one_line_error(rc, err, "--precision fp16 needs a CUDA GPU")
    assert not list(tmp_path.iterdir())


def test_the_switch_reaches_a_new_process(tmp_path):
    """The environment variable, as a user sets it: a fresh process takes the AVX2 routes."""
    code = ("from lmforge.nn import cpu_features as f; from lmforge.train import precision as p; "
            "print(f.level(), f.onednn_bf16(), f.amx(), p.cpu_native_bf16())")
    env = {**os.environ, cpu_features.FEATURES_ENV: "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["avx2", "False", "False", "False"]
