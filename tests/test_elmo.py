"""ELMo biLM: shapes, the no-peeking property of both directions, loss at init, overfitting, save/load,
padding invariance, char spelling of WordPiece and byte-level BPE pieces, and the features."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from lmforge.families.elmo.model import ElmoBiLM, ElmoConfig
from lmforge.families.elmo.presets import PRESETS
from lmforge.families.elmo.pretraining import setup_elmo
from lmforge.models.base import TokenLayers
from lmforge.nn.charcnn import BOW_CHAR, EOW_CHAR, PAD_CHAR, SPECIAL_CHAR, piece_bytes, spell_piece, vocab_char_ids

V = 97


def tiny_config(**kw) -> ElmoConfig:
    base = dict(PRESETS["tiny"], vocab_size=V, dropout=0.0, seq_len=16)
    base.update(kw)
    return ElmoConfig(**base)


class WordTok:
    """A whitespace/punctuation tokenizer with the parts of the Tokenizer interface ELMo uses."""

    kind = "wordpiece"

    def __init__(self, words: list[str]):
        self.vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
        self.index = {w: i for i, w in enumerate(self.vocab)}
        self.pad_id, self.unk_id = 0, 1
        self.special_ids = {0, 1, 2, 3, 4}

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def id_to_token(self, i: int) -> str:
        return self.vocab[i]

    def encode_with_offsets(self, text: str):
        ids, toks, offs = [], [], []
        for m in re.finditer(r"\w+|[^\w\s]", text.lower()):
            ids.append(self.index.get(m.group(), self.unk_id))
            toks.append(m.group())
            offs.append((m.start(), m.end()))
        return ids, toks, offs


def make_model(seed: int = 0, **kw) -> ElmoBiLM:
    torch.manual_seed(seed)
    model = ElmoBiLM(tiny_config(**kw))
    words = [f"w{i}" for i in range(V - 5)]
    model.set_tokenizer(WordTok(words))
    return model.eval()


@pytest.mark.parametrize("encoder", ["char", "word"])
def test_shapes_and_hidden_states(encoder):
    model = make_model(token_encoder=encoder)
    ids = torch.randint(0, V, (3, 11))
    out = model(ids, labels=ids)
    assert out.logits.shape == (2, 3, 11, V)
    assert set(out.metrics) == {"fwd_loss", "bwd_loss", "lm_loss", "token_cos"}  # eval: the collapse diagnostic
    assert torch.allclose(out.loss, out.metrics["fwd_loss"] + out.metrics["bwd_loss"])
    hs = model.hidden_states(ids)
    assert len(hs) == 3 and all(h.shape == (3, 11, model.hidden_size) for h in hs)
    P = model.config.projection_dim
    assert model.hidden_size == 2 * P
    # the token layer is the token vector duplicated [x; x]
    torch.testing.assert_close(hs[0][..., :P], hs[0][..., P:])
    assert len(model.transfer_layers()) == 3


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


@pytest.mark.parametrize("encoder", ["char", "word"])
def test_no_direction_sees_what_it_predicts(encoder):
    """Forward output at t depends only on tokens <= t; backward at t only on tokens >= t."""
    model = make_model(token_encoder=encoder)
    T = 9
    ids = torch.randint(5, V, (1, T))
    base = model(ids).logits
    # the char encoder runs over the batch's distinct tokens, so a changed token can change the
    # matmul blocking and the last bits (~1e-9); a real dependence is orders of magnitude larger
    tol = 1e-7 if encoder == "char" else 0.0
    for j in range(T):
        changed = ids.clone()
        changed[0, j] = 5 + (changed[0, j] - 5 + 7) % (V - 5)
        new = model(changed).logits
        # forward at t < j unchanged (it predicts t+1 <= j, so it never sees the token it predicts)
        # forward at t < j unchanged (it predicts t+1 <= j, so it never sees the token it predicts)
        assert _maxdiff(new[0, :, :j], base[0, :, :j]) <= tol
        assert (new[0, :, j:] - base[0, :, j:]).abs().amax(-1).min() > 10 * tol
        # backward at t > j unchanged
        assert _maxdiff(new[1, :, j + 1 :], base[1, :, j + 1 :]) <= tol
        assert (new[1, :, : j + 1] - base[1, :, : j + 1]).abs().amax(-1).min() > 10 * tol


def test_no_peeking_through_gradients():
    """The scores for token t (forward at t-1, backward at t+1) have zero gradient w.r.t. token t's vector."""
    model = make_model(token_encoder="word")
    T = 8
    ids = torch.randint(5, V, (1, T))
    captured: list[torch.Tensor] = []

    def keep(_module, _inputs, out):
        out.retain_grad()
        captured.append(out)

    handle = model.token_encoder.register_forward_hook(keep)
    try:
        for t in range(1, T - 1):
            captured.clear()
            logits = model(ids).logits
            score = logits[0, 0, t - 1, ids[0, t]] + logits[1, 0, t + 1, ids[0, t]]
            score.backward()
            g = captured[0].grad[0].abs().sum(-1)  # (T,) gradient size at each input position
            assert g[t] == 0
            # forward at t-1 reads positions <= t-1, backward at t+1 reads >= t+1
            assert torch.all(g[:t] > 0) and torch.all(g[t + 1 :] > 0)
            model.zero_grad()
    finally:
        handle.remove()


