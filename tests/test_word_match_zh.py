"""The word matcher of the polysemy and word-in-context tools in unsegmented Chinese text (and English as
before): ``lmforge embed MODEL "我喜欢吃苹果。" "苹果公司发布了新手机。" --word 苹果``."""

from __future__ import annotations

import pytest
import torch

from lmforge.cli import main
from lmforge.evaluate import find_word, span_vectors, word_rows
from lmforge.evaluate.polysemy import word_similarities
from lmforge.models.base import TokenLayers

FRUIT = "我喜欢吃苹果。"
COMPANY = "苹果公司发布了新手机。"
ZH_LINES = [
    "我喜欢吃苹果。",
    "苹果公司发布了新手机。",
    "他每天吃一个苹果，身体很好。",
    "这家公司的手机卖得很好。",
    "我们在市场买了水果和香蕉。",
    "新手机的价格比去年高。",
    "Python 是一种编程语言。",
] * 3


@pytest.fixture(scope="module")
def zh_tokenizer():
    """A tiny WordPiece trained on a few Chinese lines (each CJK character is its own token)."""
    from lmforge.tokenization import Tokenizer

    return Tokenizer.train(iter(ZH_LINES), kind="wordpiece", vocab_size=200, min_frequency=1)


@pytest.fixture(scope="module")
def zh_bert_dir(tmp_path_factory, zh_tokenizer):
    from lmforge.families.bert.model import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=zh_tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    out = tmp_path_factory.mktemp("zh") / "bert"
    BertForPreTraining(cfg).save_pretrained(out, zh_tokenizer)
    return out


@pytest.fixture(scope="module")
def zh_w2v_dir(tmp_path_factory, zh_tokenizer):
    from lmforge.families.word2vec.model import Word2Vec, Word2VecConfig

    torch.manual_seed(0)
    m = Word2Vec(Word2VecConfig(vocab_size=zh_tokenizer.vocab_size, vector_size=16))
    torch.nn.init.normal_(m.embeddings.weight)  # stands in for trained vectors
    out = tmp_path_factory.mktemp("zh") / "w2v"
    m.save_pretrained(out, zh_tokenizer)
    return out


def test_find_word_in_unsegmented_chinese():
    assert find_word(FRUIT, "苹果") == (4, 6)
    assert find_word(COMPANY, "苹果") == (0, 2)
    assert find_word("他每天吃一个苹果，身体很好。", "苹果") == (6, 8)
    assert find_word(FRUIT, "香蕉") is None
    # a Latin word between Chinese characters needs no spaces around it, in any case
    assert find_word("我学Python了", "python") == (2, 8)
    assert find_word("我学Pythonic了", "python") is None  # still a whole word on its Latin side


def test_english_matching_unchanged():
    assert find_word("He got bit by Python.", "python") == (14, 20)
    assert find_word("pythonic python", "python") == (9, 15)
    assert find_word("Python's syntax", "python") == (0, 6)
    assert find_word("no snake here", "python") is None
    assert find_word("a_python b", "python") is None
    # the WiC setting: after a space, exact case, not running on into an apostrophe or a hyphen
    assert find_word("Python runs", "Python", match_case=True, spaced=True) is None
    assert find_word("a python-like run", "python", match_case=True, spaced=True) is None
    assert find_word("a long run", "run", match_case=True, spaced=True) == (7, 10)
    assert find_word("a long Run", "run", match_case=True, spaced=True) is None


def test_word_rows_inside_the_span():
    # per-character tokens: only the word's characters, not their neighbours
    offsets = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7)]
    assert word_rows(offsets, (4, 6)) == [4, 5]
    # a token that runs past the word (BPE merged 吃苹): inside tokens do not cover it, so overlapping ones count
    assert word_rows([(0, 3), (3, 5), (5, 6), (6, 7)], (4, 6)) == [1, 2]
    assert word_rows([(0, 2), (2, 6)], (0, 6)) == [0, 1]  # py ##thon
    assert word_rows([(0, 2)], (3, 5)) == []
    tl = TokenLayers(list("我喜欢吃苹果。"), offsets, torch.arange(14.0).view(1, 7, 2), ["x"])
    torch.testing.assert_close(span_vectors(tl, (4, 6)), torch.tensor([[9.0, 10.0]]))


def test_tokens_of_the_word(zh_tokenizer):
    _, tokens, offsets = zh_tokenizer.encode_with_offsets(COMPANY)
    assert [tokens[i] for i in word_rows(offsets, find_word(COMPANY, "苹果"))] == ["苹", "果"]


def test_bert_polysemy_in_chinese(zh_bert_dir):
    from lmforge.families import load

    model = load(zh_bert_dir)
    rows = word_similarities(model, [FRUIT, COMPANY], "苹果")
    assert [r.layer for r in rows] == ["emb", "layer1", "layer2"]
    for r in rows:
        assert -1.0 <= r.pairs[(0, 1)] <= 1.0
    assert rows[-1].pairs[(0, 1)] < 1.0  # a contextual layer: the two contexts differ
    # the word's vector is the mean of exactly its two characters' vectors
    tl = model.embed([COMPANY])[0]
    torch.testing.assert_close(span_vectors(tl, (0, 2)), tl.layers[:, :2].float().mean(1))


def test_word2vec_polysemy_in_chinese_is_one(zh_w2v_dir):
    from lmforge.families import load

    rows = word_similarities(load(zh_w2v_dir), [FRUIT, COMPANY, "他每天吃一个苹果，身体很好。"], "苹果")
    assert len(rows) == 1 and set(rows[0].pairs.values()) == {1.0}  # a static model: the same vector everywhere


def test_cli_embed_chinese_word(zh_bert_dir, zh_w2v_dir, capsys):
    assert main(["embed", str(zh_bert_dir), str(zh_w2v_dir), FRUIT, COMPANY, "--word", "苹果"]) == 0
    out = capsys.readouterr().out
    assert "similarity of '苹果' across the sentences" in out
    w2v_line = [ln for ln in out.splitlines() if "(word2vec)" in ln]
    assert len(w2v_line) == 1 and w2v_line[0].split()[-1] == "1.0000"
    assert sum("(bert)" in ln for ln in out.splitlines()) == 3
    # a word that is not there is still one clear line and exit 2
    assert main(["embed", str(zh_bert_dir), FRUIT, COMPANY, "--word", "香蕉"]) == 2
    assert "does not occur in sentence 1" in capsys.readouterr().err
