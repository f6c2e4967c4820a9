"""Nearest words: gensim's most_similar for word2vec, corpus means for the contextual families; the CLI."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.families import FAMILIES, load
from lmforge.families.word2vec.model import Word2VecConfig
from lmforge.models.neighbors import neighbors

CORPUS = [
    "the python is a large snake .",
    "python is a programming language .",
    "the snake is in the garden .",
    "god said let there be light , and there was light .",
    "a large snake and a small snake .",
]


@pytest.fixture(scope="module")
def w2v_dir(tmp_path_factory, wordpiece_shards):
    from lmforge.data.shards import Shards
    from lmforge.families.word2vec.train import run_pretraining

    shards = Shards.open(wordpiece_shards)
    out = tmp_path_factory.mktemp("w2v") / "model"
    run_pretraining(shards, shards.tokenizer(), Word2VecConfig(vector_size=16, epochs=2, window=3, seed=7), out)
    return out


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, wordpiece_tokenizer):
    family = FAMILIES["bert"]
    torch.manual_seed(0)
    config = family.config_class(**{**family.presets["tiny"], "hidden_size": 32, "num_hidden_layers": 2,
                                    "num_attention_heads": 2, "intermediate_size": 64,
                                    "vocab_size": wordpiece_tokenizer.vocab_size})
    out = tmp_path_factory.mktemp("bert")
    family.model_class(config).save_pretrained(out, wordpiece_tokenizer)
    return out


def test_word2vec_neighbors_equal_gensim_most_similar(w2v_dir):
    from gensim.models import KeyedVectors

    model = load(w2v_dir)
    weight = model.embeddings.weight.detach().numpy()
    rows = [i for i in range(weight.shape[0]) if np.any(weight[i])]  # the tokens vectors.txt holds
    kv = KeyedVectors(vector_size=weight.shape[1])
    kv.add_vectors([model.tokenizer.id_to_token(i) for i in rows], weight[rows])
    for word in ("python", "the", "of"):
        ours = neighbors(model, word, top_k=10)
        theirs = kv.most_similar(word, topn=10)
        assert [w for w, _ in ours] == [w for w, _ in theirs]
        np.testing.assert_allclose([s for _, s in ours], [s for _, s in theirs], atol=1e-5)


def test_word2vec_unknown_word_is_an_error(w2v_dir, capsys):
    model = load(w2v_dir)
    with pytest.raises(LmforgeError, match="not in the model's vocabulary"):
        neighbors(model, "ωψ")
    assert main(["neighbors", str(w2v_dir), "ωψ"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not in the model's vocabulary" in err


def test_word2vec_cli_prints_the_neighbors(w2v_dir, capsys):
    assert main(["neighbors", str(w2v_dir), "Python", "--top-k", "4"]) == 0  # lower-cased like the tokenizer
    lines = capsys.readouterr().out.strip().splitlines()
    expected = neighbors(load(w2v_dir), "python", top_k=4)
    assert [line.split() for line in lines] == [[w, f"{s:.4f}"] for w, s in expected]


def test_contextual_neighbors_are_corpus_means(bert_dir):
    model = load(bert_dir)
    # by hand: each space-separated word's vector at the top layer (the mean of its pieces), then averaged
    # over the word's occurrences
    sums: dict[str, list[torch.Tensor]] = {}
    for text, tl in zip(CORPUS, model.embed(CORPUS)):
        for m in re.finditer(r"\w+", text):
            rows = [i for i, (s, _) in enumerate(tl.offsets) if m.start() <= s < m.end()]
            sums.setdefault(m.group(), []).append(tl.layers[-1][rows].mean(0))
    assert any(len(tl.tokens) > len(text.split()) for text, tl in zip(CORPUS, model.embed(CORPUS)))  # split words
    means = {w: torch.stack(vs).mean(0) for w, vs in sums.items()}
    q = means["snake"]
    expected = sorted(((w, float(torch.cosine_similarity(q, v, dim=0))) for w, v in means.items() if w != "snake"),
                      key=lambda p: -p[1])[:5]
    got = neighbors(model, "snake", top_k=5, corpus=CORPUS)
    assert [w for w, _ in got] == [w for w, _ in expected]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], atol=1e-5)
    # a word seen once drops out with min_count=2
    assert all(len(sums[w]) >= 2 for w, _ in neighbors(model, "snake", top_k=10, corpus=CORPUS, min_count=2))


def test_contextual_neighbors_need_a_corpus_that_uses_the_word(bert_dir, tmp_path, capsys):
    model = load(bert_dir)
    with pytest.raises(LmforgeError, match="need a corpus"):
        neighbors(model, "snake")
    with pytest.raises(LmforgeError, match="'boat' does not occur in the corpus"):
        neighbors(model, "boat", corpus=CORPUS)
    assert main(["neighbors", str(bert_dir), "snake"]) == 2
    assert "give --corpus FILE" in capsys.readouterr().err
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    assert main(["neighbors", str(bert_dir), "snake", "--corpus", str(corpus), "--top-k", "3", "--layer", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    expected = neighbors(model, "snake", top_k=3, corpus=CORPUS, layer=1)
    assert [line.split() for line in lines] == [[w, f"{s:.4f}"] for w, s in expected]


def test_a_corpus_of_records_gives_the_neighbors_of_its_texts(bert_dir, tmp_path, capsys):
    """A CSV corpus (blank rows left out, as blank lines are) and a JSON Lines .txt give the neighbours of the same
    texts as a list does."""
    import csv

    expected = neighbors(load(bert_dir), "snake", top_k=3, corpus=CORPUS)
    table = tmp_path / "corpus.csv"
    with table.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "body"])
        w.writerows([(i, t) for i, t in enumerate(CORPUS)] + [(len(CORPUS), "")])
    jsonl = tmp_path / "corpus.txt"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n\n" for t in CORPUS), encoding="utf-8")
    for argv in (["--corpus", str(table), "--text-column", "body"], ["--corpus", str(jsonl)]):
        assert main(["neighbors", str(bert_dir), "snake", "--top-k", "3", *argv]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert [line.split() for line in lines] == [[w, f"{s:.4f}"] for w, s in expected]
    assert neighbors(load(bert_dir), "snake", top_k=3, corpus=jsonl) == expected  # the API reads files alike
    assert main(["neighbors", str(bert_dir), "snake", "--corpus", str(table)]) == 2
    assert "has no column 'text' (columns: id, body)" in capsys.readouterr().err


def test_word2vec_warns_when_the_word_is_the_mean_of_its_pieces(w2v_dir, caplog):
    model = load(w2v_dir)
    tok, weight = model.tokenizer, model.embeddings.weight.detach().numpy()
    split = next(w for w in ("pythonic", "snakes", "languages", "namespaces", "interpreters", "beginning")
                 if tok.token_to_id(w) is None and len(tok.encode(w)) > 1
                 and all(np.any(weight[i]) for i in tok.encode(w)))
    with caplog.at_level("WARNING", logger="lmforge.models.neighbors"):
        neighbors(model, "python", top_k=3)
    assert not caplog.records  # a vocabulary word: its own vector, nothing to say
    with caplog.at_level("WARNING", logger="lmforge.models.neighbors"):
        found = neighbors(model, split, top_k=3)
    pieces = " ".join(tok.id_to_token(i) for i in tok.encode(split))
    assert [r.getMessage() for r in caplog.records] == [
        f"'{split}' is not one token of the model's vocabulary: its vector is the mean of its pieces {pieces}"]
    assert len(found) == 3
