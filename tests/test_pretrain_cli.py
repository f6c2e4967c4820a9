"""`lmforge pretrain`: the driver and its CLI (errors, resume, outputs), the schedule, weight decay groups,
gradient accumulation, and a smoke run of every Trainer-based family on real shards."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import types

import pytest
import torch
from test_trainer import ToyConfig, ToyLM, ToySampler, events, make_trainer, toy_tokens  # noqa: F401

from lmforge.cli import main
from lmforge.commands._runconfig import model_from_choice
from lmforge.config import apply_overrides
from lmforge.errors import ConfigError, DataError
from lmforge.families import register
from lmforge.families.gpt import GptFamily
from lmforge.train import LRSchedule, TrainConfig, Trainer, parse_duration
from lmforge.train.parameters import param_groups
from lmforge.train.pretrain import default_train_config, pretrain, run_configs


# -- a fake family over the real shards and the real CausalWindowSampler -----------------------------------
class ToyGptFamily(GptFamily):
    """The toy LM in GPT's place (the CLI's family names are fixed), with its own presets and setup."""

    model_class, config_class = ToyLM, ToyConfig

    def preset_module(self):
        return types.SimpleNamespace(
            PRESETS={"tiny": dict(hidden_size=32, num_layers=2, dropout=0.1), "one": dict(num_layers=1)},
            DEFAULT_PRESET="tiny",
            TRAIN_DEFAULTS=dict(lr=2e-3, batch_size=2, eval_batches=2, warmup_steps=1, log_every=1, eval_every=2,
                                save_every=2, device="cpu"))

    def pretraining_setup(self, config, shards, tokenizer, recipe=None):
        from lmforge.data.samplers import CausalWindowSampler

        config = dataclasses.replace(config, vocab_size=tokenizer.vocab_size)
        model = ToyLM(config)
        model.tokenizer = tokenizer
        return model, CausalWindowSampler(shards, config.seq_len)


@pytest.fixture
def toy_family():
    """`lmforge pretrain gpt` runs the toy family."""
    with register(ToyGptFamily(), replace=True):
        yield "gpt"


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["-q", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_pretrain_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["pretrain", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--data", "--out", "--config", "--set", "--max-time", "--resume", "--tokenizer", "--device",
                 "--precision", "--json"):
        assert flag in out
    assert "--max-steps" not in out and "--log " not in out  # one way to say each: --set max_steps=N, log=...
    assert "bert,gpt,elmo,word2vec" in out


def test_unknown_set_key_is_one_line_and_exit_2(tmp_path):
    """A real process with the real GPT family: no traceback, one line naming the close key."""
    proc = subprocess.run(
        [sys.executable, "-m", "lmforge.cli", "pretrain", "gpt", "--data", str(tmp_path / "none"), "--out",
         str(tmp_path / "m"), "--set", "n_layers=3"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "unknown --set key 'n_layers'" in lines[0] and "did you mean 'n_layer'" in lines[0]
    assert "training keys:" in lines[0] and "max_steps" in lines[0]
    assert not (tmp_path / "m").exists()  # config errors are found before anything is written


def test_cli_trains_and_writes_a_complete_model_folder(toy_family, bpe_shards, tmp_path, capsys):
    out = tmp_path / "model"
    rc, stdout, err = run_cli(capsys, "pretrain", toy_family, "--data", str(bpe_shards), "--out", str(out),
                              "--set", "max_steps=4", "--set", "lr=1e-3", "seed=3")
    assert rc == 0, err
    assert "after 4 steps" in stdout and "final validation metrics" in stdout
    assert "ppl" in stdout and "lm_acc" in stdout
    for name in ("config.json", "model.safetensors", "tokenizer.json", "train_config.json", "metrics.jsonl",
                 "training_curves.png", "training_state"):
        assert (out / name).exists(), name
    assert (out / "training_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tc = json.loads((out / "train_config.json").read_text())
    assert tc["lr"] == 1e-3 and tc["seed"] == 3 and tc["max_steps"] == 4 and tc["batch_size"] == 2  # family default
    evs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evs if e["split"] == "train"] == [1, 2, 3, 4]
    assert [e["step"] for e in evs if e["split"] == "val"] == [2, 4]
    assert {"step", "split", "loss", "metrics", "lr", "tokens_per_s", "tokens", "elapsed"} <= set(evs[0])
    model = ToyLM.from_pretrained(out)
    assert model.tokenizer is not None and model.config.vocab_size == model.tokenizer.vocab_size

    # without --resume an existing model folder is not overwritten
    rc, _, err = run_cli(capsys, "pretrain", toy_family, "--data", str(bpe_shards), "--out", str(out))
    assert rc == 2 and "--resume" in err and len(err.strip().splitlines()) == 1

    # --resume with a larger step budget continues from step 4
    rc, stdout, err = run_cli(capsys, "pretrain", toy_family, "--data", str(bpe_shards), "--out", str(out),
                              "--resume", "--set", "max_steps=6")
    assert rc == 0, err
    assert "after 6 steps" in stdout
    evs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evs if e["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    tc = json.loads((out / "train_config.json").read_text())
    assert tc["lr"] == 1e-3 and tc["max_steps"] == 6  # saved settings kept, the new budget recorded


def test_cli_resume_equals_uninterrupted(toy_family, bpe_shards, tmp_path, capsys):
    common = ["--data", str(bpe_shards), "--set", "decay_steps=4"]
    for out, steps in (("a", 4), ("b", 2)):
        assert run_cli(capsys, "pretrain", toy_family, "--out", str(tmp_path / out), "--set", f"max_steps={steps}",
                       *common)[0] == 0
    assert run_cli(capsys, "pretrain", toy_family, "--out", str(tmp_path / "b"), "--set", "max_steps=4", "--resume",
                   *common)[0] == 0
    assert [e["loss"] for e in events(tmp_path / "b")] == [e["loss"] for e in events(tmp_path / "a")]


def test_corrupt_checkpoint_on_resume_is_one_line(toy_family, bpe_shards, tmp_path, capsys):
    out = tmp_path / "model"
    assert run_cli(capsys, "pretrain", toy_family, "--data", str(bpe_shards), "--out", str(out), "--set",
                   "max_steps=2")[0] == 0
    opt = out / "training_state" / "optimizer.safetensors"
    opt.write_bytes(opt.read_bytes()[:100])
    rc, _, err = run_cli(capsys, "pretrain", toy_family, "--data", str(bpe_shards), "--out", str(out), "--resume",
                         "--set", "max_steps=4")
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "corrupt" in err and "Traceback" not in err


def test_resume_without_a_checkpoint_is_one_line(toy_family, bpe_shards, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "pretrain", toy_family, "--data", str(bpe_shards), "--out", str(tmp_path / "m"),
                         "--resume")
    assert rc == 2 and "no training_state/" in err and len(err.strip().splitlines()) == 1


def test_shards_of_another_tokenizer_are_refused(toy_family, bpe_shards, wordpiece_tokenizer_dir, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "pretrain", toy_family, "--data", str(bpe_shards), "--out", str(tmp_path / "m"),
                         "--tokenizer", str(wordpiece_tokenizer_dir))
    assert rc == 2
    assert f"shards in {bpe_shards} were made by tokenizer" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m" / "training_state").exists()


def test_bad_inputs_are_one_line_errors(toy_family, bpe_shards, tmp_path, capsys):
    base = ["pretrain", toy_family, "--out", str(tmp_path / "m")]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one text\n", encoding="utf-8")
    cases = {
        "bad duration": ([*base, "--data", str(bpe_shards), "--max-time", "5x"], "bad duration"),
        "missing shards": ([*base, "--data", str(tmp_path / "nothing")], "shard folder not found"),
        # a text corpus where the shards go: the advice makes shards from it, never writes over it
        "a corpus file": ([*base, "--data", str(corpus)],
                          f"lmforge prepare --tokenizer TOKENIZER --out {tmp_path / 'corpus-shards'} {corpus}, "
                          f"then give {tmp_path / 'corpus-shards'}"),
        "unknown preset": ([*base, "--data", str(bpe_shards), "--config", "huge"], "unknown gpt preset 'huge'"),
        "bad value": ([*base, "--data", str(bpe_shards), "--set", "schedule=step"], "schedule must be one of"),
        "bad type": ([*base, "--data", str(bpe_shards), "--set", "batch_size=two"], "expects an integer"),
    }
    for name, (argv, expected) in cases.items():
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2, name
        assert expected in err and len(err.strip().splitlines()) == 1, (name, err)


def test_config_file_and_override_routing(toy_family, bpe_shards, tmp_path):
    cfg = tmp_path / "toy.json"
    cfg.write_text(json.dumps({"model_type": "gpt", "num_layers": 1, "hidden_size": 16}))
    result = pretrain(toy_family, bpe_shards, tmp_path / "m",
                      apply_overrides(model_from_choice(toy_family, str(cfg)), {"num_heads": 4}),
                      default_train_config(toy_family, max_steps=2, eval_batches=1))
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["num_layers"] == 1 and saved["hidden_size"] == 16 and saved["num_heads"] == 4
    assert result.step == 2 and set(result.val) >= {"loss", "ppl", "lm_loss", "lm_ppl", "lm_acc"}
    cfg.write_text(json.dumps({"num_layer": 1}))
    with pytest.raises(ConfigError, match="unknown config key 'num_layer'"):
        model_from_choice(toy_family, str(cfg))
    cfg.write_text(json.dumps({"model_type": "bert", "num_layers": 1}))
    with pytest.raises(ConfigError, match="is a 'bert' config, not a 'gpt' one"):
        model_from_choice(toy_family, str(cfg))
    with pytest.raises(DataError, match="shard folder not found"):
        pretrain(toy_family, tmp_path / "none", tmp_path / "m3", train=default_train_config(toy_family, max_time=900))


# -- schedule, weight decay, accumulation ----------------------------------------------------------------
@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_schedule_shape(kind):
    s = LRSchedule(warmup_steps=10, decay_steps=110, kind=kind, min_lr_ratio=0.1)
    assert s(0) == pytest.approx(0.1)  # the first step already learns
    assert [s(i) for i in range(10)] == pytest.approx([(i + 1) / 10 for i in range(10)])
    assert s(9) == 1.0 and s(10) == 1.0  # peak at the end of warm-up
    assert s(60) == pytest.approx(0.55)  # half-way: linear and cosine agree at the midpoint
    assert s(110) == pytest.approx(0.1) and s(500) == pytest.approx(0.1)  # min_lr from decay_steps on
    values = [s(i) for i in range(10, 120)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # monotone decay
    if kind == "cosine":
        assert s(35) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * 0.25)) / 2)
        assert s(35) > 1 - 0.9 * 0.25  # cosine stays above the linear line early on
    else:
        assert s(35) == pytest.approx(1 - 0.9 * 0.25)
    assert LRSchedule(0, 10, kind, 0.0)(0) == 1.0  # no warm-up
    assert LRSchedule(5, 10, "constant", 0.1)(100) == 1.0


def test_scheduler_drives_the_optimizer_lr(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=6, warmup_steps=2, schedule="linear", min_lr_ratio=0.0, lr=1e-2,
                           eval_every=0)
    trainer.train()
    lrs = [e["lr"] for e in events(tmp_path)]  # the lr each step used
    assert lrs == pytest.approx([0.5e-2, 1e-2, 1e-2, 1e-2 * 3 / 4, 1e-2 * 2 / 4, 1e-2 * 1 / 4])
    assert trainer.optimizer.param_groups[0]["lr"] == 0.0  # what a 7th step would use: min_lr


def test_max_time_parsing():
    assert parse_duration("90s") == 90 and parse_duration("15m") == 900 and parse_duration("1h") == 3600
    assert parse_duration("1h30m") == 5400 and parse_duration("45") == 45 and parse_duration(2.5) == 2.5
    for bad in ("", "abc", "5x", "0", "-3m", "1h-"):
        with pytest.raises(ConfigError):
            parse_duration(bad)


def test_no_weight_decay_on_biases_and_layernorm():
    torch.manual_seed(0)
    model = ToyLM(ToyConfig())
    groups, names = param_groups(model, 0.1)
    decay = set(names[: len(groups[0]["params"])])
    no_decay = set(names[len(groups[0]["params"]) :])
    assert "wte.weight" in decay and "blocks.0.attn.qkv.weight" in decay and "blocks.1.mlp.fc.weight" in decay
    assert "blocks.0.attn.qkv.bias" in no_decay and "blocks.0.ln_attn.weight" in no_decay
    assert "ln_f.weight" in no_decay and "ln_f.bias" in no_decay
    assert "head.weight" not in names  # tied to wte: optimised once
    assert all(n.endswith("bias") or ".ln" in n or n.startswith("ln_") for n in no_decay)
    # behaviour: with zero gradients AdamW only decays, so decayed weights shrink and the rest stay
    trainer = Trainer(model, ToySampler(toy_tokens(), 16), TrainConfig(lr=0.5, weight_decay=0.2, device="cpu"),
                      "unused", progress=False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    trainer.optimizer.step()
    after = dict(model.named_parameters())
    factor = 1 - trainer.optimizer.param_groups[0]["lr"] * 0.2
    torch.testing.assert_close(after["wte.weight"], before["wte.weight"] * factor)
    for n in ("blocks.0.attn.qkv.bias", "blocks.0.ln_attn.weight", "ln_f.bias"):
        assert torch.equal(after[n], before[n]), n


def test_grad_accumulation_2x_b_equals_1x_2b(tmp_path):
    # in float64, so that summing a batch in two halves differs from one sum by rounding only (~1e-14); in
    # float32 Adam's normalised step turns that rounding into ~1e-5 differences on some CPUs' kernels
    torch.set_default_dtype(torch.float64)
    try:
        one = make_trainer(tmp_path / "one", dropout=0.0, batch_size=4, grad_accum=1, max_steps=4, eval_every=4)
        r1 = one.train()
        two = make_trainer(tmp_path / "two", dropout=0.0, batch_size=2, grad_accum=2, max_steps=4, eval_every=4)
        r2 = two.train()
    finally:
        torch.set_default_dtype(torch.float32)
    assert next(one.model.parameters()).dtype == torch.float64
    l1, l2 = [e["loss"] for e in events(tmp_path / "one")], [e["loss"] for e in events(tmp_path / "two")]
    assert l1 == pytest.approx(l2, abs=1e-6, rel=0)  # the Trainer sums logged losses in float32
    assert r1.val["loss"] == pytest.approx(r2.val["loss"], abs=1e-6, rel=0)  # the same validation rows
    assert r1.tokens_seen == r2.tokens_seen
    for (n, a), b in zip(one.model.named_parameters(), two.model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=n)


# -- every Trainer-based family through the real driver ---------------------------------------------------
@pytest.mark.parametrize(
    ("family", "shards_fixture", "sets"),
    [
        ("gpt", "bpe_shards", ["n_positions=32"]),
        ("bert", "wordpiece_shards", ["max_seq_length=32", "max_position_embeddings=64"]),
        ("elmo", "bpe_shards", ["seq_len=16"]),
    ],
)
def test_real_family_smoke(family, shards_fixture, sets, request, tmp_path, capsys):
    shards = request.getfixturevalue(shards_fixture)
    out = tmp_path / family
    rc, stdout, err = run_cli(capsys, "pretrain", family, "--data", str(shards), "--out", str(out), "--config",
                              "tiny", "--device", "cpu", "--set", "max_steps=2", "batch_size=2", "eval_batches=1",
                              *sets)
    assert rc == 0, err
    assert "final validation metrics" in stdout
    import lmforge

    model = lmforge.load(out)
    assert model.model_type == family and model.tokenizer is not None
    assert json.loads((out / "training_state" / "state.json").read_text())["step"] == 2


# -- --init: continued (domain-adaptive) pretraining from a model folder ----------------------------------
def test_init_starts_from_the_folder_weights(bpe_shards, wordpiece_shards, tmp_path, capsys):
    import lmforge
    from lmforge.storage.files import load_safetensors

    sets = ["batch_size=2", "eval_batches=2", "device=cpu", "n_positions=32", "warmup_steps=1"]
    kw = dict(batch_size=2, eval_batches=2, device="cpu", n_positions=32, warmup_steps=1)
    base = tmp_path / "base"
    r0 = pretrain("gpt", bpe_shards, base, *run_configs("gpt", "tiny", **kw, max_steps=8, lr=3e-3))
    fresh = pretrain("gpt", bpe_shards, tmp_path / "fresh", *run_configs("gpt", "tiny", **kw, max_steps=1, lr=1e-12))
    # one step at a vanishing learning rate: the run starts from (and stays at) the folder's weights
    cont = tmp_path / "cont"
    r1 = pretrain("gpt", bpe_shards, cont, None, run_configs("gpt", **kw, max_steps=1, lr=1e-12)[1], init=base)
    assert abs(r1.val["loss"] - r0.val["loss"]) < 1e-4, (r0.val, r1.val)
    assert fresh.val["loss"] > r0.val["loss"] + 0.1  # the folder's weights are not a fresh init
    a, b = load_safetensors(base / "model.safetensors"), load_safetensors(cont / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-7) for k in a)
    assert lmforge.load(cont).config == lmforge.load(base).config
    assert json.loads((cont / "training_state" / "state.json").read_text())["step"] == 1  # a new run
    # what does not fit is one line, exit 2
    bert = tmp_path / "bert"
    pretrain("bert", wordpiece_shards, bert, *run_configs("bert", "tiny", max_steps=1, batch_size=2, eval_batches=1,
                                                          device="cpu", max_seq_length=32, max_position_embeddings=64))
    cases = [
        (["gpt", "--data", str(bpe_shards), "--init", str(bert)], "holds a 'bert' model"),
        (["gpt", "--data", str(bpe_shards), "--init", str(base), "--config", "tiny"], "drop --config"),
        (["gpt", "--data", str(bpe_shards), "--init", str(base), "--resume"], "give one of them"),
        (["gpt", "--data", str(wordpiece_shards), "--init", str(base)], "the tokenizer of the model in"),
        (["gpt", "--data", str(bpe_shards), "--init", str(tmp_path / "nope")], "is not a model folder"),
    ]
    for k, (argv, msg) in enumerate(cases):
        rc, _, err = run_cli(capsys, "pretrain", *argv, "--out", str(tmp_path / f"bad{k}"), "--device", "cpu", "--set",
                             *[x for x in sets if x != "device=cpu"])
        assert rc == 2 and msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_init_continues_an_electra_generator_and_discriminator(wordpiece_shards, tmp_path):
    from lmforge.storage.files import load_safetensors

    kw = dict(batch_size=2, eval_batches=2, device="cpu", max_seq_length=32, max_position_embeddings=64,
              warmup_steps=1)
    base = tmp_path / "base"
    r0 = pretrain("electra", wordpiece_shards, base, *run_configs("electra", "tiny", **kw, max_steps=6, lr=3e-3))
    cont = tmp_path / "cont"
    r1 = pretrain("electra", wordpiece_shards, cont, None, run_configs("electra", **kw, max_steps=1, lr=1e-12)[1],
                  init=base)
    # the generator's masked LM starts where the folder's ended (the replaced-token loss depends on its samples)
    assert abs(r1.val["mlm_loss"] - r0.val["mlm_loss"]) < 1e-4, (r0.val, r1.val)
    a, b = load_safetensors(base / "model.safetensors"), load_safetensors(cont / "model.safetensors")
    assert any(k.startswith("generator.") for k in a) and a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], atol=1e-7) for k in a)


# -- evaluate lm: a model folder's own objective on other shards ------------------------------------------
@pytest.mark.parametrize(
    ("family", "shards_fixture", "sets"),
    [
        ("gpt", "bpe_shards", {"n_positions": 32}),
        ("bert", "wordpiece_shards", {"max_seq_length": 32, "max_position_embeddings": 64}),
        ("elmo", "bpe_shards", {"seq_len": 16}),
    ],
)
def test_evaluate_lm_gives_the_final_validation_of_pretraining(family, shards_fixture, sets, request, tmp_path,
                                                                capsys):
    from lmforge.train.pretrain import evaluate_lm

    shards = request.getfixturevalue(shards_fixture)
    out = tmp_path / family
    r = pretrain(family, shards, out, *run_configs(family, "tiny", max_steps=3, batch_size=2, eval_batches=3,
                                                    device="cpu", **sets))
    # the same rows, masks and weights as the run's last validation: the same numbers
    val = evaluate_lm(out, shards, batches=3, batch_size=2)
    assert val.keys() == r.val.keys()
    assert all(abs(val[k] - r.val[k]) <= 1e-6 * max(1.0, abs(r.val[k])) for k in val), (val, r.val)
    rc, stdout, err = run_cli(capsys, "evaluate", "lm", str(out), "--data", str(shards), "--batches", "3",
                              "--batch-size", "2", "--split", "train", "--json")
    got = json.loads(stdout)
    assert rc == 0 and got["split"] == "train" and math.isfinite(got["loss"])
    ppls = [k for k in got if k.endswith("ppl")]  # ppl (GPT, ELMo) or mlm_ppl (BERT with NSP)
    assert ppls and all(math.isclose(got[k], math.exp(got[k[:-3] + "loss"]), rel_tol=1e-6) for k in ppls)


def test_evaluate_lm_errors_are_one_line(bpe_shards, wordpiece_shards, tmp_path, capsys):
    out = tmp_path / "gpt"
    pretrain("gpt", bpe_shards, out, *run_configs("gpt", "tiny", max_steps=1, batch_size=2, eval_batches=1,
                                                   device="cpu", n_positions=32))
    for argv, msg in (
        ([str(out), "--data", str(wordpiece_shards)], "the tokenizer of the model in"),
        ([str(out), "--data", str(bpe_shards), "--set", "lr=1"], "model-config keys only"),
        ([str(out), "--data", str(bpe_shards), "--set", "n_embd_typo=1"], "unknown --set key"),
        ([str(tmp_path / "nope"), "--data", str(bpe_shards)], "is not a model folder"),
        ([str(out), "--data", str(bpe_shards), "--batches", "0"], "--batches must be 1 or more"),
    ):
        rc, _, err = run_cli(capsys, "evaluate", "lm", *argv)
        assert rc == 2 and msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
