"""The Trainer: exact resume (after a real SIGKILL and after a max_steps stop), atomic checkpoints,
corrupt states, the time budget, bf16, evaluation metrics.

The model is a toy 2-layer causal LM on ``lmforge.nn.transformer.TransformerBlock`` and the sampler
draws windows from a numpy token array, so these tests depend on no family module.  ``test_ddp.py``
and ``test_pretrain_cli.py`` import ``ToyLM``/``ToySampler`` from here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmforge.errors import CheckpointError, ConfigError
from lmforge.models.base import ModelOutput, PretrainedModel
from lmforge.nn.transformer import TransformerBlock, init_weights
from lmforge.train import TrainConfig, Trainer
from lmforge.train import checkpoint as ckpt

TESTS_DIR = Path(__file__).resolve().parent


# -- a tiny model and a sampler with the interfaces the Trainer expects ------------------------------
@dataclasses.dataclass
class ToyConfig:
    vocab_size: int = 64
    hidden_size: int = 32
    num_layers: int = 2
    num_heads: int = 2
    seq_len: int = 16
    dropout: float = 0.1


class ToyLM(PretrainedModel):
    """A 2-layer pre-LN causal LM with tied input/output embeddings (labels = input_ids, shifted inside)."""

    config_class = ToyConfig
    model_type = "toy"

    def __init__(self, config: ToyConfig):
        super().__init__(config)
        c = config
        self.wte = nn.Embedding(c.vocab_size, c.hidden_size)
        self.wpe = nn.Embedding(c.seq_len, c.hidden_size)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(c.hidden_size, c.num_heads, 2 * c.hidden_size, c.dropout, c.dropout, norm_first=True)
            for _ in range(c.num_layers)
        )
        self.ln_f = nn.LayerNorm(c.hidden_size)
        self.head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.apply(init_weights)
        self.head.weight = self.wte.weight

    def tied_weight_keys(self) -> list[str]:
        return ["head.weight"]

    def forward(self, input_ids, labels=None, attention_mask=None) -> ModelOutput:
        B, T = input_ids.shape
        x = self.drop(self.wte(input_ids) + self.wpe(torch.arange(T, device=input_ids.device)))  # (B, T, C)
        for block in self.blocks:
            x = block(x, causal=True)
        logits = self.head(self.ln_f(x))  # (B, T, V)
        loss, metrics = None, {}
        if labels is not None:
            pred = logits[:, :-1].reshape(-1, logits.shape[-1])  # (B*(T-1), V)
            target = labels[:, 1:].reshape(-1)  # (B*(T-1),)
            loss = F.cross_entropy(pred, target, ignore_index=-100)
            acc = (pred.argmax(-1) == target).float().mean()
            metrics = {"lm_loss": loss.detach(), "lm_acc": acc.detach()}
        return ModelOutput(loss=loss, logits=logits, metrics=metrics)


def toy_tokens(n: int = 6000, vocab: int = 64, seed: int = 0) -> np.ndarray:
    """A learnable token stream: a sparse random Markov chain."""
    rng = np.random.default_rng(seed)
    nxt = rng.integers(0, vocab, size=(vocab, 3))
    out = np.empty(n, dtype=np.uint16)
    out[0] = 0
    for i in range(1, n):
        out[i] = nxt[out[i - 1], rng.integers(0, 3)]
    return out


class ToySampler:
    """Contract 3: one window per rng; train = first 90 % of the stream, val = the rest."""

    def __init__(self, tokens: np.ndarray, seq_len: int, with_mask: bool = False):
        cut = int(len(tokens) * 0.9)
        self.splits = {"train": tokens[:cut], "val": tokens[cut:]}
        self.seq_len = seq_len
        self.with_mask = with_mask

    def batch(self, rngs, split):
        toks = self.splits[split]
        rows = []
        for rng in rngs:
            start = int(rng.integers(0, len(toks) - self.seq_len))
            rows.append(torch.from_numpy(toks[start : start + self.seq_len].astype(np.int64)))
        ids = torch.stack(rows)  # (B, T)
        out = {"input_ids": ids, "labels": ids.clone()}
        if self.with_mask:
            mask = torch.ones_like(ids)
            mask[:, -3:] = 0  # pretend the last 3 positions are padding (only counted, not used)
            out["attention_mask"] = mask
        return out


def make_trainer(out_dir, dropout: float = 0.1, seed_model: int = 0, progress: bool = False, plot: bool = False,
                 **train_kw) -> Trainer:
    torch.manual_seed(seed_model)
    model = ToyLM(ToyConfig(dropout=dropout))
    kw = dict(max_steps=8, batch_size=4, lr=3e-3, warmup_steps=2, eval_every=4, eval_batches=2, log_every=1,
              save_every=4, device="cpu", precision="fp32")  # fp32 in a torchrun subprocess too
    kw.update(train_kw)
    return Trainer(model, ToySampler(toy_tokens(), model.config.seq_len), TrainConfig(**kw), out_dir,
                   progress=progress, plot=plot)


def events(out_dir, split="train") -> list[dict]:
    lines = (Path(out_dir) / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["split"] == split]


KILL_SCRIPT = """
import os, sys, time
sys.path.insert(0, {tests_dir!r})
import torch
torch.set_num_threads(1)
from test_trainer import make_trainer
from lmforge.train import Trainer

