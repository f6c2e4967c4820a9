"""ELECTRA: the replaced-token labels, masking and replacement statistics, where gradients flow, HF interop both
ways (random tiny models, the transformers pipeline), and the CLI from pretraining to export."""

from __future__ import annotations

import json
import logging
import math
import os

import numpy as np
import pytest
import torch

from lmforge.cli import main
from lmforge.errors import CheckpointError, ConfigError
from lmforge.families.bert.data import MaskedLMRecipe
from lmforge.families.electra.model import ElectraConfig, ElectraForPreTraining, sample_tokens
from lmforge.families.electra.presets import PRESETS

os.environ.setdefault("HF_HUB_OFFLINE", "1")

V = 99
CLS, SEP, MASK = 2, 3, 4
SNAKE = "the python is a large snake that swallows its prey ."
LANG = "python is a programming language that reads well ."


def tiny(**kw) -> ElectraConfig:
    base = dict(vocab_size=V, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, generator_size_divisor=2, max_position_embeddings=64,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ElectraConfig(**{**base, **kw})


def masked_batch(B: int = 4, T: int = 20, seed: int = 0):
    """(masked input, labels, original): [CLS] ... [SEP] rows with about 30 % of the inside positions masked."""
    g = torch.Generator().manual_seed(seed)
    original = torch.randint(5, V, (B, T), generator=g)
    original[:, 0], original[:, -1] = CLS, SEP
    pick = torch.rand(B, T, generator=g) < 0.3
    pick[:, 0] = pick[:, -1] = False
    pick[:, 1] = True
    labels = original.masked_fill(~pick, -100)
    return original.masked_fill(pick, MASK), labels, original


# -- config ---------------------------------------------------------------------------------------------------
def test_presets_and_generator_shape():
    small = ElectraConfig(**PRESETS["small"])
    assert (small.hidden_size, small.num_hidden_layers, small.num_attention_heads, small.intermediate_size,
            small.embedding_size) == (256, 12, 4, 1024, 128)
    assert small.generator_shape == (64, 1, 256)  # the paper's Small: 1/4
    base = ElectraConfig(**PRESETS["base"])
    assert (base.hidden_size, base.num_attention_heads, base.intermediate_size) == (768, 12, 3072)
    assert base.generator_shape == (256, 4, 1024)  # 1/3: google/electra-base-generator's shape
    assert ElectraConfig().discriminator_weight == 50.0 and MaskedLMRecipe().masked_lm_prob == 0.15
    with pytest.raises(ConfigError, match="generator_size_divisor"):
        tiny(generator_size_divisor=0)
    with pytest.raises(ConfigError, match="divisible by its 2 heads"):
        tiny(hidden_size=129 * 4, num_attention_heads=4, generator_size_divisor=4)  # width 129, 2 heads


# -- the labels: exactly "sampled != original" ----------------------------------------------------------------
def test_sample_tokens_draws_the_softmax():
    logits = torch.tensor([[2.0, 0.0, -1.0, 1.0, -30.0]])
    p = torch.softmax(logits, -1)[0]
    n = 20000
    u = torch.from_numpy(np.random.default_rng(0).random(n).astype(np.float32))
    counts = torch.bincount(sample_tokens(logits.expand(n, -1), u), minlength=5).double()
    assert counts[4] == 0  # a token with (almost) no mass is (almost) never drawn
    assert ((counts / n - p).abs() <= 4 * torch.sqrt(p * (1 - p) / n) + 1e-12).all(), (counts / n, p)
    torch.manual_seed(0)
    free = torch.bincount(sample_tokens(logits.expand(n, -1)), minlength=5).double()  # multinomial path
    assert ((free / n - p).abs() <= 4 * torch.sqrt(p * (1 - p) / n) + 1e-12).all()
    # the noise decides: u just below a token's cumulative probability picks that token
    cdf = p.cumsum(0)
    assert sample_tokens(logits, (cdf[2:3] - 1e-4).float()).item() == 2


def test_replaced_labels_are_exactly_sampled_differs_from_original():
    torch.manual_seed(0)
    model = ElectraForPreTraining(tiny()).eval()
    inputs, labels, original = masked_batch()
    sel = labels != -100
    with torch.no_grad():
        probs = model(inputs, labels=labels, sample_noise=torch.zeros(inputs.shape)).generator_logits.softmax(-1)
    cdf = probs.double().cumsum(-1)  # (N, V)
    lo = torch.cat([torch.zeros(len(cdf), 1, dtype=cdf.dtype), cdf[:, :-1]], 1)
    target = labels[sel]
    # every other masked position is forced to sample its original token, the rest the likeliest other token
    force = torch.arange(len(target)) % 2 == 0
    other = probs.scatter(1, target[:, None], -1.0).argmax(-1)
    want = torch.where(force, target, other)
    noise = torch.zeros(inputs.shape)
    noise[sel] = ((lo.gather(1, want[:, None]) + cdf.gather(1, want[:, None])) / 2).squeeze(1).float()
    with torch.no_grad():
        out = model(inputs, labels=labels, sample_noise=noise)
    assert torch.equal(out.discriminator_input[sel], want)  # the samples the noise asked for
    assert torch.equal(out.discriminator_input[~sel], original[~sel])  # the rest is the original text
    assert torch.equal(out.replaced, out.discriminator_input != original)
    assert not out.replaced[sel][force].any() and out.replaced[sel][~force].all()  # masked but sampled = original
    assert not out.replaced[~sel].any()
    assert out.metrics["replaced"].item() == pytest.approx((~force).sum().item() / sel.numel())


# -- masking and replacement over many samples ------------------------------------------------------------------
def _binomial_ok(hits: float, n: int, p: float, sds: float = 4.0) -> bool:
    return abs(hits / n - p) <= sds * math.sqrt(p * (1 - p) / n)


def test_masking_and_replacement_statistics(wordpiece_shards, wordpiece_tokenizer):
    from lmforge.data.shards import Shards
    from lmforge.families.electra.pretraining import setup_electra

    shards = Shards.open(wordpiece_shards)
    cfg = tiny(vocab_size=7)
    torch.manual_seed(0)
    recipe = MaskedLMRecipe(max_seq_length=64, short_seq_prob=0.0, pack_documents=True)
    model, sampler = setup_electra(cfg, shards, wordpiece_tokenizer, recipe)
    model.eval()
    tok = wordpiece_tokenizer
    masked = maskable = kept = 0
    equal = expected_equal = var_equal = 0.0
    for b in range(10):
        batch = sampler.batch([np.random.default_rng([7, b, j]) for j in range(40)], "train")
        ids, labels, real = batch["input_ids"], batch["labels"], batch["attention_mask"].bool()
        sel = labels != -100
        original = torch.where(sel, labels, ids)
        special = (original == tok.cls_id) | (original == tok.sep_id) | (original == tok.pad_id)
        assert not (sel & (special | ~real)).any()  # only real, non-special positions are masked
        # at a masked position the generator sees [MASK] or the original token, never a random one
        assert ((ids[sel] == tok.mask_id) | (ids[sel] == labels[sel])).all()
        masked += int(sel.sum())
        maskable += int((real & ~special).sum())
        kept += int((ids[sel] == labels[sel]).sum())
        with torch.no_grad():
            out = model(**batch)
        p_orig = out.generator_logits.softmax(-1).gather(1, labels[sel][:, None]).squeeze(1).double()
        same = out.discriminator_input[sel] == labels[sel]
        # replaced = masked minus those sampled equal to the original, exactly, and nothing else
        assert int(out.replaced.sum()) == int(sel.sum()) - int(same.sum())
        assert not out.replaced[~sel].any()
        equal += float(same.sum())
        expected_equal += float(p_orig.sum())
        var_equal += float((p_orig * (1 - p_orig)).sum())
    assert maskable > 10_000
    # 15 % of the tokens (an exact count per row, so tighter than the binomial bound it is held to)
    assert _binomial_ok(masked, maskable, 0.15), masked / maskable
    assert _binomial_ok(masked - kept, masked, 0.85), (masked - kept) / masked  # [MASK] 85 %, kept 15 %
    # the generator's samples equal the original as often as its probabilities say
    assert abs(equal - expected_equal) <= 4 * math.sqrt(var_equal) + 1, (equal, expected_equal)


def test_whole_word_masking_picks_whole_words(wordpiece_shards, wordpiece_tokenizer):
    from lmforge.data.shards import Shards
    from lmforge.families.electra.data import ElectraPretrainingSampler

    tok = wordpiece_tokenizer
    sampler = ElectraPretrainingSampler(Shards.open(wordpiece_shards), max_seq_length=64, whole_word_mask=True,
                                        tokenizer=tok)
    batch = sampler.batch([np.random.default_rng([3, j]) for j in range(64)], "train")
    sel = batch["labels"] != -100
    original = torch.where(sel, batch["labels"], batch["input_ids"])
    cont = torch.tensor([tok.id_to_token(int(i)).startswith("##") for i in original.flatten()]).view(original.shape)
    assert (sel[:, 1:] & cont[:, 1:]).any()  # some masked words have several pieces
    # a "##" piece is masked exactly when the piece before it is (a row cut inside a word starts its first
    # word at the piece after [CLS]): words are masked whole
    prev = original[:, :-1]
    both = cont[:, 1:] & (prev != tok.cls_id) & (prev != tok.sep_id) & (prev != tok.pad_id)
    assert both.any() and torch.equal(sel[:, 1:][both], sel[:, :-1][both])


# -- gradients ----------------------------------------------------------------------------------------------------
def test_discriminator_loss_reaches_the_generator_only_through_the_shared_embeddings():
    torch.manual_seed(0)
    model = ElectraForPreTraining(tiny(hidden_dropout_prob=0.1)).train()
    inputs, labels, _ = masked_batch()
    out = model(inputs, labels=labels, sample_noise=torch.rand(inputs.shape))
    (model.config.discriminator_weight * out.discriminator_loss).backward()
    params = dict(model.named_parameters())
    generator_only = [n for n in params if n.startswith("generator.")]
    assert generator_only and all(params[n].grad is None or not params[n].grad.any() for n in generator_only)
    shared = params["electra.embeddings.word_embeddings.weight"]  # also the generator's input and output matrix
    assert shared.grad is not None and shared.grad.abs().sum() > 0
    assert params["electra.encoder.layer.0.attn.qkv.weight"].grad.abs().sum() > 0
    assert params["discriminator_predictions.dense_prediction.weight"].grad.abs().sum() > 0
    # and the generator's own loss trains the generator, never the discriminator's encoder or head
    model.zero_grad(set_to_none=True)
    out = model(inputs, labels=labels, sample_noise=torch.rand(inputs.shape))
    out.generator_loss.backward()
    assert all(params[n].grad is not None for n in generator_only)
    assert all(p.grad is None for n, p in params.items() if n.startswith(("electra.encoder.", "discriminator_")))
    assert out.loss.item() == pytest.approx(out.generator_loss.item() + 50.0 * out.discriminator_loss.item())


def test_loss_at_init_and_one_batch_overfits():
    torch.manual_seed(0)
    model = ElectraForPreTraining(tiny())
    inputs, labels, _ = masked_batch()
    noise = torch.rand(inputs.shape)
    first = model(inputs, labels=labels, sample_noise=noise)
    assert abs(first.metrics["mlm_loss"].item() - math.log(V)) < 0.3
    # the detector starts at its configured log-odds: its loss is the cross-entropy of that prior on the batch
    share = first.metrics["replaced"].item()
    p = 1 / (1 + math.exp(-model.config.discriminator_bias_init))  # the starting probability of "replaced"
    prior = -(share * math.log(p) + (1 - share) * math.log(1 - p))
    assert abs(first.metrics["rtd_loss"].item() - prior) < 0.1
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(100):
        opt.zero_grad()
        out = model(inputs, labels=labels, sample_noise=noise)
        out.loss.backward()
        opt.step()
    # the generator (1/2 as wide, its embeddings pulled by λ = 50 as well) learns slower than the discriminator
    assert out.metrics["mlm_loss"].item() < 0.6 * first.metrics["mlm_loss"].item()
    assert out.metrics["rtd_loss"].item() < 0.6 * first.metrics["rtd_loss"].item()


def test_joint_training_steps_match_transformers():
    """Five AdamW steps of L_MLM + 50 L_RTD on lmforge's model and on HF's ElectraForPreTraining and
    ElectraForMaskedLM (shared embeddings, tied output layer) from the same weights, batches and sampling noise:
    the same losses and the same weights after, so the joint objective's gradients are HF's."""
    import transformers

    from lmforge.families.electra.hf import hf_config_dicts, to_hf_state_dicts

    torch.manual_seed(2)
    ours = ElectraForPreTraining(tiny()).train()
    configs, states = hf_config_dicts(ours.config), to_hf_state_dicts(ours)
    disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(**configs["discriminator"])).train()
    gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(**configs["generator"])).train()
    disc.load_state_dict(states["discriminator"])
    gen.load_state_dict(states["generator"], strict=False)  # its output layer is the embedding matrix
    gen.electra.embeddings = disc.electra.embeddings
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
    theirs = list({id(p): p for p in [*disc.parameters(), *gen.parameters()]}.values())
    assert sum(p.numel() for p in theirs) == ours.num_parameters()

    def hf_loss(inputs, labels, mask, noise):
        sel = labels != -100
        original = torch.where(sel, labels, inputs)
        gen_logits = gen(input_ids=inputs, attention_mask=mask).logits[sel]
        corrupted = original.masked_scatter(sel, sample_tokens(gen_logits, noise[sel]))
        scores = disc(input_ids=corrupted, attention_mask=mask).logits
        rtd = torch.nn.functional.binary_cross_entropy_with_logits(
            scores[mask.bool()], (corrupted != original)[mask.bool()].float())
        return torch.nn.functional.cross_entropy(gen_logits, labels[sel]) + 50.0 * rtd

    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-3)
    opt_theirs = torch.optim.AdamW(theirs, lr=1e-3)
    for step in range(5):
        inputs, labels, _ = masked_batch(seed=step)
        mask = torch.ones_like(inputs)
        mask[2, 15:] = 0
        noise = torch.rand(inputs.shape, generator=torch.Generator().manual_seed(100 + step))
        ours_loss = ours(inputs, mask, labels=labels, sample_noise=noise).loss
        their_loss = hf_loss(inputs, labels, mask, noise)
        assert abs(ours_loss.item() - their_loss.item()) < 1e-4 * their_loss.item()
        for opt, loss in ((opt_ours, ours_loss), (opt_theirs, their_loss)):
            opt.zero_grad()
            loss.backward()
            opt.step()
    after = to_hf_state_dicts(ours)["discriminator"]
    for name, p in disc.state_dict().items():
        assert torch.allclose(after[name], p, atol=1e-5), name

