"""lmforge GPT <-> HF GPT2LMHeadModel: both directions, same logits and same greedy tokens, offline."""

from __future__ import annotations

import pytest
import torch
import transformers

from lmforge.errors import CheckpointError  # noqa: E402
from lmforge.families.gpt.hf import export_hf, import_hf  # noqa: E402
from lmforge.families.gpt.model import GPTConfig, GPTLMHeadModel  # noqa: E402


def random_hf(vocab: int = 99, n_positions: int = 64):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=vocab,
        n_positions=n_positions,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
        attn_implementation="sdpa",
    )
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # make LayerNorms and biases non-trivial so a wrong map cannot pass
        for name, p in model.named_parameters():
            if "ln" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def test_import_hf_same_logits(tmp_path):
    hf = random_hf()
    hf.save_pretrained(tmp_path / "hf")
    ours = import_hf(tmp_path / "hf")
    assert ours.config.norm_first and ours.config.eos_token_id == 98
    ids = torch.randint(0, 99, (3, 17))
    with torch.no_grad():
        diff = (ours(ids).logits - hf(ids).logits).abs().max().item()
    assert diff < 1e-5, diff


def test_import_hf_drops_out_of_vocab_ids_and_refuses_bin(tmp_path):
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=1, n_head=4, n_positions=32)
    )
    hf.save_pretrained(tmp_path / "hf")
    ours = import_hf(tmp_path / "hf")  # default bos/eos 50256 do not fit a 99-token vocabulary
    assert ours.config.eos_token_id is None
    (tmp_path / "hf" / "model.safetensors").rename(tmp_path / "hf" / "other.safetensors")
    with pytest.raises(CheckpointError, match="safetensors"):
        import_hf(tmp_path / "hf")


def test_export_hf_same_logits_and_greedy_tokens(tmp_path):
    torch.manual_seed(1)
    ours = GPTLMHeadModel(
        GPTConfig(vocab_size=99, n_positions=64, n_embd=32, n_layer=2, n_head=4, eos_token_id=98)
    ).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "ln" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
        ours.wte.weight.mul_(5)  # a sharper model: greedy choices far from ties
    export_hf(ours, tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, 98, (2, 9))
    with torch.no_grad():
        diff = (ours(ids).logits - hf(ids).logits).abs().max().item()
    assert diff < 1e-5, diff
    prompt = ids[:1]
    mine = ours.generate(prompt, 30, eos_token_id=None)
    theirs = hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=30,
        min_new_tokens=30,
        do_sample=False,
        pad_token_id=98,
    )
    assert torch.equal(mine, theirs)
    # and back again
    again = import_hf(tmp_path / "hf")
    assert torch.equal(again(ids).logits, ours(ids).logits)


def test_post_ln_export_is_refused(tmp_path):
    model = GPTLMHeadModel(GPTConfig(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2, norm_first=False))
    with pytest.raises(CheckpointError, match="post-LN"):
        export_hf(model, tmp_path / "hf")


def test_export_with_tokenizer_loads_in_autotokenizer(tmp_path, bpe_tokenizer):
    torch.manual_seed(2)
    cfg = GPTConfig(
        vocab_size=bpe_tokenizer.vocab_size,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        eos_token_id=bpe_tokenizer.eot_id,
        bos_token_id=bpe_tokenizer.eot_id,
    )
    ours = GPTLMHeadModel(cfg).eval()
    ours.save_pretrained(tmp_path / "m", tokenizer=bpe_tokenizer)
    from lmforge.cli import main

    assert main(["export-hf", str(tmp_path / "m"), "--out", str(tmp_path / "hf")]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    text = "The python is a large snake; Python is a language."
    ids = bpe_tokenizer.encode(text)
    assert tok(text)["input_ids"] == ids
    x = torch.tensor([ids])
    with torch.no_grad():
        assert (hf(x).logits - ours(x).logits).abs().max().item() < 1e-5
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    from lmforge import load

    back = load(tmp_path / "back")
    assert back.tokenizer is not None and back.tokenizer.encode(text) == ids
    assert torch.equal(back(x).logits, ours(x).logits)
