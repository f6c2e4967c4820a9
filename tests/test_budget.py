"""`lmforge pretrain FAMILY --budget 15m|20Mtok` and `--plan plan.json`: the budget parser, the planner's choice
(with a fake throughput probe), the real probe, one-line errors, and a replay that gives the same weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lmforge.cli import main
from lmforge.data.shards import Shards
from lmforge.errors import ConfigError
from lmforge.families import FAMILIES
from lmforge.families.bert.data import MaskedLMRecipe
from lmforge.train import budget as B
from lmforge.train import budget_probe as P
from lmforge.train import budget_search as S
from lmforge.train.pretrain import default_train_config

# GPT shapes small enough for the test shards; the model keys apply to every candidate
SMALL = {"n_positions": "32"}


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["-q", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def one_line_error(rc: int, err: str, *words: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)


# -- the budget string --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "kind", "value"), [
    ("15m", "time", 900.0), ("1h30m", "time", 5400.0), ("90s", "time", 90.0), ("90", "time", 90.0),
    ("20Mtok", "tokens", 20_000_000), ("500k tokens", "tokens", 500_000), ("1.5Btok", "tokens", 1_500_000_000),
    ("4096tok", "tokens", 4096),
])
def test_parse_budget(text, kind, value):
    b = B.parse_budget(text)
    assert b.kind == kind
    assert (b.seconds if kind == "time" else b.tokens) == value


@pytest.mark.parametrize("text", ["soon", "15 minutes", "20M", "-5m", "0tok", ""])
def test_bad_budget_is_a_config_error(text):
    with pytest.raises(ConfigError) as e:
        B.parse_budget(text)
    assert "\n" not in str(e.value) and ("budget" in str(e.value) or "positive" in str(e.value))


# -- the planner with a fake probe --------------------------------------------------------------------------
class FakeProbe:
    """Throughput inversely proportional to the parameters (``k / N`` tokens/s); records what it probed."""

    def __init__(self, k: float, seconds: float = 2.0):
        self.k, self.seconds, self.calls = k, seconds, []

    def __call__(self, family, cand, train, shards, max_seconds):
        self.calls.append(cand.name)
        return B.ProbeResult(self.k / cand.params, 3, self.seconds)


@pytest.fixture
def unlimited_data(monkeypatch):
    """The planner as if the shards were endless: only the compute-optimal rule chooses."""
    monkeypatch.setattr(B, "MAX_EPOCHS", 1e12)
    for family in FAMILIES.values():
        monkeypatch.setattr(family, "max_epochs", None)
    monkeypatch.setattr(S, "FULL_VALUE_EPOCHS", 1e12)


def _expected_choice(cands, k, seconds, probe_seconds, train, probed):
    train_s = (seconds - probe_seconds) * (1 - P.RESERVE)
    best = None
    for c in cands:
        if c.name not in probed:
            continue
        steps = int(k / c.params * train_s / (c.tokens_per_step * P.eval_factor(train)))
        r = steps * c.tokens_per_step / c.body_params / S.TOKENS_PER_PARAM  # the rule counts body parameters
        score = math.log(r) if r >= 1 else -S.UNDERTRAIN_WEIGHT * math.log(r)
        if steps >= B.MIN_STEPS and (best is None or (round(score, 4), -c.params) < best[0]):
            best = ((round(score, 4), -c.params), c.name, steps)
    return best[1], best[2]


def test_default_plan_probes_the_chosen_preset_only(bpe_shards):
    """The default plan: probe the default preset, steps from its tokens/s, no other shape considered."""
    shards = Shards.open(bpe_shards)
    train = default_train_config("gpt")
    default = FAMILIES["gpt"].default_preset
    tiny = B.make_candidates("gpt", shards, train, default, SMALL)[0]
    probe = FakeProbe(5e9)
    plan = B.plan_budget("gpt", shards, "15m", model_fields=SMALL, probe=probe)
    assert probe.calls == [default] and plan.preset == default and len(plan.candidates) == 1
    tps = 5e9 / tiny.params
    steps = int(tps * P.train_seconds(900.0, probe.seconds) / (tiny.tokens_per_step * P.eval_factor(train)))
    cap = int(B.MAX_EPOCHS * shards.counts("train")["tokens"] / tiny.tokens_per_step)
    assert plan.max_steps == min(steps, cap)
    assert "score" not in plan.candidates[0]


def test_plan_is_deterministic_and_follows_the_rule(bpe_shards, unlimited_data):
    shards = Shards.open(bpe_shards)
    train = default_train_config("gpt")
    cands = B.make_candidates("gpt", shards, train, None, SMALL)
    assert [c.name for c in cands][:3] == ["tiny", "mini", "small"]  # smallest first
    assert all(a.params < b.params and a.body_params < b.body_params for a, b in zip(cands, cands[1:]))
    assert all(c.body_params < c.params for c in cands)  # the embeddings are left out
    # 15 minutes at k / N tokens/s with k chosen so that 'mini' sees about 10 tokens per body parameter:
    # the compute-optimal rule with the cramming tilt prefers it to 'tiny' (far over 20 tokens/param)
    mini = cands[1]
    k = 10 * mini.body_params * mini.params / (900 * 0.9)
    probe = FakeProbe(k)
    plan = B.plan_budget("gpt", shards, "15m", search_shape=True, model_fields=SMALL, probe=probe)
    again = B.plan_budget("gpt", shards, "15m", search_shape=True, model_fields=SMALL, probe=FakeProbe(k))
    assert plan.to_json() == again.to_json()
    # the probe stops at the first shape that is already under-trained: larger ones only more so
    assert probe.calls == ["tiny", "mini"]
    name, steps = _expected_choice(cands, k, 900.0, 2 * probe.seconds, train, probe.calls)
    assert (plan.preset, plan.max_steps) == (name, steps) == ("mini", steps)
    assert plan.tokens_per_param < S.TOKENS_PER_PARAM < plan.candidates[0]["tokens_per_param"]
    assert plan.expected_tokens == int(steps * mini.tokens_per_step)
    assert plan.params == mini.params and plan.body_params == mini.body_params
    assert plan.seq_len == 32 and plan.batch_size == train.batch_size
    # training hyper-parameters come from the family's defaults, the warm-up is capped at 10 % of the steps
    assert plan.train["lr"] == train.lr and plan.train["beta2"] == train.beta2
    assert plan.warmup_steps == min(train.warmup_steps, int(0.1 * steps)) == plan.train["warmup_steps"]
    assert plan.train["max_steps"] == steps and plan.train["max_time"] is None
    assert plan.model["n_embd"] == 128 and plan.model["n_positions"] == 32
    assert plan.probe_tokens_per_s == pytest.approx(k / mini.params, abs=0.1)
    assert "not probed" in plan.candidates[2]["note"]
    text = plan.describe()
    assert "'mini'" in text and f"{steps:,} steps" in text


def test_twice_the_budget_buys_a_larger_shape(bpe_shards, unlimited_data):
    shards = Shards.open(bpe_shards)
    train = default_train_config("gpt")
    cands = B.make_candidates("gpt", shards, train, None, SMALL)
    mini = cands[1]
    k = 10 * mini.body_params * mini.params / (900 * 0.9)
    small_budget = B.plan_budget("gpt", shards, "15m", search_shape=True, model_fields=SMALL, probe=FakeProbe(k))
    big_budget = B.plan_budget("gpt", shards, "16h", search_shape=True, model_fields=SMALL, probe=FakeProbe(k))
    assert big_budget.params > small_budget.params


def test_token_budget_needs_no_probe(bpe_shards, unlimited_data):
    def no_probe(*a):
        raise AssertionError("a token budget must not probe")

    shards = Shards.open(bpe_shards)
    train = default_train_config("gpt")
    cands = {c.name: c for c in B.make_candidates("gpt", shards, train, None, SMALL)}
    tokens = int(20 * cands["mini"].body_params)  # exactly Chinchilla's 20 tokens per body parameter for 'mini'
    plan = B.plan_budget("gpt", shards, f"{tokens}tok", search_shape=True, model_fields=SMALL, probe=no_probe)
    assert plan.preset == "mini" and plan.max_steps == int(tokens / cands["mini"].tokens_per_step)
    assert plan.probe_tokens_per_s is None and plan.expected_seconds is None and plan.budget_kind == "tokens"


def test_small_data_caps_the_epochs_and_warns(bpe_shards):
    shards = Shards.open(bpe_shards)
    unique = shards.counts("train")["tokens"]
    plan = B.plan_budget("gpt", shards, "500Mtok", model="tiny", model_fields=SMALL)
    assert plan.epochs <= B.MAX_EPOCHS and plan.epochs > B.MAX_EPOCHS - 1
    assert plan.max_steps == int(B.MAX_EPOCHS * unique / plan.tokens_per_step)
    assert any("prepare more text" in w for w in plan.warnings)
    assert plan.candidates == [c for c in plan.candidates if c["name"] == "tiny"]  # --config: one candidate


@pytest.mark.parametrize("family", ["bert", "electra"])
def test_masked_families_plan_up_to_twice_the_passes(wordpiece_shards, family):
    """Masked-LM pretraining draws new masks on every pass (ELECTRA's too): their cap is 32 passes, the others' 16."""
    assert B.max_epochs(family) == 32.0 and B.max_epochs("gpt") == B.max_epochs("elmo") == B.MAX_EPOCHS == 16.0
    shards = Shards.open(wordpiece_shards)
    unique = shards.counts("train")["tokens"]
    plan = B.plan_budget(family, shards, "500Mtok", model="tiny", recipe=MaskedLMRecipe(max_seq_length=32))
    assert plan.family == family and 31 < plan.epochs <= 32
    assert plan.max_steps == int(32 * unique / plan.tokens_per_step)
    assert any("more than 32 passes" in w for w in plan.warnings)


def test_bert_time_left_after_its_passes_buys_a_larger_shape(wordpiece_shards, monkeypatch):
    """Small text, long budget: 'tiny' would make all its passes early, so the plan takes 'mini' for the whole
    budget (step 5 of the planner); without that step the same budget stays 'tiny', capped, and warns."""
    shards = Shards.open(wordpiece_shards)
    unique = shards.counts("train")["tokens"]
    recipe = MaskedLMRecipe(max_seq_length=32)
    train = default_train_config("bert")
    cands = B.make_candidates("bert", shards, train, None, recipe=recipe)
    tiny, mini = cands[0], cands[1]
    # the test corpus is small: a pass cap at which the capped 'tiny' sees 40 tokens per body parameter (so
    # 'mini' is probed), and a throughput at which 15 minutes buy 'tiny' three times the cap's passes: its
    # passes would take a third of the time, and 'mini' (k / N tokens/s) gets fewer than the cap
    cap = 40 * tiny.body_params / unique
    monkeypatch.setattr(FAMILIES["bert"], "max_epochs", cap)
    probe_s = 2.0
    train_s = (900 - 2 * probe_s) * (1 - P.RESERVE)
    k = 3 * cap * unique * P.eval_factor(train) * tiny.params / train_s
    assert S.FULL_VALUE_EPOCHS < 3 * cap * tiny.params / mini.params < cap
    probe = FakeProbe(k, probe_s)
    plan = B.plan_budget("bert", shards, "15m", search_shape=True, recipe=recipe, probe=probe)
    assert probe.calls == ["tiny", "mini"]
    steps = int(k / mini.params * train_s / (mini.tokens_per_step * P.eval_factor(train)))
    assert (plan.preset, plan.max_steps) == ("mini", steps)
    assert S.FULL_VALUE_EPOCHS < plan.epochs < cap
    assert plan.candidates[0]["steps"] == int(cap * unique / tiny.tokens_per_step)  # tiny: capped
    assert "passes in" in plan.candidates[0]["note"]
    assert any("would make all" in w and "'mini'" in w for w in plan.warnings)
    assert not any("prepare more text" in w for w in plan.warnings)
    assert "capped" not in plan.candidates[0] and "uncapped_steps" not in plan.candidates[0]
    # the same budget without step 5: step 3's winner, capped, with the warning to prepare more text
    monkeypatch.setattr(FAMILIES["bert"], "grows_when_capped", False)
    plan = B.plan_budget("bert", shards, "15m", search_shape=True, recipe=recipe, probe=FakeProbe(k, probe_s))
    assert plan.preset == "tiny" and plan.max_steps == int(cap * unique / tiny.tokens_per_step)
    assert any("prepare more text" in w for w in plan.warnings)
    # nor when the small shape's passes would take more than half the time (here: two thirds)
    monkeypatch.setattr(FAMILIES["bert"], "grows_when_capped", True)
    plan = B.plan_budget("bert", shards, "15m", search_shape=True, recipe=recipe, probe=FakeProbe(k / 2, probe_s))
    assert plan.preset == "tiny" and any("prepare more text" in w for w in plan.warnings)


def test_word2vec_budget_is_epochs(wordpiece_shards):
    shards = Shards.open(wordpiece_shards)
    unique = shards.counts("train")["tokens"]
    plan = B.plan_budget("word2vec", shards, f"{3 * unique + 5}tok")
    assert plan.model["epochs"] == 3 and plan.max_steps is None and plan.train == {}
    with pytest.raises(ConfigError, match="too small for even one epoch"):
        B.plan_budget("word2vec", shards, f"{unique - 1}tok")


def test_budget_too_small_for_one_step(bpe_shards):
    shards = Shards.open(bpe_shards)
    with pytest.raises(ConfigError, match="too small for even one step") as e:
        B.plan_budget("gpt", shards, "100tok", model="tiny", model_fields=SMALL)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="too small for even one step"):  # 1 s at 1 token/s
        B.plan_budget("gpt", shards, "1s", model="tiny", model_fields=SMALL,
                      probe=lambda *a: B.ProbeResult(1.0, 2, 0.01))


def test_body_parameters_leave_out_embeddings_and_an_untied_softmax(wordpiece_shards, bpe_shards):
    from lmforge.families.elmo import model as elmo
    from lmforge.families.gpt import model as gpt

    shards = Shards.open(wordpiece_shards)
    tok = shards.tokenizer()
    cfg = elmo.ElmoConfig(vocab_size=tok.vocab_size, **FAMILIES["elmo"].presets["tiny"])
    model, _ = P._module("elmo").pretraining_setup(cfg, shards, tok)
    total = sum(p.numel() for p in model.parameters())
    chars = model.token_encoder.char_embedding.weight.numel()
    softmax = model.softmax.weight.numel() + model.softmax.bias.numel()
    assert P.body_parameters(model, tok.vocab_size) == total - chars - softmax
    # GPT's output layer is the token embedding: left out once, with the positions
    shards = Shards.open(bpe_shards)
    tok = shards.tokenizer()
    cfg = gpt.GPTConfig(vocab_size=tok.vocab_size, n_positions=32, n_embd=32, n_layer=1, n_head=2)
    model, _ = P._module("gpt").pretraining_setup(cfg, shards, tok)
    assert model.lm_head.weight is model.wte.weight
    total = sum(p.numel() for p in model.parameters())
    emb = model.wte.weight.numel() + model.wpe.weight.numel()
    assert P.body_parameters(model, tok.vocab_size) == total - emb


def test_elmo_ladder_has_a_shape_between_tiny_and_small(wordpiece_shards, unlimited_data):
    # an hour's budget on a few million tokens must not fall back to 'tiny' (0.1M body parameters) for
    # want of a probed shape below 'small' (14M): the char-CNN presets are probed smallest first
    shards = Shards.open(wordpiece_shards)
    train = default_train_config("elmo")
    names = [c.name for c in B.make_candidates("elmo", shards, train)]
    assert names[:3] == ["tiny", "mini", "small"] and "small-word" not in names
    probe = FakeProbe(k=5e9)
    plan = B.plan_budget("elmo", shards, "60m", search_shape=True, probe=probe)
    assert probe.calls[:2] == ["tiny", "mini"]
    assert plan.candidates[1]["name"] == "mini" and plan.candidates[1]["tokens_per_s"] is not None
    # at this throughput 'tiny' gets hundreds of tokens per body parameter, 'mini' about ten: 'mini' wins
    assert plan.candidates[0]["tokens_per_param"] > 100 and plan.preset == "mini"


def test_a_plan_saved_before_body_parameters_still_replays(tmp_path):
    plan = json.loads((Path(__file__).parents[1] / "docs/plans/bert_en_tweets_60m.json").read_text())
    assert "body_params" not in plan
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    loaded = B.load_plan(tmp_path)
    assert loaded.body_params == 0 and loaded.max_steps == plan["max_steps"]
    assert "outside the embeddings" not in loaded.describe()


# -- the real probe -----------------------------------------------------------------------------------------
def test_real_probe_times_a_few_steps_without_touching_the_run_rng(bpe_shards):
    shards = Shards.open(bpe_shards)
    train = default_train_config("gpt", batch_size=2, device="cpu")
    cand = B.make_candidates("gpt", shards, train, "tiny", SMALL)[0]
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    res = B.measure_throughput("gpt", cand, train, shards, max_seconds=5.0)
    assert torch.equal(torch.rand(3), before)  # the probe forks the RNG: the run after it is unchanged
    assert res.tokens_per_s > 0 and P.PROBE_STEPS[0] <= res.steps <= P.PROBE_STEPS[1] and res.seconds > 0


# -- the CLI: plan, train the fixed steps, replay ---------------------------------------------------------------
def test_budget_run_and_plan_replay_give_the_same_weights(bpe_shards, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    sets = ["--set", "n_positions=32", "batch_size=4", "eval_batches=2", "--device", "cpu"]
    rc, out, err = run_cli(capsys, "pretrain", "gpt", "--data", str(bpe_shards), "--out", str(a),
                           "--config", "tiny", "--budget", "1500tok", *sets)
    assert rc == 0, err
    plan = json.loads((a / "plan.json").read_text())
    assert plan["preset"] == "tiny" and plan["max_steps"] == 1500 // 128 and plan["budget"] == "1500tok"
    assert "budget 1500tok (tokens) -> gpt 'tiny'" in out and f"after {plan['max_steps']} steps" in out
    train_cfg = json.loads((a / "train_config.json").read_text())
    assert train_cfg["max_steps"] == plan["max_steps"] and train_cfg["max_time"] is None

    rc, out, err = run_cli(capsys, "pretrain", "gpt", "--data", str(bpe_shards), "--out", str(b),
                           "--plan", str(a / "plan.json"))
    assert rc == 0, err
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)  # bit for bit
    assert json.loads((b / "plan.json").read_text()) == plan


def test_cli_errors_are_one_line(bpe_shards, tmp_path, capsys):
    data, out = str(bpe_shards), str(tmp_path / "m")
    base = ["pretrain", "gpt", "--data", data, "--out", out]
    rc, _, err = run_cli(capsys, *base, "--budget", "soon")
    one_line_error(rc, err, "bad budget", "15m", "20Mtok")
    assert not (tmp_path / "m").exists()  # refused before --out is touched
    rc, _, err = run_cli(capsys, *base, "--budget", "10tok", "--config", "tiny")
    one_line_error(rc, err, "too small for even one step")
    rc, _, err = run_cli(capsys, *base, "--budget", "15m", "--set", "max_steps=10")
    one_line_error(rc, err, "max_steps")
    rc, _, err = run_cli(capsys, *base, "--search-shape", "--config", "tiny", "--budget", "15m")
    one_line_error(rc, err, "--search-shape")
    rc, _, err = run_cli(capsys, *base, "--plan", str(tmp_path / "nope.json"))
    one_line_error(rc, err, "plan file not found")
    (tmp_path / "bad.json").write_text("{}")
    rc, _, err = run_cli(capsys, *base, "--plan", str(tmp_path / "bad.json"))
    one_line_error(rc, err, "not an lmforge budget plan")
    rc, _, err = run_cli(capsys, *base, "--plan", str(tmp_path / "bad.json"), "--config", "tiny")
    one_line_error(rc, err, "--plan replays")
    assert not (tmp_path / "m" / "model.safetensors").exists()


def test_a_folder_holding_a_model_is_refused_before_the_probe(bpe_shards, tmp_path, capsys, monkeypatch):
    out = tmp_path / "m"
    sets = ["--set", "n_positions=32", "batch_size=4", "eval_batches=2", "--device", "cpu"]
    base = ["pretrain", "gpt", "--data", str(bpe_shards), "--out", str(out), "--config", "tiny"]
    assert run_cli(capsys, *base, "--budget", "600tok", *sets)[0] == 0

    def no_probe(*a, **k):
        raise AssertionError("probed for a folder that cannot be written")

    monkeypatch.setattr(B, "measure_throughput", no_probe)
    rc, out_text, err = run_cli(capsys, *base, "--budget", "15m", *sets)
    one_line_error(rc, err, "already holds")
    assert "budget 15m" not in out_text