def test_save_load_and_transfer_layers(tmp_path):
    torch.manual_seed(0)
    model = ElectraForPreTraining(tiny()).eval()
    model.save_pretrained(tmp_path)
    back = ElectraForPreTraining.from_pretrained(tmp_path)
    inputs, _, _ = masked_batch()
    with torch.no_grad():
        assert torch.equal(model(inputs).logits, back(inputs).logits)
        assert torch.equal(model.generator_logits(inputs), back.generator_logits(inputs))
    bottom = model.transfer_layers()[0]  # embeddings (width 16) and their projection to 32
    assert {id(p) for p in bottom.parameters()} >= {id(model.electra.embeddings_project.weight)}
    assert all(h.shape[-1] == 32 for h in model.hidden_states(inputs))


# -- HF interop ----------------------------------------------------------------------------------------------------
def _hf_pair(seed: int = 0):
    """A random tiny HF discriminator and generator that share their embeddings, as ELECTRA trains them."""
    import transformers

    torch.manual_seed(seed)
    kw = dict(vocab_size=V, embedding_size=16, num_hidden_layers=2, max_position_embeddings=64)
    disc = transformers.ElectraForPreTraining._from_config(
        transformers.ElectraConfig(hidden_size=32, num_attention_heads=4, intermediate_size=37, **kw),
        attn_implementation="eager").eval()
    gen = transformers.ElectraForMaskedLM._from_config(
        transformers.ElectraConfig(hidden_size=16, num_attention_heads=1, intermediate_size=64, **kw),
        attn_implementation="eager").eval()
    with torch.no_grad():
        for p in [*disc.parameters(), *gen.parameters()]:
            p.add_(torch.randn_like(p) * 0.05)  # every parameter (biases, LayerNorms) distinct
    gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
    gen.tie_weights()
    return disc, gen


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (3, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    seg = torch.zeros_like(ids)
    seg[:, 6:] = 1
    return ids, mask, seg


def _close(a, b, mask) -> bool:
    return (a - b)[mask.bool()].abs().max().item() < 1e-5


def test_import_random_hf_pair(tmp_path):
    from lmforge.families.electra.hf import import_hf

    disc, gen = _hf_pair()
    disc.save_pretrained(tmp_path)
    gen.save_pretrained(tmp_path / "generator")
    model = import_hf(tmp_path)
    assert model.config.generator_size_divisor == 2 and model.config.intermediate_size == 37
    ids, mask, seg = _inputs()
    with torch.no_grad():
        assert _close(disc(input_ids=ids, attention_mask=mask, token_type_ids=seg).logits, model(ids, mask, seg).logits,
                      mask)
        assert _close(gen(input_ids=ids, attention_mask=mask, token_type_ids=seg).logits,
                      model.generator_logits(ids, mask, seg), mask)
        ref = disc.electra(input_ids=ids, attention_mask=mask, token_type_ids=seg, output_hidden_states=True)
        ours = model.hidden_states(ids, mask, seg)
    assert len(ours) == len(ref.hidden_states) == 3
    assert all(_close(r, o, mask) for r, o in zip(ref.hidden_states, ours))


def test_import_discriminator_alone_and_refusals(tmp_path, caplog):
    from lmforge.families.electra.hf import import_hf

    disc, gen = _hf_pair()
    disc.save_pretrained(tmp_path / "disc")
    with caplog.at_level(logging.WARNING, logger="lmforge"):
        model = import_hf(tmp_path / "disc")
    assert "the generator" in caplog.text and "freshly initialised" in caplog.text
    ids, mask, seg = _inputs()
    with torch.no_grad():
        assert _close(disc(input_ids=ids, attention_mask=mask, token_type_ids=seg).logits, model(ids, mask, seg).logits,
                      mask)
    gen.save_pretrained(tmp_path / "gen")
    with pytest.raises(CheckpointError, match="generator"):
        import_hf(tmp_path / "gen")
    (tmp_path / "disc" / "generator").mkdir()
    cfg = json.loads((tmp_path / "gen" / "config.json").read_text())
    (tmp_path / "disc" / "generator" / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 50}))
    with pytest.raises(CheckpointError, match="not 1/d of the discriminator"):
        import_hf(tmp_path / "disc")


