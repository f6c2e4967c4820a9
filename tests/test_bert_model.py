"""BERT model: shapes, loss at init, overfitting, save/load, pre-LN, padding, the helpers."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from lmforge.config import from_dict
from lmforge.errors import ConfigError, DataError
from lmforge.families.bert.data import MaskedLMRecipe
from lmforge.families.bert.model import BertConfig, BertForPreTraining
from lmforge.families.bert.presets import DEFAULT_PRESET, PRESETS
from lmforge.families.bert.pretraining import setup_bert

V = 101


def tiny_config(**kw) -> BertConfig:
    base = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                max_position_embeddings=64)
    base.update(kw)
    return BertConfig(**base)


def make_batch(B: int = 4, T: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    ids[:, 0] = 2  # [CLS]
    labels = torch.full((B, T), -100)
    pick = torch.rand(B, T, generator=g) < 0.3
    pick[:, 0] = False
    pick[:, 1] = True  # at least one per row
    labels[pick] = ids[pick]
    inputs = ids.clone()
    inputs[pick] = 4  # [MASK]
    seg = torch.zeros(B, T, dtype=torch.long)
    seg[:, T // 2 :] = 1
    nsp = torch.randint(0, 2, (B,), generator=g)
    return dict(input_ids=inputs, token_type_ids=seg, labels=labels, next_sentence_label=nsp)


def test_config_checks_and_presets():
    with pytest.raises(ConfigError, match="divisible"):
        tiny_config(hidden_size=30)
    with pytest.raises(ConfigError, match="hidden_act"):
        tiny_config(hidden_act="swish")
    with pytest.raises(ConfigError, match="unknown config key"):
        from_dict(BertConfig, {"hidden_sise": 3})
    with pytest.raises(ConfigError, match="masked_lm_prob"):
        MaskedLMRecipe(masked_lm_prob=1.0)
    with pytest.raises(ConfigError, match="max_seq_length"):
        MaskedLMRecipe(max_seq_length=128).seq_length(64)
    assert MaskedLMRecipe().seq_length(64) == 64 and MaskedLMRecipe().seq_length(512) == 128


def test_the_data_recipe_is_read_from_train_config_and_is_no_model_key(tmp_path):
    """The masking recipe is saved in train_config.json's ``data``; in config.json it is an unknown model key (the
    ordinary error, as for any other), and a folder without a saved recipe trains with the defaults."""
    from lmforge.train.pretrain import saved_recipe

    recipe = {"max_seq_length": 32, "masked_lm_prob": 0.2, "pack_documents": True, "whole_word_mask": True,
              "short_seq_prob": 0.0, "max_predictions_per_seq": 5}
    config = {"model_type": "bert", **dataclasses.asdict(tiny_config())}
    (tmp_path / "config.json").write_text(json.dumps({**config, **recipe}))
    assert from_dict(BertConfig, config, ignore=("model_type",)) == tiny_config()
    with pytest.raises(ConfigError, match="unknown config key 'max_seq_length' for BertConfig"):
        from_dict(BertConfig, {**config, **recipe}, ignore=("model_type",))
    assert saved_recipe("bert", tmp_path) == MaskedLMRecipe()  # config.json's keys are not the recipe
    (tmp_path / "train_config.json").write_text(json.dumps({"data": recipe}))
    assert saved_recipe("bert", tmp_path) == MaskedLMRecipe(32, 0.0, 0.2, 5, True, True)
    assert DEFAULT_PRESET in PRESETS
    sizes = {name: (p["num_hidden_layers"], p["hidden_size"]) for name, p in PRESETS.items()}
    assert sizes == {"tiny": (2, 128), "mini": (4, 256), "small": (4, 512), "medium": (8, 512), "base": (12, 768)}
    for p in PRESETS.values():
        cfg = BertConfig(**p)
        assert cfg.num_attention_heads == cfg.hidden_size // 64 and cfg.intermediate_size == 4 * cfg.hidden_size
    # parameter counts of Google's small BERTs (vocab 30522): 4.4M, 11.3M, 29.1M, 41.7M, 110.1M
    # (medium 41.7M and base 110.1M follow from the same rule; building them here would only cost time)
    google = {"tiny": 4.4e6, "mini": 11.3e6, "small": 29.1e6}
    for name, count in google.items():
        model = BertForPreTraining(BertConfig(**PRESETS[name]))
        assert abs(model.num_parameters() - count) < 0.05e6, name  # reported to 0.1M


def test_shapes_and_loss_at_init():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config()).eval()
    batch = make_batch()
    out = model(batch["input_ids"], token_type_ids=batch["token_type_ids"])
    assert out.logits.shape == (4, 16, V) and out.nsp_logits.shape == (4, 2) and out.loss is None
    out = model(**batch)
    n_masked = int((batch["labels"] != -100).sum())
    assert out.logits.shape == (n_masked, V)
    assert set(out.metrics) == {"mlm_loss", "mlm_acc", "nsp_loss", "nsp_acc", "token_cos"}  # eval: the diagnostic
    assert abs(out.metrics["mlm_loss"].item() - math.log(V)) < 0.1
    assert abs(out.metrics["nsp_loss"].item() - math.log(2)) < 0.1
    assert torch.allclose(out.loss, out.metrics["mlm_loss"] + out.metrics["nsp_loss"])
    # masked-position scoring gives exactly the full-sequence loss
    full = model(batch["input_ids"], token_type_ids=batch["token_type_ids"]).logits
    ref = torch.nn.functional.cross_entropy(full.reshape(-1, V), batch["labels"].reshape(-1), ignore_index=-100)
    assert torch.allclose(ref, out.metrics["mlm_loss"], atol=1e-6)
    states = model.hidden_states(batch["input_ids"])
    assert len(states) == 3 and all(s.shape == (4, 16, 32) for s in states)
    assert model.hidden_size == 32 and len(model.transfer_layers()) == 3


def _overfit(model, batch, steps=150):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        out = model(**batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    return out


@pytest.mark.parametrize("norm_first", [False, True])
def test_overfits_one_batch(norm_first):
    torch.manual_seed(0)
    cfg = tiny_config(norm_first=norm_first, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(cfg)
    if norm_first:
        assert model.bert.encoder.ln_f is not None and len(model.transfer_layers()) == 4
    out = _overfit(model, make_batch())
    assert out.metrics["mlm_acc"].item() == 1.0 and out.metrics["nsp_acc"].item() == 1.0
    assert out.loss.item() < 0.1


def test_mlm_only_ignores_nsp_label():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config(next_sentence=False))
    out = model(**make_batch())
    assert set(out.metrics) == {"mlm_loss", "mlm_acc"}
    assert out.loss.item() == pytest.approx(out.metrics["mlm_loss"].item())


def test_padding_does_not_change_real_positions():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config()).eval()
    batch = make_batch(B=2, T=10)
    ids, seg = batch["input_ids"], batch["token_type_ids"]
    padded = torch.cat([ids, torch.zeros(2, 6, dtype=torch.long)], dim=1)
    pseg = torch.cat([seg, torch.zeros(2, 6, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(2, 10), torch.zeros(2, 6)], dim=1).long()
    with torch.no_grad():
        a = model(ids, token_type_ids=seg)
        b = model(padded, attention_mask=mask, token_type_ids=pseg)
        c = model(padded, token_type_ids=pseg)  # without the mask the padding leaks in
    assert torch.allclose(a.logits, b.logits[:, :10], atol=1e-5)
    assert torch.allclose(a.nsp_logits, b.nsp_logits, atol=1e-5)
    assert not torch.allclose(a.logits, c.logits[:, :10], atol=1e-3)
    # rows of different lengths in one batch: the short row equals its unpadded self
    mixed = padded.clone()
    mixed[1, 10:] = torch.randint(5, V, (6,))
    mmask = mask.clone()
    mmask[1, 10:] = 1
    with torch.no_grad():
        d = model(mixed, attention_mask=mmask, token_type_ids=pseg)
    assert torch.allclose(d.logits[0, :10], a.logits[0], atol=1e-5)


def test_save_load_identical(tmp_path):
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config(norm_first=True)).eval()
    model.save_pretrained(tmp_path)
    again = BertForPreTraining.from_pretrained(tmp_path)
    batch = make_batch()
    with torch.no_grad():
        a, b = model(**batch), again(**batch)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.nsp_logits, b.nsp_logits)
    # the decoder is still tied to the embeddings after loading
    assert again.cls.predictions._decoder[0].weight is again.bert.embeddings.word_embeddings.weight
    assert again.config == model.config


class _CharTokenizer:
    """Tiny WordPiece-like tokenizer over single letters, for the helpers' tests."""

    kind = "wordpiece"

    def __init__(self):
        self.vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [chr(c) for c in range(97, 123)]
        self.vocab_size = len(self.vocab)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = range(5)
        self.special_ids = set(range(5))

    def encode(self, text):
        return [self.vocab.index(c) for c in text if c.isalpha()]

    def encode_with_offsets(self, text):
        spans = [(i, i + 1) for i, c in enumerate(text) if c.isalpha()]
        return [self.vocab.index(text[s]) for s, _ in spans], [text[s] for s, _ in spans], spans

    def id_to_token(self, i):
        return self.vocab[i]