def test_directions_are_independent():
    """The backward stack's parameters get no gradient from the forward loss, and vice versa."""
    model = make_model()
    ids = torch.randint(0, V, (2, 10))
    out = model(ids, labels=ids)
    fwd_only = torch.autograd.grad(
        torch.nn.functional.cross_entropy(out.logits[0, :, :-1].reshape(-1, V), ids[:, 1:].reshape(-1)),
        list(model.backward_lstm.parameters()),
        allow_unused=True,
    )
    assert all(g is None or torch.count_nonzero(g) == 0 for g in fwd_only)


def test_loss_at_init_is_log_vocab():
    model = make_model()
    ids = torch.randint(0, V, (4, 16))
    out = model(ids, labels=ids)
    assert abs(out.metrics["fwd_loss"].item() - math.log(V)) < 0.1
    assert abs(out.metrics["bwd_loss"].item() - math.log(V)) < 0.1


def _train(model, ids, steps: int, lr: float) -> tuple[float, float]:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    first = None
    for _ in range(steps):
        loss = model(ids, labels=ids).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return first, loss.item()


def test_overfits_one_batch():
    model = make_model(token_encoder="word").train()
    torch.manual_seed(1)
    first, last = _train(model, torch.randint(5, V, (2, 10)), steps=80, lr=2e-2)
    assert first > 8.0 and last < 0.5, (first, last)


def test_char_encoder_learns():
    """The char CNN path trains too (a shorter run: the tiny CNN learns more slowly than a table)."""
    model = make_model(token_encoder="char").train()
    torch.manual_seed(1)
    first, last = _train(model, torch.randint(5, V, (2, 10)), steps=30, lr=1e-2)
    assert last < 0.65 * first, (first, last)
    assert model.token_encoder.convs[0].weight.grad is not None


