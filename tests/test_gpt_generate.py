"""Generation: cached == uncached, sampling controls, stop rules, sliding window, streaming text, CLI."""

from __future__ import annotations

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.families.gpt.model import GPTConfig, GPTLMHeadModel
from lmforge.generation import TextStream, filter_logits, next_token

V = 101


def tiny_model(norm_first: bool = True, n_positions: int = 64) -> GPTLMHeadModel:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=V, n_positions=n_positions, n_embd=32, n_layer=2, n_head=4, norm_first=norm_first, eos_token_id=0
    )
    model = GPTLMHeadModel(cfg).eval()
    with torch.no_grad():  # sharpen the random model so greedy picks are far from ties
        model.wte.weight.mul_(5)
    return model


@pytest.mark.parametrize("norm_first", [True, False])
def test_cached_equals_uncached(norm_first):
    model = tiny_model(norm_first)
    prompt = torch.randint(1, V, (2, 5), generator=torch.Generator().manual_seed(0))
    a, la = model.generate(prompt, 20, eos_token_id=None, output_logits=True)
    b, lb = model.generate(prompt, 20, eos_token_id=None, use_cache=False, output_logits=True)
    assert a.shape == (2, 25) and la.shape == (2, 20, V)
    assert torch.equal(a, b)
    assert (la - lb).abs().max() < 1e-5
    # and both match a plain forward over the final sequence
    full = model(a[:, :-1]).logits[:, 4:]
    assert (full - la).abs().max() < 1e-5


def test_cached_equals_uncached_left_padded_batch():
    model = tiny_model()
    p1 = torch.randint(1, V, (1, 6), generator=torch.Generator().manual_seed(1))
    p2 = torch.randint(1, V, (1, 3), generator=torch.Generator().manual_seed(2))
    batch = torch.cat([p1, torch.cat([torch.zeros(1, 3, dtype=torch.long), p2], 1)])
    mask = torch.tensor([[1] * 6, [0] * 3 + [1] * 3])
    a, la = model.generate(batch, 10, eos_token_id=None, attention_mask=mask, output_logits=True)
    b, lb = model.generate(batch, 10, eos_token_id=None, attention_mask=mask, use_cache=False, output_logits=True)
    assert torch.equal(a, b) and (la - lb).abs().max() < 1e-5
    # each row generates what it generates alone
    s1 = model.generate(p1, 10, eos_token_id=None)
    s2, l2 = model.generate(p2, 10, eos_token_id=None, output_logits=True)
    assert torch.equal(a[0], s1[0]) and torch.equal(a[1, 3:], s2[0])
    assert (la[1] - l2[0]).abs().max() < 1e-4


def test_sliding_window_past_n_positions():
    model = tiny_model(n_positions=16)
    prompt = torch.randint(1, V, (1, 10), generator=torch.Generator().manual_seed(3))
    a, la = model.generate(prompt, 30, eos_token_id=None, output_logits=True)
    b, lb = model.generate(prompt, 30, eos_token_id=None, use_cache=False, output_logits=True)
    assert a.shape == (1, 40) and torch.equal(a, b) and (la - lb).abs().max() < 1e-5
    with pytest.raises(LmforgeError, match="shorten the prompt"):
        model.generate(torch.ones(1, 17, dtype=torch.long), 2)


def test_eos_stops_and_pads():
    model = tiny_model()
    prompt = torch.randint(1, V, (1, 4), generator=torch.Generator().manual_seed(4))
    free = model.generate(prompt, 12, eos_token_id=None)
    eos = int(free[0, 4 + 2])  # make the third generated token the end-of-text
    stopped = model.generate(prompt, 12, eos_token_id=eos)
    first = (free[0, 4:] == eos).nonzero()[0].item()
    assert stopped.shape[1] == 4 + first + 1 and stopped[0, -1] == eos


def test_sampling_is_seeded_and_filters():
    model = tiny_model()
    prompt = torch.randint(1, V, (1, 4), generator=torch.Generator().manual_seed(5))
    a = model.generate(prompt, 15, temperature=1.0, seed=7, eos_token_id=None)
    b = model.generate(prompt, 15, temperature=1.0, seed=7, eos_token_id=None)
    c = model.generate(prompt, 15, temperature=1.0, seed=8, eos_token_id=None)
    assert torch.equal(a, b) and not torch.equal(a, c)
    # top_k=1 sampling is greedy
    greedy = model.generate(prompt, 15, eos_token_id=None)
    assert torch.equal(model.generate(prompt, 15, temperature=1.0, top_k=1, seed=1, eos_token_id=None), greedy)
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    assert torch.isinf(filter_logits(logits, top_k=2)[0, 2:]).all()
    # probabilities ~ .57 .21 .13 .03: top_p 0.7 keeps the two best, top_p 0.1 keeps only the best
    assert torch.isfinite(filter_logits(logits, top_p=0.7)[0]).tolist() == [True, True, False, False]
    assert torch.isfinite(filter_logits(logits, top_p=0.1)[0]).tolist() == [True, False, False, False]
    assert next_token(logits).item() == 0
    g = torch.Generator().manual_seed(0)
    draws = {next_token(logits, 1.0, top_p=0.7, generator=g).item() for _ in range(200)}
    assert draws == {0, 1}