def test_fill_mask_and_embed_after_training():
    torch.manual_seed(0)
    tok = _CharTokenizer()
    model = BertForPreTraining(tiny_config(vocab_size=tok.vocab_size, hidden_dropout_prob=0.0,
                                           attention_probs_dropout_prob=0.0))
    model.tokenizer = tok
    text = "abcdefgh"
    ids = torch.tensor([[2, *tok.encode(text), 3]])
    labels = torch.full_like(ids, -100)
    inputs = ids.clone()
    inputs[0, 4], labels[0, 4] = 4, ids[0, 4]  # teach it that "abc?efgh" -> d
    _overfit(model, dict(input_ids=inputs, labels=labels), steps=40)
    top = model.fill_mask("abc[MASK]efgh", top_k=3)
    assert len(top) == 1 and len(top[0]) == 3 and top[0][0][0] == "d"
    assert top[0][0][1] > 0.5 and top[0][0][1] >= top[0][1][1] >= top[0][2][1]
    assert len(model.fill_mask("[MASK]b[MASK]", top_k=2)) == 2
    with pytest.raises(DataError, match="MASK"):
        model.fill_mask("no mask here")
    assert model.training  # the helpers restore the mode they found
    embs = model.embed(["ab c", "xyz zy"])
    assert [e.tokens for e in embs] == [["a", "b", "c"], ["x", "y", "z", "z", "y"]]
    assert embs[0].offsets == [(0, 1), (1, 2), (3, 4)]
    assert embs[1].layers.shape == (3, 5, 32) and embs[0].layer_names == ["emb", "layer1", "layer2"]
    # batching with padding gives the same vectors as one text alone
    alone = model.embed(["ab c"])[0].layers
    assert torch.allclose(alone, embs[0].layers, atol=1e-5)


