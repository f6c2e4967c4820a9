"""GPT-1 input transformations: token framing, new embedding rows, extract head, auxiliary LM loss."""

from __future__ import annotations

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.families.gpt.inputs import GPTForTask, add_task_tokens, transfer_format
from lmforge.families.gpt.model import GPTConfig, GPTLMHeadModel


@pytest.fixture
def gpt(bpe_tokenizer):
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=bpe_tokenizer.vocab_size,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        eos_token_id=bpe_tokenizer.eot_id,
    )
    model = GPTLMHeadModel(cfg)
    model.tokenizer = bpe_tokenizer
    return model


def test_new_tokens_get_new_rows_and_nothing_moves(gpt, bpe_tokenizer):
    V = gpt.config.vocab_size
    old = gpt.wte.weight.detach().clone()
    text_ids = torch.tensor([bpe_tokenizer.encode("The python is a snake.")])
    before = gpt.eval()(text_ids).logits
    ids_before = bpe_tokenizer.encode("start delim extract")
    start, delim, extract = add_task_tokens(gpt)
    assert (start, delim, extract) == (V, V + 1, V + 2)
    assert gpt.wte.weight.shape[0] == V + 3 and gpt.config.vocab_size == V + 3
    assert torch.equal(gpt.wte.weight[:V], old)  # every old row in place
    assert gpt.lm_head.weight.data_ptr() == gpt.wte.weight.data_ptr()  # still tied
    assert bpe_tokenizer.vocab_size == V and bpe_tokenizer.encode("start delim extract") == ids_before
    torch.testing.assert_close(gpt(text_ids).logits[..., :V], before)
    # idempotent, and the new rows are the same for a fresh copy of the same model (frozen-mode predict)
    assert add_task_tokens(gpt) == (V, V + 1, V + 2) and gpt.wte.weight.shape[0] == V + 3
    torch.manual_seed(0)
    twin = GPTLMHeadModel(dataclass_replace(gpt.config, vocab_size=V))
    twin.tokenizer = bpe_tokenizer
    add_task_tokens(twin)
    assert torch.equal(twin.wte.weight[V:], gpt.wte.weight[V:])
    # a body saved with the task tokens and reloaded is recognised (vocab = tokenizer's + 3)
    reloaded = GPTLMHeadModel(gpt.config)
    reloaded.tokenizer = bpe_tokenizer
    assert add_task_tokens(reloaded) == (V, V + 1, V + 2) and reloaded.config.vocab_size == V + 3


def dataclass_replace(cfg, **kw):
    import dataclasses

    return dataclasses.replace(cfg, **kw)


def test_classification_and_entailment_framing(gpt, bpe_tokenizer):
    V = gpt.config.vocab_size
    m = GPTForTask(gpt, "classification", num_labels=3)
    s, d, x = V, V + 1, V + 2
    b = m.encode_examples(bpe_tokenizer, ["A snake.", "Python is a programming language."])
    ids, mask = b["input_ids"], b["attention_mask"]
    assert ids.shape == mask.shape and ids.dim() == 2
    a1 = bpe_tokenizer.encode("A snake.")
    assert ids[0, : len(a1) + 2].tolist() == [s, *a1, x] and mask[0].sum() == len(a1) + 2
    assert ids[1, mask[1].sum() - 1] == x and (ids[:, 0] == s).all()
    assert m(**b).logits.shape == (2, 3)

    e = GPTForTask(gpt, "entailment", num_labels=3)
    b = e.encode_examples(bpe_tokenizer, [("A man sleeps.", "A person rests.")])
    p, h = bpe_tokenizer.encode("A man sleeps."), bpe_tokenizer.encode("A person rests.")
    assert b["input_ids"][0].tolist() == [s, *p, d, *h, x]
    # truncation keeps the frame: start ... delim ... extract within max_len
    long = e.encode_examples(bpe_tokenizer, [("word " * 50, "other " * 5)], max_len=20)
    row = long["input_ids"][0].tolist()
    assert len(row) == 20 and row[0] == s and row[-1] == x and row.count(d) == 1


def test_head_reads_the_extract_position(gpt, bpe_tokenizer):
    m = GPTForTask(gpt, "classification", num_labels=2, dropout=0.0).eval()
    b = m.encode_examples(bpe_tokenizer, ["short", "a much longer sentence about snakes"])
    out = m(**b).logits
    top = gpt.hidden_states(b["input_ids"])[-1]  # (B, T, C)
    last = b["attention_mask"].sum(-1) - 1
    assert (b["input_ids"][torch.arange(2), last] == m.format.extract_id).all()
    torch.testing.assert_close(out, m.head(top[torch.arange(2), last]))
    # what follows the extract token (padding) does not matter
    b2 = {k: v.clone() for k, v in b.items()}
    b2["input_ids"][0, last[0] + 1 :] = 7
    torch.testing.assert_close(m(**b2).logits, out)