def test_padding_left_or_right_gives_same_vectors_and_loss():
    model = make_model()
    a = torch.randint(5, V, (1, 7))
    b = torch.randint(5, V, (1, 4))
    ref_a = model.hidden_states(a)
    ref_b = model.hidden_states(b)
    for side in ("right", "left"):
        ids = torch.zeros(2, 7, dtype=torch.long)
        mask = torch.zeros(2, 7, dtype=torch.long)
        ids[0], mask[0] = a[0], 1
        sl = slice(0, 4) if side == "right" else slice(3, 7)
        ids[1, sl], mask[1, sl] = b[0], 1
        hs = model.hidden_states(ids, mask)
        for h, ra, rb in zip(hs, ref_a, ref_b):
            torch.testing.assert_close(h[0], ra[0], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(h[1, sl], rb[0], rtol=1e-5, atol=1e-6)
            assert torch.count_nonzero(h[1, mask[1] == 0]) == 0
        out = model(ids, attention_mask=mask, labels=ids)
        torch.testing.assert_close(out.logits[:, 1, sl], model(b).logits[:, 0], rtol=1e-5, atol=1e-5)
        # the loss counts 6 + 3 predictions per direction, none across the padding
        nll_a = model(a, labels=a).metrics["fwd_loss"] * 6
        nll_b = model(b, labels=b).metrics["fwd_loss"] * 3
        torch.testing.assert_close(out.metrics["fwd_loss"], (nll_a + nll_b) / 9, rtol=1e-5, atol=1e-5)


def test_save_load_roundtrip(tmp_path):
    model = make_model()
    ids = torch.randint(0, V, (2, 9))
    model.tokenizer = None  # the folder needs no tokenizer: the char table travels in the weights
    model.save_pretrained(tmp_path)
    loaded = ElmoBiLM.from_pretrained(tmp_path, load_tokenizer=False)
    assert torch.equal(loaded.token_encoder.token_chars, model.token_encoder.token_chars)
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert loaded.config == model.config


def test_config_rejects_bad_values():
    from lmforge.errors import ConfigError

    with pytest.raises(ConfigError):
        ElmoConfig(token_encoder="bytes")
    with pytest.raises(ConfigError):
        ElmoConfig(projection_dim=512, cell_size=256)
    with pytest.raises(ConfigError):
        ElmoConfig(char_filters=[[9, 4]], max_chars_per_token=8)


def test_char_spelling_of_pieces():
    W = 10
    # WordPiece: a word start gets BOW, a continuation piece loses "##" and gets no BOW
    assert spell_piece("ab", "wordpiece", W) == [BOW_CHAR, ord("a") + 1, ord("b") + 1, EOW_CHAR] + [PAD_CHAR] * 6
    assert spell_piece("##ab", "wordpiece", W)[:3] == [ord("a") + 1, ord("b") + 1, EOW_CHAR]
    # byte-level BPE: "Ġ" is the space byte and marks a word start; "Ċ" is a newline byte
    assert piece_bytes("Ġthe", "bpe") == (b"the", True)
    assert piece_bytes("the", "bpe") == (b"the", False)
    assert piece_bytes("Ċ", "bpe") == (b"\n", False)
    assert piece_bytes("Ã©", "bpe") == ("é".encode(), False)
    # special tokens have their own marker; long pieces are cut but keep EOW
    assert spell_piece("[CLS]", "wordpiece", W, special=True)[:2] == [BOW_CHAR, SPECIAL_CHAR]
    long = spell_piece("abcdefghijklmnop", "wordpiece", W)
    assert len(long) == W and long[-1] == EOW_CHAR
    table = vocab_char_ids(WordTok(["w1", "##w1"]), W)
    assert table.shape == (7, W) and table.dtype == torch.int16
    assert not torch.equal(table[5], table[6])


def test_embed_returns_token_layers():
    model = make_model()
    texts = ["w1 w2 w3.", "w4", ""]
    out = model.embed(texts)
    assert len(out) == 3 and all(isinstance(o, TokenLayers) for o in out)
    assert out[0].tokens == ["w1", "w2", "w3", "."] and out[0].offsets[3] == (8, 9)
    assert out[0].layers.shape == (3, 4, model.hidden_size)
    assert out[0].layer_names == ["token", "lstm1", "lstm2"]
    assert out[2].layers.shape == (3, 0, model.hidden_size)
    # batching does not change the vectors
    alone = model.embed(["w1 w2 w3."])[0]
    torch.testing.assert_close(alone.layers, out[0].layers, rtol=1e-5, atol=1e-6)


def test_pretraining_setup_on_shards(wordpiece_shards_opened):
    shards, tok = wordpiece_shards_opened
    cfg = ElmoConfig(**dict(PRESETS["tiny"], vocab_size=3, seq_len=16))
    model, sampler = setup_elmo(cfg, shards, tok)
    assert model.config.vocab_size == tok.vocab_size
    rngs = [np.random.default_rng(i) for i in range(3)]
    batch = sampler.batch(rngs, "train")
    assert batch["input_ids"].shape[0] == 3
    out = model(**batch)
    assert abs(out.metrics["fwd_loss"].item() - math.log(tok.vocab_size)) < 0.5
    # the vocabulary was spelled into the char table
    assert torch.count_nonzero(model.token_encoder.token_chars) > 0


@pytest.fixture
def wordpiece_shards_opened(request):
    from lmforge.data.shards import Shards

    path = request.getfixturevalue("wordpiece_shards")
    shards = Shards.open(path)
    return shards, shards.tokenizer()


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_spelling_of_a_real_vocabulary(kind, request):
    """Every piece's spelled bytes are the bytes the tokenizer decodes it to; BOW marks word starts."""
    tok = request.getfixturevalue(f"{kind}_tokenizer")
    W = 24
    table = vocab_char_ids(tok, W)
    assert table.shape == (tok.vocab_size, W)
    starts = 0
    for i in range(tok.vocab_size):
        row = table[i].tolist()
        if i in tok.special_ids:
            assert row[:2] == [BOW_CHAR, SPECIAL_CHAR]
            continue
        piece = tok.id_to_token(i)
        body = [c - 1 for c in row if 0 < c <= 256]
        raw, starts_word = piece_bytes(piece, kind)
        assert bytes(body) == raw[: W - 2]
        assert (row[0] == BOW_CHAR) == starts_word
        starts += starts_word
        if kind == "bpe" and len(raw) <= W - 2:
            # the spelling is exactly what the tokenizer decodes the piece to (minus the leading space)
            assert bytes(body) == tok.decode([i]).encode("utf-8").removeprefix(b" ") or "\ufffd" in tok.decode([i])
    assert 0 < starts < tok.vocab_size  # some pieces start words, some continue them


def test_embed_with_bpe_tokenizer(bpe_tokenizer):
    torch.manual_seed(0)
    model = ElmoBiLM(ElmoConfig(**dict(PRESETS["tiny"], vocab_size=bpe_tokenizer.vocab_size)))
    model.set_tokenizer(bpe_tokenizer)
    model.eval()
    a, b = model.embed(["The python bit him.", "Short"])
    ids, tokens, offsets = bpe_tokenizer.encode_with_offsets("The python bit him.")
    assert a.tokens == tokens and a.offsets == [tuple(o) for o in offsets]
    assert a.layers.shape == (3, len(ids), model.hidden_size)
    (alone,) = model.embed(["Short"])
    torch.testing.assert_close(alone.layers, b.layers, rtol=1e-5, atol=1e-6)


def test_char_vector_does_not_depend_on_the_batch():
    """Trimming the convolved columns to the batch's longest spelling changes no token's vector."""
    torch.manual_seed(0)
    model = make_model()
    enc = model.token_encoder
    chars = torch.tensor([spell_piece("ab", "wordpiece", 20), spell_piece("abcdefghijklmno", "wordpiece", 20)])
    alone = enc.encode_chars(chars[:1])
    together = enc.encode_chars(chars)
    torch.testing.assert_close(alone[0], together[0], rtol=1e-5, atol=1e-6)
    # and equals the plain definition: convolve all 20 columns, max over windows, relu
    x = enc.char_embedding(chars[:1].long()).transpose(1, 2)
    feats = torch.cat([torch.relu(conv(x)).amax(-1) for conv in enc.convs], -1)
    torch.testing.assert_close(alone, enc.projection(enc.highway(feats)), rtol=1e-5, atol=1e-6)


def test_token_norm_and_folders_saved_before_it(tmp_path):
    """The token vectors enter the LSTMs layer-normed; a folder whose config.json predates ``token_norm``
    loads with the norm off and gives the logits it gave when it was saved."""
    import json

    from lmforge.storage.files import save_safetensors

    model = make_model(token_encoder="char")
    ids = torch.randint(5, V, (2, 9))
    tok = model.hidden_states(ids)[0][..., : model.config.projection_dim]  # the token layer (one copy)
    torch.testing.assert_close(tok.mean(-1), torch.zeros(2, 9), atol=1e-5, rtol=0)
    torch.testing.assert_close(tok.std(-1, unbiased=False), torch.ones(2, 9), atol=1e-3, rtol=0)
    assert "token_norm.weight" in model.state_dict()

    old = make_model(token_encoder="char", token_norm=False)
    old.tokenizer = None
    old.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["token_norm"]  # as written before the key existed
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    state = {k: v for k, v in old.state_dict().items()}
    save_safetensors(state, tmp_path / "model.safetensors")
    loaded = ElmoBiLM.from_pretrained(tmp_path, load_tokenizer=False)
    assert loaded.config.token_norm is False and loaded.token_norm is None
    torch.testing.assert_close(loaded(ids).logits, old(ids).logits, rtol=0, atol=0)