def test_streamer_gets_every_token():
    model = tiny_model()
    prompt = torch.randint(1, V, (1, 4), generator=torch.Generator().manual_seed(6))
    got = []
    out = model.generate(prompt, 8, eos_token_id=None, streamer=lambda t: got.append(int(t[0])))
    assert got == out[0, 4:].tolist()


class CharTokenizer:
    """Decodes ids to bytes; ids >= 200 are the halves of 'é' (a UTF-8 character split over two tokens)."""

    def decode(self, ids):
        return bytes(i for i in ids).decode("utf-8", errors="replace")


def test_text_stream_holds_partial_chars_and_stop_strings():
    tok = CharTokenizer()
    s = TextStream(tok, stop_strings=["END"])
    pieces = [s.put(i) for i in b"ab\xc3\xa9cE"]
    assert "".join(pieces) == "ab\u00e9c"  # 'E' held back: it may start "END"
    assert pieces[2] == ""  # the first byte of 'é' alone is not shown
    assert s.put(ord("N")) == "" and s.put(ord("D")) == "" and s.stopped
    assert s.end() == ""
    s2 = TextStream(tok, stop_strings=["END"])
    out = "".join(s2.put(i) for i in b"xEy") + s2.end()
    assert out == "xEy"


def test_stop_strings(monkeypatch):
    model = tiny_model()
    model.tokenizer = CharTokenizer()
    prompt = torch.randint(1, V, (1, 4), generator=torch.Generator().manual_seed(9))
    free = model.generate(prompt, 12, eos_token_id=None)
    stop = bytes(free[0, 7:9].tolist()).decode("utf-8", errors="replace")
    out = model.generate(prompt, 12, eos_token_id=None, stop_strings=[stop])
    text = bytes(out[0, 4:].tolist()).decode("utf-8", errors="replace")
    assert stop in text and out.shape[1] <= 4 + 5


def test_generate_cli(tmp_path, bpe_tokenizer, capsys):
    from lmforge.cli import main

    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=bpe_tokenizer.vocab_size,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        eos_token_id=bpe_tokenizer.eot_id,
    )
    model = GPTLMHeadModel(cfg)
    model.save_pretrained(tmp_path / "m", tokenizer=bpe_tokenizer)
    rc = main(["generate", str(tmp_path / "m"), "--prompt", "The python", "--max-new-tokens", "12"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("The python")
    ids = torch.tensor([bpe_tokenizer.encode("The python")])
    expected = model.eval().generate(ids, 12)
    assert out.rstrip("\n") == bpe_tokenizer.decode(expected[0].tolist())
    rc = main(["generate", str(tmp_path / "m"), "--prompt", "x" * 0, "--max-new-tokens", "3"])
    assert rc == 2


def test_generate_takes_a_string_and_a_list_as_fill_mask_does(tmp_path, bpe_tokenizer):
    import lmforge

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=bpe_tokenizer.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                    eos_token_id=bpe_tokenizer.eot_id)
    GPTLMHeadModel(cfg).save_pretrained(tmp_path / "m", tokenizer=bpe_tokenizer)
    model = lmforge.load(tmp_path / "m")
    prompts = ["The python", "In the beginning"]
    ids = [model.generate(torch.tensor([bpe_tokenizer.encode(p)]), 8)[0].tolist() for p in prompts]
    want = [bpe_tokenizer.decode(i[len(bpe_tokenizer.encode(p)):]) for p, i in zip(prompts, ids)]
    assert want[0] != want[1]  # the prompts lead to different texts: the comparison below is not vacuous
    got = model.generate(prompts[0], max_new_tokens=8)
    assert isinstance(got, str) and got == want[0]  # the new text, without the prompt
    assert model.generate(prompts, max_new_tokens=8) == want
    assert model.generate(prompts[1], max_new_tokens=8, temperature=1.0, seed=3) == model.generate(
        prompts[1], max_new_tokens=8, temperature=1.0, seed=3)
    with pytest.raises(TypeError):
        model.generate("The python", output_logits=True)
