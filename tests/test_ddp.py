"""DDP through torchrun: 2 CPU processes (gloo) with b rows each train like 1 process with 2b rows."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys

import pytest
import torch
from test_trainer import TESTS_DIR, events, make_trainer

DDP_SCRIPT = """
import json, sys
sys.path.insert(0, {tests_dir!r})
import torch
import torch.distributed as dist
torch.set_num_threads(1)
from test_trainer import make_trainer
from lmforge.train import distributed

out = sys.argv[1]
# Two runs in one launch: plain data parallel, and data parallel with gradient accumulation.
# The first Trainer joins the process group itself (as `lmforge pretrain` under torchrun does).
a = make_trainer(out + "/b2", dropout=0.0, max_steps=3, batch_size=2, eval_every=3, save_every=3)
ra = a.train()
assert a.env.world_size == 2 and a.env.owns_group and dist.get_backend() == "gloo"
b = make_trainer(out + "/b1_accum2", dropout=0.0, max_steps=3, batch_size=1, grad_accum=2, eval_every=3,
                 save_every=3)
rb = b.train()
assert not b.env.owns_group  # it found the group made by the first trainer
# A model whose loss leaves a parameter out (like BERT's NSP head with next_sentence=false): the probe
# step finds it and DDP is told to look for unused parameters instead of failing at the second step.
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from test_trainer import ToyConfig, ToyLM, ToySampler, toy_tokens
from lmforge.train import Trainer, TrainConfig
m = ToyLM(ToyConfig(dropout=0.0))
m.extra_head = nn.Linear(32, 2)
c = Trainer(m, ToySampler(toy_tokens(), 16), TrainConfig(max_steps=3, batch_size=2, eval_every=0, save_every=0,
            device="cpu"), out + "/unused", progress=False, plot=False)
assert isinstance(c.ddp_model, DistributedDataParallel) and c.ddp_model.find_unused_parameters
c.model.forward_orig = c.model.forward
def forward_with_extra_logits(**batch):  # an output the loss does not use, as BERT's NSP logits
    out = c.model.forward_orig(**batch)
    out.hidden_states = (c.model.extra_head(c.model.wte(batch["input_ids"])),)
    return out
c.model.forward = forward_with_extra_logits
assert not a.ddp_model.find_unused_parameters
c.train()

# Real families through the driver: BERT without NSP (an unused head) and ELMo (an int16 buffer gloo
# cannot broadcast) used to break DDP; ELECTRA shares its embeddings between two encoders.
from lmforge.train.pretrain import pretrain, run_configs
small = dict(max_steps=2, batch_size=2, eval_batches=1, device="cpu")
rbert = pretrain("bert", sys.argv[2], out + "/bert", *run_configs("bert", "tiny", **small, next_sentence=False,
                 max_seq_length=32, max_position_embeddings=64), progress=False)
relmo = pretrain("elmo", sys.argv[3], out + "/elmo", *run_configs("elmo", "tiny", **small, seq_len=16),
                 progress=False)
# ELECTRA: one embedding table read by both the generator and the discriminator, samples drawn on each rank
relectra = pretrain("electra", sys.argv[2], out + "/electra", *run_configs("electra", "tiny", **small,
                    max_seq_length=32, max_position_embeddings=64), progress=False)
assert rbert.step == 2 and relmo.step == 2 and relectra.step == 2
if a.env.rank == 0:
    json.dump({{"a": ra.val, "b": rb.val, "tokens": ra.tokens_seen, "bert": rbert.val, "elmo": relmo.val,
               "electra": relectra.val}},
              open(out + "/val.json", "w"))
a.close()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_ddp_equals_one_process_with_the_global_batch(tmp_path, wordpiece_shards, bpe_shards):
    script = tmp_path / "ddp_train.py"
    script.write_text(DDP_SCRIPT.format(tests_dir=str(TESTS_DIR)))
    out = tmp_path / "ddp"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), str(script), str(out), str(wordpiece_shards), str(bpe_shards)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ddp_val = json.loads((out / "val.json").read_text())

    from lmforge.storage.files import load_safetensors

    for name, ddp_dir in (("a", out / "b2"), ("b", out / "b1_accum2")):
        single = make_trainer(tmp_path / f"single_{name}", dropout=0.0, max_steps=3, batch_size=4, eval_every=3,
                              save_every=3)
        single_result = single.train()
        ddp_losses = [e["loss"] for e in events(ddp_dir)]
        single_losses = [e["loss"] for e in events(tmp_path / f"single_{name}")]
        assert len(ddp_losses) == 3  # rank 1 wrote nothing: no duplicated lines
        assert ddp_losses == pytest.approx(single_losses, abs=1e-5, rel=0)
        assert ddp_val[name]["loss"] == pytest.approx(single_result.val["loss"], abs=1e-5, rel=0)
        # Adam divides by sqrt(v): on elements with near-zero gradients a 1e-7 difference in the summed
        # gradient can move the update by ~1e-5 of lr, hence the looser tolerance on the weights.
        ddp_weights = load_safetensors(ddp_dir / "model.safetensors")
        for key, w in load_safetensors(tmp_path / f"single_{name}" / "model.safetensors").items():
            torch.testing.assert_close(ddp_weights[key], w, atol=1e-4, rtol=0)
        state = json.loads((ddp_dir / "training_state" / "state.json").read_text())
        assert state["world_size"] == 2
        rng = load_safetensors(ddp_dir / "training_state" / "rng.safetensors")
        assert {"rng.cpu.0", "rng.cpu.1"} <= set(rng)  # every rank's dropout RNG is kept for resume
    assert ddp_val["tokens"] == 3 * 4 * 16  # tokens summed over both ranks
    assert math.isfinite(ddp_val["bert"]["mlm_loss"]) and "nsp_loss" not in ddp_val["bert"]
    assert math.isfinite(ddp_val["elmo"]["fwd_loss"])
    assert math.isfinite(ddp_val["electra"]["rtd_loss"]) and math.isfinite(ddp_val["electra"]["mlm_loss"])