def test_export_loads_in_transformers_and_back(tmp_path):
    import transformers

    from lmforge.families.electra.hf import export_hf, import_hf

    torch.manual_seed(1)
    model = ElectraForPreTraining(tiny()).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    export_hf(model, tmp_path)
    disc, info = transformers.ElectraForPreTraining.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    gen, info = transformers.ElectraForMaskedLM.from_pretrained(tmp_path, subfolder="generator",
                                                                output_loading_info=True)
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    assert set(info["missing_keys"]) <= {"generator_lm_head.weight"}  # tied to the embeddings
    ids, mask, seg = _inputs(3)
    with torch.no_grad():
        assert _close(disc.eval()(input_ids=ids, attention_mask=mask, token_type_ids=seg).logits,
                      model(ids, mask, seg).logits, mask)
        assert _close(gen.eval()(input_ids=ids, attention_mask=mask, token_type_ids=seg).logits,
                      model.generator_logits(ids, mask, seg), mask)
    back = import_hf(tmp_path)  # the architecture comes back
    assert back.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))


# -- the CLI, as a user runs it --------------------------------------------------------------------------------
SETS = ["max_seq_length=32", "max_position_embeddings=64", "batch_size=2", "eval_batches=2", "warmup_steps=1",
        "log_every=1", "eval_every=2", "save_every=2"]