def test_similarity_uses_both_orders_added(gpt, bpe_tokenizer):
    m = GPTForTask(gpt, "similarity", num_labels=1, dropout=0.0).eval()
    b = m.encode_examples(bpe_tokenizer, [("A cat sat.", "A dog ran far away."), ("x", "y")])
    ids = b["input_ids"]
    assert ids.shape[:2] == (2, 2)
    s, d, x = m.format.start_id, m.format.delim_id, m.format.extract_id
    ca, cb = bpe_tokenizer.encode("A cat sat."), bpe_tokenizer.encode("A dog ran far away.")
    assert ids[0, 0, : len(ca) + len(cb) + 3].tolist() == [s, *ca, d, *cb, x]
    assert ids[0, 1, : len(ca) + len(cb) + 3].tolist() == [s, *cb, d, *ca, x]
    out = m(**b).logits
    assert out.shape == (2,)  # regression
    _, e = m.extract_states(ids, b["attention_mask"])
    torch.testing.assert_close(out, m.head(e.view(2, 2, -1).sum(1)).squeeze(-1))
    # symmetric by construction
    swapped = m.encode_examples(bpe_tokenizer, [("A dog ran far away.", "A cat sat."), ("y", "x")])
    torch.testing.assert_close(m(**swapped).logits, out)
    loss = m(**b, labels=torch.tensor([0.5, 1.0])).loss
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_multiple_choice_one_sequence_per_choice(gpt, bpe_tokenizer):
    m = GPTForTask(gpt, "multiple_choice", dropout=0.0).eval()
    ex = [("The python is a", ["snake", "language", "river"]), ("Genesis", ["one", "two", "three"])]
    b = m.encode_examples(bpe_tokenizer, ex)
    assert b["input_ids"].shape[:2] == (2, 3)
    ctx, ch = bpe_tokenizer.encode("The python is a"), bpe_tokenizer.encode("language")
    f = m.format
    assert b["input_ids"][0, 1, : len(ctx) + len(ch) + 3].tolist() == [f.start_id, *ctx, f.delim_id, *ch, f.extract_id]
    out = m(**b, labels=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3)
    ref = torch.nn.functional.cross_entropy(out.logits, torch.tensor([0, 2]))
    torch.testing.assert_close(out.metrics["task_loss"], ref)
    with pytest.raises(LmforgeError, match="same number of choices"):
        m.encode_examples(bpe_tokenizer, [("a", ["b", "c"]), ("d", ["e"])])


def test_lm_weight_adds_auxiliary_loss(gpt, bpe_tokenizer):
    m = GPTForTask(gpt, "classification", num_labels=2, lm_weight=0.5, dropout=0.0).eval()
    b = m.encode_examples(bpe_tokenizer, ["one text", "another text here"])
    y = torch.tensor([0, 1])
    with_lm = m(**b, labels=y)
    m.lm_weight = 0.0
    without = m(**b, labels=y)
    assert "lm_loss" in with_lm.metrics and "lm_loss" not in without.metrics
    assert with_lm.loss.item() != pytest.approx(without.loss.item())
    torch.testing.assert_close(with_lm.loss, without.loss + 0.5 * with_lm.metrics["lm_loss"])
    # the LM loss is the GPT's own next-token loss over the real tokens only
    ids, mask = b["input_ids"], b["attention_mask"]
    row = ids[1:2, : int(mask[1].sum())]
    single = gpt(row, labels=row).loss
    assert with_lm.metrics["lm_loss"].item() > 0 and torch.isfinite(single)


def test_overfits_tiny_data(gpt, bpe_tokenizer):
    torch.manual_seed(0)
    m = GPTForTask(gpt, "entailment", num_labels=2, lm_weight=0.5).train()
    ex = [
        ("A snake bites.", "An animal bites."),
        ("A snake bites.", "Nobody bites."),
        ("The king spoke.", "Someone spoke."),
        ("The king spoke.", "The king was silent."),
    ]
    y = torch.tensor([0, 1, 0, 1])
    b = m.encode_examples(bpe_tokenizer, ex)
    opt = torch.optim.AdamW(m.parameters(), lr=5e-3)
    for _ in range(30):
        out = m(**b, labels=y)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert out.metrics["acc"].item() == 1.0 and out.metrics["task_loss"].item() < 0.1
    assert (m.predict(bpe_tokenizer, ex) == y).all()


def test_transfer_format_build(gpt):
    fmt = transfer_format(gpt)
    V = gpt.config.vocab_size - 3
    ids, a_pos, b_pos = fmt.build([5, 6], [7])
    assert ids == [V, 5, 6, V + 1, 7, V + 2] and a_pos == [1, 2] and b_pos == [4]
    assert fmt.build([5])[0] == [V, 5, V + 2]
    assert transfer_format(gpt) == fmt  # idempotent
