"""--precision auto chosen by measurement, and how a Trainer step computes (lmforge.train.precision, .compute).

auto on a CPU with native bf16: fp32 for a narrow model without timing anything; a timed probe of a few
steps of both for a wider one, cached per machine and shape; the choice printed and saved.  The timings
are given by replacing ``autotune.best_times`` (the one function that reads a clock), so the tests say
what is chosen on a machine where those are the times.  Then the step itself: fused AdamW, the next
step's batches built while the current step computes, nothing read back from the device between log
steps, ``compile=True`` wrapping the forward in ``torch.compile``.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_trainer import ToyConfig, ToyLM, ToySampler, make_trainer, toy_tokens
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from lmforge.errors import ConfigError, LmforgeError
from lmforge.nn import autotune
from lmforge.train import TrainConfig, Trainer, compute
from lmforge.train import precision as P


def timings(monkeypatch, seconds: dict[str, float]) -> list[dict]:
    """Measurements on this 'machine' give ``seconds``; returns the candidates each measurement was given."""
    asked: list[dict] = []

    def best_times(candidates, reps=5, warmup=1):
        if "bf16" not in candidates:  # a kernel route (lmforge.nn.cpu_ops): a tie, the plain route stays
            return {k: 1.0 for k in candidates}
        asked.append(candidates)
        for fn in candidates.values():
            fn()  # the probe steps must run
        return {k: seconds[k] for k in candidates}

    monkeypatch.setattr(autotune, "best_times", best_times)
    return asked


def wide_trainer(out_dir, **kw) -> Trainer:
    """A toy LM of width 128 (bf16 is worth measuring there)."""
    torch.manual_seed(0)
    model = ToyLM(ToyConfig(hidden_size=128, dropout=0.1))
    cfg = dict(max_steps=3, batch_size=4, lr=1e-3, warmup_steps=1, eval_every=0, eval_batches=1, log_every=1,
               save_every=0, device="cpu", precision="auto")
    cfg.update(kw)
    return Trainer(model, ToySampler(toy_tokens(), model.config.seq_len), TrainConfig(**cfg), out_dir, plot=False)


# -- choosing ----------------------------------------------------------------------------------------------
def test_auto_without_native_bf16_is_fp32_and_asked_precisions_stand(monkeypatch):
    asked = timings(monkeypatch, {"fp32": 1.0, "bf16": 0.1})
    wide = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256))
    cpu = torch.device("cpu")
    choice = P.choose_precision("auto", cpu, wide, step=lambda p: (lambda: None))
    assert choice.precision == "fp32" and "no native bf16" in choice.reason and not asked  # the conftest CPU
    assert P.resolve_precision("bf16", cpu, wide) == "bf16" and P.resolve_precision("fp32", cpu) == "fp32"
    with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
        P.choose_precision("fp16", cpu, wide)


def test_a_narrow_model_is_fp32_without_a_probe(native_bf16, monkeypatch):
    asked = timings(monkeypatch, {"fp32": 1.0, "bf16": 0.1})
    narrow = nn.Sequential(nn.Embedding(500, 32), nn.Linear(32, 64), nn.Linear(64, 32), nn.Linear(32, 500))
    assert P.model_width(narrow) == 32  # the embedding is left out; the median of the matmuls' smaller sides
    choice = P.choose_precision("auto", torch.device("cpu"), narrow, step=lambda p: (lambda: None))
    assert choice.precision == "fp32" and f"below {P.MIN_BF16_WIDTH}" in choice.reason
    assert not asked and not native_bf16.exists()
    assert "precision fp32 (auto: the model's width 32" in P.describe("auto", "fp32", torch.device("cpu"),
                                                                     choice.reason)


@pytest.mark.parametrize(("bf16_s", "expected"), [(0.5, "bf16"), (0.95, "fp32"), (1.4, "fp32")])
def test_a_wide_model_is_measured_once_and_the_answer_cached(native_bf16, monkeypatch, bf16_s, expected):
    """bf16 only where it is at least BF16_MARGIN faster; the second model of the same shape reads the cache."""
    asked = timings(monkeypatch, {"fp32": 1.0, "bf16": bf16_s})
    ran: list[str] = []

    def step(precision):
        return lambda: ran.append(precision)

    wide = nn.Sequential(nn.Linear(128, 512), nn.Linear(512, 128))
    cpu = torch.device("cpu")
    choice = P.choose_precision("auto", cpu, wide, step=step, tokens=1000)
    assert choice.precision == expected and len(asked) == 1 and sorted(set(ran)) == ["bf16", "fp32"]
    assert choice.speedup == pytest.approx(1.0 / bf16_s) and "measured on this CPU" in choice.reason
    cached = json.loads(native_bf16.read_text())[autotune.machine_key()]
    assert cached[P.shape_question(wide, 1000)]["choice"] == expected
    autotune.forget()  # another process on this machine: the file answers, nothing is timed
    again = P.choose_precision("auto", cpu, nn.Sequential(nn.Linear(128, 512), nn.Linear(512, 128)), step=step,
                               tokens=1000)
    assert again.precision == expected and len(asked) == 1
    # without a step to time (a transfer run) the cached answer holds too; an unmeasured shape falls to the rule
    assert P.resolve_precision("auto", cpu, wide) in ("bf16", expected)
    assert P.choose_precision("auto", cpu, nn.Linear(1024, 1024)).precision == "bf16"


def test_a_transfer_run_takes_the_answer_measured_for_the_same_model(native_bf16, monkeypatch):
    """No step and no batch size (TransferRun, benchmark curve): the answer pretraining measured for the model's
    shape at any batch size; the line says the choice was made for the model."""
    timings(monkeypatch, {"fp32": 1.0, "bf16": 2.0})
    body = nn.Sequential(nn.Linear(128, 512), nn.Linear(512, 128))
    cpu = torch.device("cpu")
    assert P.resolve_precision("auto", cpu, body, step=lambda p: (lambda: None), tokens=2048) == "fp32"
    autotune.forget()
    choice = P.choose_precision("auto", cpu, body)  # what TransferRun asks
    assert choice.precision == "fp32" and "measured on this CPU" in choice.reason
    assert "fp32 (auto: chosen for this model on this CPU" in P.describe("auto", "fp32", cpu)


def test_the_cache_can_be_turned_off(native_bf16, monkeypatch):
    monkeypatch.setenv(autotune.CACHE_ENV, "off")
    asked = timings(monkeypatch, {"fp32": 1.0, "bf16": 0.5})
    wide = nn.Linear(256, 256)
    step = lambda p: (lambda: None)  # noqa: E731
    assert P.resolve_precision("auto", torch.device("cpu"), wide, step) == "bf16"
    assert autotune.cache_path() is None and not native_bf16.exists() and len(asked) == 1


def test_the_trainer_measures_saves_and_prints_the_choice(native_bf16, monkeypatch, tmp_path, caplog):
    timings(monkeypatch, {"fp32": 1.0, "bf16": 0.5})
    with caplog.at_level("INFO", logger="lmforge"):
        trainer = wide_trainer(tmp_path / "run")
    assert trainer.config.precision == "bf16"
    assert "precision bf16 (auto: measured on this CPU: bf16 2.00x fp32's speed" in trainer.precision_line
    assert trainer.precision_line in caplog.text
    assert all(p.grad is None for p in trainer.model.parameters())  # the probe left no gradient behind
    trainer.train()
    saved = json.loads(next((tmp_path / "run" / "training_state").glob("state.json")).read_text())
    assert saved["train_config"]["precision"] == "bf16"


def test_probing_does_not_change_the_run(native_bf16, monkeypatch, tmp_path):
    """auto that measured and chose fp32 trains exactly as --precision fp32: the probe forks the RNG."""
    timings(monkeypatch, {"fp32": 1.0, "bf16": 2.0})
    probed = wide_trainer(tmp_path / "auto")
    assert probed.config.precision == "fp32" and "bf16 0.50x" in probed.precision_line
    plain = wide_trainer(tmp_path / "fp32", precision="fp32")
    probed.train()
    plain.train()
    a = [e["loss"] for e in probed.history if e["split"] == "train"]
    b = [e["loss"] for e in plain.history if e["split"] == "train"]
    assert a == b and len(a) == 3


# -- the step --------------------------------------------------------------------------------------------------
def test_adamw_is_fused_where_torch_has_the_kernel(tmp_path):
    trainer = make_trainer(tmp_path / "run", max_steps=1)
    assert trainer.optimizer.defaults.get("fused") is (compute.fused_adamw_available(torch.device("cpu")) or None)
    if compute.fused_adamw_available(torch.device("cpu")):  # and its updates are AdamW's (to float rounding)
        torch.manual_seed(0)
        a, b = nn.Linear(8, 8), nn.Linear(8, 8)
        b.load_state_dict(a.state_dict())
        opts = [compute.make_optimizer([{"params": list(a.parameters())}], 0.1, (0.9, 0.99), 1e-8,
                                       torch.device("cpu")), torch.optim.AdamW(b.parameters(), lr=0.1,
                                                                                betas=(0.9, 0.99))]
        for _ in range(3):
            for m, opt in zip((a, b), opts):
                m(torch.ones(2, 8)).square().sum().backward()
                opt.step()
                opt.zero_grad()
        torch.testing.assert_close(a.weight, b.weight, atol=1e-6, rtol=1e-5)


class RecordingSampler(ToySampler):
    """Records which step each training batch belongs to, interleaved with the model's forward calls."""

    def __init__(self, *args, log: list, **kw):
        super().__init__(*args, **kw)
        self.log = log

    def batch(self, rngs, split):
        if split == "train":
            self.log.append(("batch", int(rngs[0].bit_generator.seed_seq.entropy[2])))
        return super().batch(rngs, split)


