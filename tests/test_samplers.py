import numpy as np
import pytest
import torch

from lmforge.data.samplers import BiLMWindowSampler, CausalWindowSampler
from lmforge.data.shards import Shards, prepare
from lmforge.errors import DataError


def _rngs(*seeds):
    return [np.random.default_rng(s) for s in seeds]


def _is_slice(row: list[int], stream: np.ndarray, start_hint=None) -> bool:
    n = len(row)
    first = np.nonzero(stream[: len(stream) - n + 1] == row[0])[0]
    return any(stream[i:i + n].tolist() == row for i in first)


@pytest.mark.parametrize("split", ["train", "val"])
def test_causal_windows(bpe_shards, split):
    sh = Shards.open(bpe_shards)
    s = CausalWindowSampler(sh, 16)
    b = s.batch(_rngs(1, 2, 3), split)
    assert set(b) == {"input_ids", "labels"}
    assert b["input_ids"].shape == (3, 16) and b["input_ids"].dtype == torch.long
    assert torch.equal(b["input_ids"], b["labels"])
    stream = np.asarray(sh.tokens(split))
    for row in b["input_ids"].tolist():
        assert _is_slice(row, stream)


def test_rows_depend_only_on_their_rng(bpe_shards, wordpiece_shards):
    for cls, path in ((CausalWindowSampler, bpe_shards), (BiLMWindowSampler, wordpiece_shards)):
        s = cls(Shards.open(path), 12)
        a = s.batch(_rngs(5, 6, 7), "train")
        b = s.batch(_rngs(6), "train")
        c = s.batch(_rngs(5, 6, 7), "train")
        for k in a:
            assert torch.equal(a[k], c[k])
            assert torch.equal(a[k][1:2], b[k])
        assert not torch.equal(a["input_ids"][0], a["input_ids"][2])


def test_causal_windows_cross_documents_through_eot(bpe_shards, bpe_tokenizer):
    s = CausalWindowSampler(Shards.open(bpe_shards), 64)
    b = s.batch([np.random.default_rng(i) for i in range(64)], "train")
    assert (b["input_ids"] == bpe_tokenizer.eot_id).any()


def test_short_split_is_padded(tmp_path, bpe_tokenizer_dir):
    f = tmp_path / "c.txt"
    f.write_text("A short first document.\n\nAnother short one.\n")
    prepare([f], bpe_tokenizer_dir, tmp_path / "s", val_fraction=0.5)
    sh = Shards.open(tmp_path / "s")
    n = len(sh.tokens("val"))
    b = CausalWindowSampler(sh, n + 5).batch(_rngs(0, 1), "val")
    assert b["attention_mask"][:, :n].all() and not b["attention_mask"][:, n:].any()
    assert (b["labels"][:, n:] == -100).all() and (b["input_ids"][:, n:] == sh.tokenizer().pad_id).all()
    assert b["input_ids"][0, :n].tolist() == sh.tokens("val").tolist()


def test_empty_split_is_a_clear_error(tmp_path, bpe_tokenizer_dir):
    f = tmp_path / "c.txt"
    f.write_text("Only one document here.\n")
    prepare([f], bpe_tokenizer_dir, tmp_path / "s", val_fraction=0.0)
    s = CausalWindowSampler(Shards.open(tmp_path / "s"), 8)
    with pytest.raises(DataError, match="val split .* is empty"):
        s.batch(_rngs(0), "val")
    with pytest.raises(DataError, match="seq_len"):
        CausalWindowSampler(Shards.open(tmp_path / "s"), 1)


@pytest.mark.parametrize("split", ["train", "val"])
def test_bilm_windows_stay_inside_one_document(wordpiece_shards, wordpiece_tokenizer, split):
    sh = Shards.open(wordpiece_shards)
    T = 48
    s = BiLMWindowSampler(sh, T)
    b = s.batch([np.random.default_rng(i) for i in range(40)], split)
    assert set(b) == {"input_ids", "attention_mask", "labels"}
    assert b["input_ids"].shape == b["attention_mask"].shape == b["labels"].shape == (40, T)
    tokens, sent, docs = np.asarray(sh.tokens(split)), sh.sentences(split), sh.documents(split)
    bounds = sent[docs]
    doc_texts = [tokens[bounds[d]:bounds[d + 1]].tolist() for d in range(len(bounds) - 1)]
    for ids, mask, labels in zip(b["input_ids"].tolist(), b["attention_mask"].tolist(), b["labels"].tolist()):
        n = sum(mask)
        assert mask == [1] * n + [0] * (T - n) and n >= 1
        assert ids[n:] == [wordpiece_tokenizer.pad_id] * (T - n) and labels[n:] == [-100] * (T - n)
        assert labels[:n] == ids[:n]
        window = ids[:n]
        owner = [d for d in doc_texts if any(d[i:i + n] == window for i in range(len(d) - n + 1))]
        assert owner, "window is not inside any single document"
        if n < T:  # padded only when the window reaches its document's end
            assert any(d[-n:] == window for d in owner)
    assert b["attention_mask"].all(dim=1).any()  # long documents give full windows


def test_bilm_feeds_the_elmo_model(wordpiece_shards):
    from lmforge.families.elmo import model as elmo
    torch.manual_seed(0)
    sh = Shards.open(wordpiece_shards)
    cfg = elmo.ElmoConfig(vocab_size=sh.vocab_size, token_encoder="word", projection_dim=16, cell_size=32,
                          num_layers=1, seq_len=12)
    model = elmo.ElmoBiLM(cfg)
    out = model(**BiLMWindowSampler(sh, 12).batch(_rngs(0, 1), "train"))
    assert torch.isfinite(out.loss)
