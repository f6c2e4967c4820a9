"""BERT with labels runs its top layer on [CLS] and the masked positions alone: the same loss, logits and gradients
as the full top layer, with padding, packed documents, pre-LN and post-LN."""

from __future__ import annotations

import pytest
import torch

from lmforge.families.bert import model as bert_module
from lmforge.families.bert.model import BertConfig, BertForPreTraining
from lmforge.nn.transformer import TransformerBlock

V = 101


def _batch(B: int = 3, T: int = 24, seed: int = 0, share: float = 0.15):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (B, T), generator=g)
    ids[:, 0] = 2
    pick = torch.rand(B, T, generator=g) < share
    pick[:, 0] = False
    pick[0, -1] = True  # the last position of a row, and a row with several
    labels = torch.where(pick, ids, torch.full_like(ids, -100))
    seg = torch.zeros(B, T, dtype=torch.long)
    seg[:, T // 2 :] = 1
    return dict(input_ids=torch.where(pick, torch.full_like(ids, 4), ids), token_type_ids=seg, labels=labels,
                next_sentence_label=torch.randint(0, 2, (B,), generator=g))


def _run(model, batch, share, monkeypatch):
    monkeypatch.setattr(bert_module, "SPARSE_TOP_SHARE", share)
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("masking", ["none", "padding", "documents"])
def test_sparse_top_layer_equals_the_full_one(norm_first, masking, monkeypatch):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                     max_position_embeddings=64, norm_first=norm_first, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(cfg).train()
    batch = _batch()
    if masking == "padding":
        mask = torch.ones_like(batch["input_ids"])
        mask[1, 15:] = 0
        batch["labels"][1, 15:] = -100
        batch["attention_mask"] = mask
    elif masking == "documents":
        docs = torch.ones_like(batch["input_ids"])
        docs[:, 10:] = 2
        docs[2, 20:] = 0
        batch["labels"][2, 20:] = -100
        batch["document_ids"] = docs
    calls = []
    forward_at = TransformerBlock.forward_at
    monkeypatch.setattr(TransformerBlock, "forward_at", lambda *a: calls.append(1) or forward_at(*a))
    full, g_full = _run(model, batch, 0.0, monkeypatch)  # never sparse
    assert not calls
    sparse, g_sparse = _run(model, batch, 1.0, monkeypatch)  # always sparse
    assert calls == [1]
    assert full.logits.shape == sparse.logits.shape == (int((batch["labels"] != -100).sum()), V)
    torch.testing.assert_close(sparse.logits, full.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sparse.nsp_logits, full.nsp_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sparse.loss, full.loss, rtol=1e-6, atol=1e-6)
    assert set(g_sparse) == set(g_full)
    for name in g_full:
        torch.testing.assert_close(g_sparse[name], g_full[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_rule_takes_the_sparse_layer_only_for_few_positions(monkeypatch):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
                     max_position_embeddings=64)
    model = BertForPreTraining(cfg).train()
    calls = []
    monkeypatch.setattr(TransformerBlock, "forward_at",
                        lambda self, x, index, mask=None: calls.append(index.shape) or self(x, mask).gather(
                            1, index[..., None].expand(-1, -1, x.shape[-1])))
    with torch.no_grad():
        model(**_batch(T=40, share=0.15))
        assert len(calls) == 1 and calls[0][1] <= 20
        model(**_batch(T=40, share=0.9))  # most positions scored: the full layer
        assert len(calls) == 1
        model.eval()(**_batch(T=40, share=0.15))  # validation reads every top vector (token_cos): the full layer
    assert len(calls) == 1


def test_block_forward_at_equals_forward_gathered():
    torch.manual_seed(0)
    for norm_first in (False, True):
        block = TransformerBlock(32, 4, 48, dropout=0.0, attn_dropout=0.0, norm_first=norm_first).eval()
        x = torch.randn(2, 9, 32)
        index = torch.tensor([[0, 3, 3, 8], [5, 1, 0, 2]])  # any order, repeats allowed
        mask = torch.rand(2, 1, 9, 9) < 0.7
        mask |= torch.eye(9, dtype=torch.bool)
        for m in (None, mask[:, :, :1], mask):
            ref = block(x, m).gather(1, index[..., None].expand(-1, -1, 32))
            torch.testing.assert_close(block.forward_at(x, index, m), ref, rtol=1e-5, atol=1e-5)