def test_the_next_steps_batches_are_built_before_it_starts(tmp_path):
    """Prefetch: step s+1's batches come while step s's work is queued; each once, none after the last."""
    log: list = []
    torch.manual_seed(0)
    model = ToyLM(ToyConfig(dropout=0.0))
    forward = model.forward
    model.forward = lambda *a, **k: (log.append(("forward",)), forward(*a, **k))[1]
    cfg = TrainConfig(max_steps=4, batch_size=2, grad_accum=2, warmup_steps=1, eval_every=0, eval_batches=1,
                      log_every=2, save_every=0, device="cpu", precision="fp32")
    trainer = Trainer(model, RecordingSampler(toy_tokens(), 16, log=log), cfg, tmp_path / "run", plot=False)
    log.clear()
    result = trainer.train()
    batches = [e[1] for e in log if e[0] == "batch"]
    # two micro-batches a step, each step once; the 4 is the final checkpoint's finiteness check, which
    # scores the next step's first micro-batch (run_state.loss_is_finite): no prefetch after the last step
    assert batches == [0, 0, 1, 1, 2, 2, 3, 3, 4]
    first_forward = [i for i, e in enumerate(log) if e[0] == "forward"]
    # step 1's batches are built after step 0's two forwards and before step 1's first forward
    assert log.index(("batch", 1)) > first_forward[1] and log.index(("batch", 1)) < first_forward[2]
    assert result.tokens_seen == 4 * 2 * 2 * 16  # tokens are counted when a batch is used, not when built