@pytest.fixture(scope="module")
def electra_dir(tmp_path_factory, wordpiece_shards):
    out = tmp_path_factory.mktemp("electra") / "model"
    # a module fixture runs before the autouse one that makes "auto" fp32 in tests: say fp32 here
    assert main(["-q", "pretrain", "electra", "--data", str(wordpiece_shards), "--out", str(out), "--config", "tiny",
                 "--precision", "fp32", "--set", "max_steps=4", *SETS]) == 0
    return out


def _train_losses(folder) -> list[float]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in lines if json.loads(x)["split"] == "train"]


def test_cli_pretrain_resume_and_evaluate_lm(electra_dir, wordpiece_shards, tmp_path, capsys):
    import lmforge
    from lmforge.train.pretrain import evaluate_lm

    model = lmforge.load(electra_dir)
    assert model.model_type == "electra" and model.tokenizer is not None
    assert model.config.generator_shape == (32, 1, 128)  # tiny: 128 wide, generator 1/4
    val = [json.loads(x) for x in (electra_dir / "metrics.jsonl").read_text().splitlines()]
    last = [e for e in val if e["split"] == "val"][-1]
    assert {"mlm_loss", "mlm_acc", "rtd_loss", "rtd_acc", "replaced", "token_cos", "rtd_auc"} <= set(last["metrics"])
    assert 0.0 <= last["metrics"]["rtd_auc"] <= 1.0 and -1.0 <= last["metrics"]["token_cos"] <= 1.0
    card = (electra_dir / "README.md").read_text()  # the diagnostics, with how to read them
    assert "## Pretraining diagnostics" in card and "coin toss" in card
    for key in ("token_cos", "rtd_auc"):
        assert f"| `{key}` | {last['metrics'][key]:.3f} |" in card
    # the samples come from the rows' own generators: a resumed run repeats the uninterrupted one (in bf16) ...
    def pretrain(out, *argv):
        return main(["-q", "pretrain", "electra", "--data", str(wordpiece_shards), "--out", str(out),
                     "--precision", "bf16", *argv])

    half, full = tmp_path / "half", tmp_path / "full"
    assert pretrain(half, "--config", "tiny", "--set", *SETS, "max_steps=2", "decay_steps=4") == 0
    assert pretrain(half, "--resume", "--set", "max_steps=4") == 0
    assert pretrain(full, "--config", "tiny", "--set", *SETS, "max_steps=4", "decay_steps=4") == 0
    assert len(_train_losses(full)) == 4 and _train_losses(half) == _train_losses(full)
    # ... and evaluate lm gives the run's last validation (the same rows, masks and samples)
    again = evaluate_lm(electra_dir, wordpiece_shards, batches=2, batch_size=2)
    assert all(abs(again[k] - v) <= 1e-5 * max(1.0, abs(v)) for k, v in last["metrics"].items()), (again, last)
    capsys.readouterr()