def test_pretraining_setup_requires_wordpiece():
    tok = _CharTokenizer()
    tok.kind = "bpe"
    with pytest.raises(DataError, match="WordPiece"):
        setup_bert(tiny_config(), shards=None, tokenizer=tok)


def test_pretraining_setup_takes_vocab_from_tokenizer(request):
    from lmforge.data.shards import Shards

    shards = Shards.open(request.getfixturevalue("wordpiece_shards"))
    tok = shards.tokenizer()
    cfg = dataclasses.replace(tiny_config(), vocab_size=7)
    model, sampler = setup_bert(cfg, shards, tok)
    assert model.config.vocab_size == tok.vocab_size and model.config.pad_token_id == tok.pad_id
    import numpy as np

    batch = sampler.batch([np.random.default_rng(i) for i in range(4)], "train")
    out = model(**batch)
    assert out.loss.isfinite() and abs(out.metrics["mlm_loss"].item() - math.log(tok.vocab_size)) < 0.3


def test_fill_mask_command(tmp_path, request, capsys):
    from lmforge.cli import main

    tok = request.getfixturevalue("wordpiece_tokenizer")
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config(vocab_size=tok.vocab_size))
    model.save_pretrained(tmp_path / "bert", tokenizer=tok)
    assert main(["fill-mask", str(tmp_path / "bert"), "the [MASK] is a snake .", "--top-k", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3
    probs = [float(line.split()[-1]) for line in lines]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0001
    assert main(["fill-mask", str(tmp_path / "bert"), "no mask here"]) == 2
    assert "[MASK]" in capsys.readouterr().err


def test_packed_documents_see_only_themselves():
    """A packed row with document_ids gives each document the states it would have in a row of its own."""
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config(next_sentence=False)).eval()
    CLS, SEP = 2, 3
    g = torch.Generator().manual_seed(1)
    a1, a2 = torch.randint(5, V, (7,), generator=g), torch.randint(5, V, (11,), generator=g)
    b = torch.randint(5, V, (9,), generator=g)

    def packed(a):
        ids = torch.cat([torch.tensor([CLS]), a, torch.tensor([SEP]), b, torch.tensor([SEP])])
        docs = torch.tensor([1] * (len(a) + 2) + [2] * (len(b) + 1))
        with torch.no_grad():
            return model.bert(ids[None], document_ids=docs[None])[0]

    one, two = packed(a1), packed(a2)
    # the second document does not see the first, whatever its length: positions restart at 1
    torch.testing.assert_close(one[len(a1) + 2 :], two[len(a2) + 2 :], rtol=0, atol=1e-5)
    # the first document equals the same tokens alone, padded in a batch with a longer row
    alone = torch.cat([torch.tensor([CLS]), a1, torch.tensor([SEP])])
    batch = torch.zeros(2, 20, dtype=torch.long)
    batch[0, : len(alone)], batch[1] = alone, torch.randint(5, V, (20,), generator=g)
    mask = torch.zeros(2, 20, dtype=torch.long)
    mask[0, : len(alone)], mask[1] = 1, 1
    with torch.no_grad():
        ref = model.bert(batch, mask)[0, : len(alone)]
    torch.testing.assert_close(one[: len(alone)], ref, rtol=0, atol=1e-5)
    # and the packed second document equals that document alone at positions 1.. (no [CLS] before it)
    with torch.no_grad():
        x = model.bert.embeddings(torch.cat([b, torch.tensor([SEP])])[None],
                                  position_ids=torch.arange(1, len(b) + 2)[None])
        solo = model.bert.encoder(x, None)[0]
    torch.testing.assert_close(one[len(a1) + 2 :], solo, rtol=0, atol=1e-5)