class ReadBacks(TorchDispatchMode):
    """Counts values read back to the host (``.item()``, ``float()``, ``bool()`` of a tensor): on a GPU each is
    a sync that stalls the host until the device catches up."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.skipif(not compute.fused_adamw_available(torch.device("cpu")),
                    reason="torch's for-each AdamW reads its step count back; the fused one does not")
def test_a_training_step_reads_nothing_back(tmp_path):
    """Between log steps the loss and the gradient norm stay tensors: no sync per step on a GPU."""
    trainer = make_trainer(tmp_path / "run", dropout=0.1, max_steps=3, log_every=3, eval_every=0, save_every=0)
    trainer._interval_loss = torch.zeros((), dtype=torch.float64)
    trainer._interval_steps = 0
    for _ in range(2):
        with ReadBacks() as reads:
            loss, grad_norm = trainer._train_step()
        trainer.step += 1
        assert reads.count == 0
        assert isinstance(loss, torch.Tensor) and isinstance(grad_norm, torch.Tensor)


def test_compile_wraps_the_training_forward(tmp_path):
    trainer = make_trainer(tmp_path / "run", max_steps=1, compile=True)
    assert isinstance(trainer.ddp_model, torch._dynamo.eval_frame.OptimizedModule)
    assert trainer.ddp_model._orig_mod.model is trainer.model  # evaluation and checkpoints use the plain model
    assert not make_trainer(tmp_path / "eager", max_steps=1).config.compile


def test_compile_is_a_flag_of_pretrain_and_not_a_set_key(capsys):
    from lmforge.cli import build_parser
    from lmforge.commands._common import refuse_flag_keys
    from lmforge.commands._runconfig import compute_flags

    parser = build_parser()
    base = ["pretrain", "gpt", "--data", "shards", "--out", "m"]
    assert compute_flags(parser.parse_args([*base, "--compile"])) == {"compile": True}
    assert "compile" not in compute_flags(parser.parse_args(base))  # absent: the run file's or the default
    with pytest.raises(LmforgeError, match="use --compile"):
        refuse_flag_keys(["compile=true"])
