"""One resolved run configuration and one Compute per command (lmforge.train.run_config, lmforge.devices.Compute):
the CLI's strings become a frozen RunConfig in one place, and device and precision are resolved once per run,
an ``auto`` that the model decides settled where the model first exists."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from torch import nn

from lmforge.cli import main
from lmforge.devices import Compute
from lmforge.errors import ConfigError
from lmforge.train import distributed
from lmforge.train import precision as P
from lmforge.train.run_config import RunRequest, resolve_run

TINY = ["n_layer=1", "n_embd=32", "n_head=2", "batch_size=2", "eval_batches=1", "log_every=1", "eval_every=2",
        "save_every=2"]


def test_a_request_becomes_one_frozen_config_with_its_compute(tmp_path):
    run_file = tmp_path / "run.toml"
    run_file.write_text('preset = "tiny"\n[model]\nn_layer = 1\n[train]\nlr = 1e-3\nmax_steps = 5\n',
                        encoding="utf-8")
    request = RunRequest(family="gpt", out=str(tmp_path / "out"), config=str(run_file),
                         overrides=("lr=2e-3", "n_embd=32"), precision="fp32", device="cpu")
    run = resolve_run(request)
    assert (run.model.n_layer, run.model.n_embd) == (1, 32)  # the file's model key, then --set
    assert (run.train.lr, run.train.max_steps) == (2e-3, 5)  # --set over the file's [train]
    assert (run.train.device, run.train.precision) == ("cpu", "fp32")  # the flags, saved with the run
    assert run.compute == Compute(torch.device("cpu"), "fp32", "fp32")
    assert not run.compute.pending and not run.compute.uses_grad_scaler and run.compute.autocast_dtype is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.train = None


def test_bad_requests_are_refused_before_anything_runs(tmp_path):
    out = str(tmp_path / "out")
    with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
        resolve_run(RunRequest(family="gpt", out=out, precision="fp16", device="cpu"))
    with pytest.raises(ConfigError, match="unknown --set key 'n_layers'"):
        resolve_run(RunRequest(family="gpt", out=out, overrides=("n_layers=2",)))
    with pytest.raises(Exception, match="--budget plans max_steps itself"):
        resolve_run(RunRequest(family="gpt", out=out, budget="1Mtok", overrides=("max_steps=3",)))
    assert not (tmp_path / "out").exists()


def test_auto_waits_for_the_model_only_where_the_model_decides(native_bf16):
    wide = nn.Sequential(nn.Linear(128, 128), nn.Linear(128, 128))
    narrow = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
    pending = P.resolve_compute("cpu", "auto")
    assert pending.pending and pending.precision == "auto"
    assert P.settle(pending, narrow).precision == "fp32"  # the width rule
    settled = P.settle(pending, wide)  # not measured for this shape, no step to time: bf16
    assert (settled.precision, settled.pending, settled.autocast_dtype) == ("bf16", False, "bfloat16")
    assert P.settle(settled, narrow) is settled  # a settled choice is read, never made again


def test_auto_on_a_cpu_without_native_bf16_is_final_at_once():
    compute = P.resolve_compute("cpu", "auto")
    assert (compute.precision, compute.pending) == ("fp32", False)
    assert "no native bf16" in compute.reason
    assert P.settle(compute, nn.Linear(256, 256)) is compute


@pytest.fixture
def lookups(monkeypatch):
    """How often device and precision are resolved (every resolution goes through these two functions)."""
    counts: collections.Counter = collections.Counter()
    for module, name in ((P, "choose_precision"), (P, "resolve_device"), (distributed, "_pick_device")):
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts["device" if _name != "choose_precision" else "precision"] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return counts


@pytest.mark.parametrize("plan", [["--set", "max_steps=2"], ["--budget", "2000tok"]], ids=["steps", "budget"])
def test_a_pretrain_run_resolves_device_and_precision_once(bpe_shards, tmp_path, capsys, lookups, plan):
    argv = ["pretrain", "gpt", "--data", str(bpe_shards), "--out", str(tmp_path / "m"), "--config", "tiny",
            "--set", *TINY, *plan, "--device", "cpu", "--precision", "fp32"]
    assert main(argv) == 0, capsys.readouterr().err
    assert dict(lookups) == {"device": 1, "precision": 1}
    assert "precision fp32 (asked for) on cpu" in capsys.readouterr().err