class HangAfterCheckpoint(Trainer):
    def save_checkpoint(self):
        super().save_checkpoint()
        if self.step == int(os.environ["HANG_AT"]):
            open(os.environ["MARKER"], "w").write(str(self.step))
            time.sleep(600)  # the test kills us here with SIGKILL

trainer = make_trainer(sys.argv[1])
trainer.__class__ = HangAfterCheckpoint
trainer.train()
"""


def test_resume_after_sigkill_equals_uninterrupted(tmp_path):
    """8 uninterrupted steps == 4 steps, SIGKILL of the process, --resume for 4 more (fp32, dropout on)."""
    full = make_trainer(tmp_path / "full")
    full_result = full.train()

    script = tmp_path / "train_and_hang.py"
    script.write_text(KILL_SCRIPT.format(tests_dir=str(TESTS_DIR)))
    marker = tmp_path / "checkpointed"
    env = {**os.environ, "HANG_AT": "4", "MARKER": str(marker), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "killed")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the training subprocess never reached its step-4 checkpoint"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_dir = tmp_path / "killed"
    assert json.loads((killed_dir / "training_state" / "state.json").read_text())["step"] == 4

    resumed = make_trainer(killed_dir, seed_model=123)  # a different init: everything must come from the state
    result = resumed.train(resume=True)

    full_losses = [e["loss"] for e in events(tmp_path / "full")]
    resumed_losses = [e["loss"] for e in events(killed_dir)]
    assert len(full_losses) == 8 and len(resumed_losses) == 8
    assert resumed_losses == full_losses  # bitwise: floats compared with ==
    assert [e["loss"] for e in events(killed_dir, "val")] == [e["loss"] for e in events(tmp_path / "full", "val")]
    assert result.val == full_result.val
    assert result.tokens_seen == full_result.tokens_seen == 8 * 4 * 16
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    # dropout was really on: a run without it gives other losses
    nodrop = make_trainer(tmp_path / "nodrop", dropout=0.0, max_steps=2)
    nodrop.train()
    assert [e["loss"] for e in events(tmp_path / "nodrop")][1] != full_losses[1]


def test_stop_at_max_steps_then_resume_with_more_steps(tmp_path):
    """4 steps (max_steps=4), then --resume with max_steps=8, equals 8 steps; decay_steps fixes the schedule."""
    full = make_trainer(tmp_path / "full", decay_steps=8, schedule="linear")
    full.train()
    first = make_trainer(tmp_path / "split", decay_steps=8, schedule="linear", max_steps=4).train()
    assert first.step == 4 and first.stop_reason == "max_steps"
    second = make_trainer(tmp_path / "split", decay_steps=8, schedule="linear", seed_model=7)
    second.train(resume=True)
    assert [e["loss"] for e in events(tmp_path / "split")] == [e["loss"] for e in events(tmp_path / "full")]
    assert [e["lr"] for e in events(tmp_path / "split")] == [e["lr"] for e in events(tmp_path / "full")]
    a, b = full.optimizer.state_dict()["state"], second.optimizer.state_dict()["state"]
    assert a.keys() == b.keys()
    for i in a:
        assert torch.equal(a[i]["exp_avg_sq"], b[i]["exp_avg_sq"]) and torch.equal(a[i]["step"], b[i]["step"])


def test_checkpoint_layout_has_no_pickle_and_out_dir_is_a_model_folder(tmp_path):
    make_trainer(tmp_path, max_steps=4).train()
    state_dir = tmp_path / "training_state"
    names = sorted(p.name for p in state_dir.iterdir())
    assert names == ["model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json"]
    state = json.loads((state_dir / "state.json").read_text())
    assert state["step"] == 4 and state["scheduler"]["last_epoch"] == 4
    assert state["optimizer"]["param_groups"][1]["weight_decay"] == 0.0
    from safetensors import safe_open

    with safe_open(str(state_dir / "optimizer.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert {"opt.0.exp_avg", "opt.0.exp_avg_sq", "opt.0.step"} <= keys
    with safe_open(str(state_dir / "rng.safetensors"), "pt") as f:
        assert f.get_tensor("rng.cpu.0").dtype == torch.uint8
    # the out dir is a loadable model folder (tied head weight not stored twice)
    loaded = ToyLM.from_pretrained(tmp_path, load_tokenizer=False)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "toy"
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    assert loaded.head.weight.data_ptr() == loaded.wte.weight.data_ptr()


def test_a_failed_save_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, max_steps=8, save_every=4)
    calls = {"n": 0}
    real = ckpt.save_safetensors

    def dying_save(tensors, path, metadata=None):
        calls["n"] += 1
        if calls["n"] == 5:  # the 2nd checkpoint's 2nd file: simulate a crash mid-write
            Path(path).write_bytes(b"partial")
            raise KeyboardInterrupt("killed mid-write")
        real(tensors, path, metadata)

    monkeypatch.setattr(ckpt, "save_safetensors", dying_save)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert json.loads((tmp_path / "training_state" / "state.json").read_text())["step"] == 4
    assert not list(tmp_path.glob("training_state.tmp-*"))
    monkeypatch.setattr(ckpt, "save_safetensors", real)
    resumed = make_trainer(tmp_path)
    resumed.load_checkpoint()
    assert resumed.step == 4


def test_kill_between_the_two_renames_recovers_the_old_state(tmp_path):
    make_trainer(tmp_path, max_steps=4).train()
    # the state a kill between "rename current -> old" and "rename tmp -> current" leaves behind
    os.rename(tmp_path / "training_state", tmp_path / "training_state.old-abc123")
    (tmp_path / "training_state.tmp-xyz").mkdir()
    (tmp_path / "training_state.tmp-xyz" / "model.safetensors").write_bytes(b"half")
    trainer = make_trainer(tmp_path, max_steps=6)
    result = trainer.train(resume=True)
    assert result.step == 6
    assert (tmp_path / "training_state").is_dir()
    assert not list(tmp_path.glob("training_state.*-*"))


@pytest.mark.parametrize("damage", ["truncate_optimizer", "garbage_state_json", "flip_model_byte", "missing_rng"])
def test_corrupt_checkpoint_is_a_one_line_checkpoint_error(tmp_path, damage):
    make_trainer(tmp_path, max_steps=2, save_every=2, eval_every=0).train()
    sd = tmp_path / "training_state"
    if damage == "truncate_optimizer":
        data = (sd / "optimizer.safetensors").read_bytes()
        (sd / "optimizer.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "garbage_state_json":
        (sd / "state.json").write_text('{"step": 2, "fil')
    elif damage == "flip_model_byte":
        data = bytearray((sd / "model.safetensors").read_bytes())
        data[-5] ^= 0xFF
        (sd / "model.safetensors").write_bytes(bytes(data))
    else:
        (sd / "rng.safetensors").unlink()
    with pytest.raises(CheckpointError) as e:
        make_trainer(tmp_path).train(resume=True)
    assert "\n" not in str(e.value) and "training_state" in str(e.value)


def test_resume_into_a_different_model_is_refused(tmp_path):
    make_trainer(tmp_path, max_steps=2, eval_every=0).train()
    torch.manual_seed(0)
    other = ToyLM(ToyConfig(num_layers=1))
    trainer = Trainer(other, ToySampler(toy_tokens(), 16), TrainConfig(max_steps=4, batch_size=4, device="cpu"),
                      tmp_path, progress=False)
    with pytest.raises(CheckpointError, match="different model"):
        trainer.train(resume=True)


def test_time_budget_stops_cleanly_and_saves(tmp_path, caplog):
    trainer = make_trainer(tmp_path, max_steps=1000, max_time=0.01, save_every=0, eval_every=0, plot=True)
    with caplog.at_level(logging.WARNING, logger="lmforge"):
        result = trainer.train()
    assert result.stop_reason == "max_time"
    assert 1 <= result.step < 1000
    assert json.loads((tmp_path / "training_state" / "state.json").read_text())["step"] == result.step
    assert any("time budget" in r.getMessage() and "--resume" in r.getMessage() for r in caplog.records)
    assert events(tmp_path, "val")[-1]["step"] == result.step  # a final evaluation was made
    assert (tmp_path / "training_curves.png").stat().st_size > 1000


def test_eval_metrics_perplexities_and_token_count(tmp_path):
    torch.manual_seed(0)
    model = ToyLM(ToyConfig(dropout=0.0))
    cfg = TrainConfig(max_steps=3, batch_size=2, eval_every=0, eval_batches=3, log_every=1, device="cpu",
                      warmup_steps=0)
    trainer = Trainer(model, ToySampler(toy_tokens(), 16, with_mask=True), cfg, tmp_path, progress=False)
    val0 = trainer.evaluate()
    assert set(val0) == {"loss", "ppl", "lm_loss", "lm_ppl", "lm_acc"}
    assert val0["ppl"] == pytest.approx(np.exp(val0["loss"]))
    assert val0["loss"] == pytest.approx(val0["lm_loss"])
    assert abs(val0["loss"] - np.log(64)) < 0.5  # loss at init ~ ln(V)
    assert trainer.evaluate() == val0  # the same rows every evaluation
    result = trainer.train()
    assert result.tokens_seen == 3 * 2 * 13  # attention_mask sums, not numel
    assert events(tmp_path)[0]["tokens_per_s"] > 0


def test_training_learns(tmp_path):
    trainer = make_trainer(tmp_path, dropout=0.0, max_steps=60, eval_every=0, save_every=0, log_every=10, progress=True,
                           batch_size=8, lr=1e-2, warmup_steps=5)
    before = trainer.evaluate()["loss"]
    after = trainer.train().val["loss"]
    assert after < before - 1.0, (before, after)


def test_bf16_autocast_trains(tmp_path):
    fp32 = make_trainer(tmp_path / "fp32", max_steps=2, eval_every=0, dropout=0.0).train()
    trainer = make_trainer(tmp_path / "bf16", max_steps=2, eval_every=0, dropout=0.0, precision="bf16")
    assert trainer.config.precision == "bf16" and "precision bf16 (asked for)" in trainer.precision_line
    bf16 = trainer.train()
    assert np.isfinite(bf16.val["loss"])
    assert bf16.val["loss"] != fp32.val["loss"]  # autocast really changed the arithmetic
    assert abs(bf16.val["loss"] - fp32.val["loss"]) < 0.1
    assert make_trainer(tmp_path / "x", precision="bf16").model.wte.weight.dtype == torch.float32  # master weights fp32


def test_train_config_checks():
    with pytest.raises(ConfigError, match="schedule"):
        TrainConfig(schedule="step")
    with pytest.raises(ConfigError, match="lr"):
        TrainConfig(lr=0)
    with pytest.raises(ConfigError, match="device"):
        TrainConfig(device="tpu")
    with pytest.raises(ConfigError, match="precision"):
        TrainConfig(precision="fp8")
    assert TrainConfig(device="cuda:1").device == "cuda:1"
    assert TrainConfig(max_time="1h30m").max_time == 5400.0
