"""Every family's model offers the body interface (lmforge.models.base.TransferBody) with consistent shapes."""

from __future__ import annotations

import pytest
import torch

from lmforge.families import FAMILIES
from lmforge.models.base import TokenLayers, TransferBody

SMALL = {  # a small config of each family, on top of its "tiny" (or default) preset
    "bert": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=64,
                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),  # (tiny has none: eval is checked)
    "gpt": dict(n_positions=64, n_embd=32, n_layer=2, n_head=2),
    "elmo": {},
    "word2vec": dict(vector_size=16),
    "electra": dict(hidden_size=32, embedding_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    generator_size_divisor=2, max_position_embeddings=64,
                    hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),  # embeddings projected 16 -> 32
}


def test_every_family_is_covered():
    assert set(SMALL) == set(FAMILIES)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_body_interface(name, request):
    family = FAMILIES[name]
    tok = request.getfixturevalue("bpe_tokenizer" if family.tokenizer_kind == "bpe" else "wordpiece_tokenizer")
    presets = family.presets
    base = dict(presets.get("tiny", presets[family.default_preset]))
    config = family.config_class(**{**base, **SMALL[name], "vocab_size": tok.vocab_size})
    torch.manual_seed(0)
    model = family.model_class(config).eval()
    if hasattr(model, "set_tokenizer"):
        model.set_tokenizer(tok)
    else:
        model.tokenizer = tok
    assert isinstance(model, TransferBody)
    assert model.model_type == name

    ids = torch.tensor([tok.encode("the python is a large snake .")[:8]] * 2)  # (2, T)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        states = model.hidden_states(ids, mask)
    assert len(states) >= 1
    for h in states:
        assert h.shape == (2, ids.shape[1], model.hidden_size)
    parts = model.transfer_layers()
    assert len(parts) == len(states) and all(isinstance(p, torch.nn.Module) for p in parts)
    owned = {id(p) for p in model.parameters()}
    assert all(id(p) in owned for part in parts for p in part.parameters())

    (res,) = model.embed(["the python is a large snake ."])
    assert isinstance(res, TokenLayers)
    assert res.layers.shape == (len(states), len(res.tokens), model.hidden_size)
    assert len(res.layer_names) == len(states) and len(res.offsets) == len(res.tokens)

    # embed runs in eval mode (no dropout) whatever mode the model is in, and leaves that mode as it was
    model.train()
    (again,) = model.embed(["the python is a large snake ."])
    assert model.training
    assert torch.equal(again.layers, res.layers)
