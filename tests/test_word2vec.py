"""word2vec via gensim: the model folder, vectors.txt, determinism, static embeddings, word grouping."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gensim  # noqa: F401  (installed by `make test`)
import pytest
import torch

import lmforge  # noqa: E402
from lmforge.families.word2vec.model import Word2Vec, Word2VecConfig, word_index  # noqa: E402
from lmforge.families.word2vec.train import run_pretraining  # noqa: E402

CFG = dict(vector_size=16, epochs=2, window=3, negative=3, seed=7)


@pytest.fixture(scope="module")
def w2v_dir(tmp_path_factory, wordpiece_shards):
    from lmforge.data.shards import Shards

    shards = Shards.open(wordpiece_shards)
    out = tmp_path_factory.mktemp("w2v") / "model"
    result = run_pretraining(shards, shards.tokenizer(), Word2VecConfig(**CFG), out)
    assert result.val["words_per_sec"] > 0
    assert 0 < result.val["vocab_coverage"] <= 1
    return out


def test_model_folder_and_static_vectors(w2v_dir):
    for name in ("config.json", "model.safetensors", "vectors.txt", "tokenizer.json"):
        assert (w2v_dir / name).is_file(), name
    model = lmforge.load(w2v_dir)
    assert isinstance(model, Word2Vec) and model.tokenizer is not None
    tok = model.tokenizer
    assert model.config.vocab_size == tok.vocab_size
    w = model.embeddings.weight
    # tokens gensim never saw ([MASK] never occurs in a sentence) are zeros; seen ones are not
    assert torch.count_nonzero(w[tok.mask_id]) == 0
    the = tok.token_to_id("the")
    assert the is not None and torch.count_nonzero(w[the]) > 0
    # the body interface (TransferBody)
    ids = torch.tensor([[the, tok.pad_id]])
    hs = model.hidden_states(ids, attention_mask=torch.tensor([[1, 0]]))
    assert len(hs) == 1 and hs[0].shape == (1, 2, model.hidden_size) and torch.count_nonzero(hs[0][0, 1]) == 0
    assert model.transfer_layers() == [model.embeddings]


def test_vectors_txt_matches_safetensors(w2v_dir):
    from gensim.models import KeyedVectors

    kv = KeyedVectors.load_word2vec_format(str(w2v_dir / "vectors.txt"), binary=False)
    model = lmforge.load(w2v_dir)
    tok = model.tokenizer
    assert len(kv.index_to_key) == int((model.embeddings.weight.abs().sum(1) > 0).sum())
    for token in kv.index_to_key[:50]:
        torch.testing.assert_close(
            torch.from_numpy(kv[token].copy()), model.embeddings.weight[tok.token_to_id(token)], atol=1e-5, rtol=1e-5
        )


def test_embed_gives_the_same_vector_in_every_context(w2v_dir):
    model = lmforge.load(w2v_dir)
    a, b = model.embed(["the snake bit him.", "he read the manual."])
    ia, ib = a.tokens.index("the"), b.tokens.index("the")
    assert a.layers.shape[0] == 1 and a.layer_names == ["word2vec"]
    assert torch.equal(a.layers[0, ia], b.layers[0, ib])


def test_multi_piece_words_get_the_mean_of_their_pieces(w2v_dir):
    model = lmforge.load(w2v_dir)
    tok = model.tokenizer
    text = "xylophonequartz the"
    ids, tokens, offsets = tok.encode_with_offsets(text)
    groups = word_index(text, offsets)
    n_first = groups.count(0)
    assert n_first > 1, tokens  # the made-up word is split into pieces
    (tl,) = model.embed([text])
    mean = model.embeddings.weight[torch.tensor(ids[:n_first])].mean(0)
    for i in range(n_first):
        torch.testing.assert_close(tl.layers[0, i], mean)
    torch.testing.assert_close(tl.layers[0, n_first], model.embeddings.weight[ids[n_first]])


def test_word_index_groups_pieces_by_characters():
    # WordPiece-like "py ##thon ." and BPE-like offsets (leading space excluded)
    assert word_index("python.", [(0, 2), (2, 6), (6, 7)]) == [0, 0, 1]
    assert word_index("a python", [(0, 1), (2, 4), (4, 8)]) == [0, 1, 1]
    # CJK characters are words of their own even when adjacent
    assert word_index("中文", [(0, 1), (1, 2)]) == [0, 1]
    assert word_index("", []) == []


def _train_in_subprocess(shards_dir: Path, out: Path, hashseed: str) -> None:
    code = (
        "import sys; from lmforge.data.shards import Shards; "
        "from lmforge.families.word2vec.model import Word2VecConfig; "
        "from lmforge.families.word2vec.train import run_pretraining; "
        "s = Shards.open(sys.argv[1]); "
        f"run_pretraining(s, s.tokenizer(), Word2VecConfig(**{CFG!r}), sys.argv[2])"
    )
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    subprocess.run([sys.executable, "-c", code, str(shards_dir), str(out)], check=True, env=env, timeout=300)


@pytest.mark.slow
def test_deterministic_across_processes(tmp_path, wordpiece_shards, w2v_dir):
    """Same config and shards give the same vectors, whatever Python's string-hash seed."""
    _train_in_subprocess(wordpiece_shards, tmp_path / "a", "1")
    from lmforge.storage.files import load_safetensors

    a = load_safetensors(tmp_path / "a" / "model.safetensors")["embeddings.weight"]
    b = load_safetensors(w2v_dir / "model.safetensors")["embeddings.weight"]
    assert torch.equal(a, b)


def test_cbow_and_bad_config(tmp_path, wordpiece_shards):
    from lmforge.data.shards import Shards
    from lmforge.errors import ConfigError

    with pytest.raises(ConfigError):
        Word2VecConfig(architecture="glove")
    shards = Shards.open(wordpiece_shards)
    result = run_pretraining(shards, shards.tokenizer(), Word2VecConfig(**dict(CFG, architecture="cbow")), tmp_path)
    assert result.val["effective_words"] > 0
    assert torch.count_nonzero(lmforge.load(tmp_path).embeddings.weight) > 0