def test_cli_embed_features_fill_mask_export(electra_dir, tmp_path, capsys):
    assert main(["embed", str(electra_dir), SNAKE, LANG, "--word", "python"]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.startswith("model (electra)")]
    assert [r[2] for r in rows] == ["emb", "layer1", "layer2"]  # one cosine per layer of the discriminator
    assert all(-1 <= float(r[3]) <= 1 for r in rows)
    import lmforge

    (snake,) = lmforge.load(electra_dir).embed([SNAKE])
    assert snake.layers.shape == (3, len(snake.tokens), 128) and snake.layer_names[0] == "emb"

    lines = ["text,label"] + [f"{'good fine great' if i % 2 else 'bad awful poor'} day {i},{i % 2}" for i in range(16)]
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "test.csv").write_text("\n".join(lines[:9]) + "\n")
    run = tmp_path / "run"
    assert main(["finetune", str(electra_dir), "--task", "classify", "--train", str(tmp_path / "train.csv"),
                 "--test", str(tmp_path / "test.csv"), "--out", str(run), "--mode", "features", "--max-len", "16",
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["family"] == "electra"
    capsys.readouterr()
    assert main(["finetune", str(electra_dir), "--task", "classify", "--train", str(tmp_path / "train.csv"),
                 "--test", str(tmp_path / "test.csv"), "--out", str(tmp_path / "run-pooler"), "--pool", "pooler"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the electra model has none" in err[0] and not (tmp_path / "run-pooler").exists()
    assert json.loads((run / "metrics.json").read_text())  # scored on the test file
    capsys.readouterr()

    assert main(["fill-mask", str(electra_dir), "the python is a large [MASK] .", "--top-k", "3"]) == 0
    probs = [float(line.split()[-1]) for line in capsys.readouterr().out.strip().splitlines()]
    assert len(probs) == 3 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0001

    hf = tmp_path / "hf"
    assert main(["export-hf", str(electra_dir), "--out", str(hf)]) == 0
    assert (hf / "config.json").is_file() and (hf / "generator" / "config.json").is_file()
    assert "ElectraForPreTraining" in (hf / "README.md").read_text()
    assert main(["export-hf", str(electra_dir), "--out", str(hf)]) == 2  # an earlier export is refused...
    assert main(["export-hf", str(electra_dir), "--out", str(hf), "--overwrite"]) == 0  # ...replaced, generator/ too
    assert main(["import-hf", str(hf), "--out", str(tmp_path / "back")]) == 0
    a, b = lmforge.load(electra_dir), lmforge.load(tmp_path / "back")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert b.tokenizer.hash == a.tokenizer.hash


def test_transformers_pipeline_on_the_export(electra_dir, tmp_path):
    """The exported generator fills masks in transformers' pipeline as lmforge does; ElectraModel's hidden states
    on the exported discriminator are lmforge's."""
    import transformers

    import lmforge
    from lmforge.interop import export_hf

    export_hf(electra_dir, tmp_path / "hf")
    model = lmforge.load(electra_dir)
    text = "the python is a large [MASK] ."
    ours = model.fill_mask(text, top_k=5)[0]
    pipe = transformers.pipeline("fill-mask", model=str(tmp_path / "hf" / "generator"), device="cpu", top_k=5)
    theirs = pipe(text)
    assert [model.tokenizer.id_to_token(t["token"]) for t in theirs] == [tok for tok, _ in ours]
    assert max(abs(t["score"] - p) for t, (_, p) in zip(theirs, ours)) < 1e-5

    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    enc = hf_tok([SNAKE, LANG], padding=True, return_tensors="pt")
    body = transformers.ElectraModel.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        ref = body(**enc, output_hidden_states=True).hidden_states
        mine = model.hidden_states(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    assert len(ref) == len(mine) == 3
    assert all(_close(r, o, enc["attention_mask"]) for r, o in zip(ref, mine))


def test_serve_fills_masks_with_the_generator_and_embeds_with_the_discriminator(electra_dir):
    from fastapi.testclient import TestClient

    import lmforge
    from lmforge.serve.app import create_app

    model = lmforge.load(electra_dir)
    with TestClient(create_app([electra_dir])) as client:
        (entry,) = client.get("/v1/models").json()["data"]
        assert entry["family"] == "electra" and set(entry["supports"]) == {"embed", "fill-mask", "curves"}
        text = "the python is a large [MASK] ."
        got = client.post("/v1/fill-mask", json={"model": entry["id"], "text": text, "top_k": 3}).json()["masks"]
        assert [[(c["token"], c["prob"]) for c in m] for m in got] == [
            [(t, float(p)) for t, p in m] for m in model.fill_mask(text, top_k=3)]
        r = client.post("/v1/embed", json={"model": entry["id"], "texts": [SNAKE]}).json()
        (want,) = model.embed([SNAKE])
        assert r["results"][0]["tokens"] == want.tokens
        np.testing.assert_allclose(np.array(r["results"][0]["vectors"]), want.layers.numpy(), atol=1e-5)


def test_discriminator_bias_init_sets_the_starting_log_odds_and_nothing_else():
    kw = dict(vocab_size=V, embedding_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    plain = ElectraForPreTraining(ElectraConfig(**kw, discriminator_bias_init=0.0)).state_dict()  # the paper's
    torch.manual_seed(0)
    biased = ElectraForPreTraining(ElectraConfig(**kw)).state_dict()  # the default: the prior's log-odds
    key = "discriminator_predictions.dense_prediction.bias"
    assert plain[key].item() == 0.0 and biased[key].item() == -2.0
    assert all(torch.equal(plain[k], biased[k]) for k in plain if k != key)  # no other weight, no extra draw
    with pytest.raises(ConfigError, match="discriminator_bias_init"):
        ElectraConfig(**kw, discriminator_bias_init=float("nan"))
