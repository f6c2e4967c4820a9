"""The real benchmarks: a fixed test partition that no seed, training draw or in-domain pretraining text crosses."""

from __future__ import annotations

import json

import pytest

from lmforge.cli import main
from lmforge.transfer.benchmarks import BENCHMARKS, domain_text, in_test_partition, load_benchmark


def _key(ex) -> str:
    return "".join(ex.words) if hasattr(ex, "words") else " ".join(ex.text.split()).lower()


@pytest.mark.parametrize("name", ["en-tweets", "zh-sentiment", "zh-ner"])
def test_test_set_is_fixed_and_never_in_training_or_domain_text(name):
    tests, trains = [], []
    for seed in (0, 1, 2):
        tr, te = load_benchmark(name, 300, 1000, seed)
        assert len(tr) == 300 and len(te) == 1000
        tests.append([_key(ex) for ex in te.examples])
        trains.append({_key(ex) for ex in tr.examples})
    assert tests[0] == tests[1] == tests[2], "the test set must not depend on the training seed"
    assert trains[0] != trains[1], "the seed draws the training set"
    test_keys = set(tests[0])
    for tr in trains:
        assert not tr & test_keys
    text = domain_text(name)
    assert len(text) > 10_000
    norm = {" ".join(t.split()).lower() for t in text} if name != "zh-ner" else set(text)
    assert not norm & test_keys, "in-domain pretraining text must hold no test example"
    if name != "zh-ner":  # the partition is a property of the text itself, so duplicates fall on one side
        assert all(in_test_partition(t) for t in test_keys) and not any(in_test_partition(t) for t in norm)


def test_classification_draws_are_balanced():
    tr, te = load_benchmark("en-tweets", 300, 999, 0)
    for d in (tr, te):
        counts = [sum(ex.label == lab for ex in d.examples) for lab in d.labels]
        assert max(counts) - min(counts) <= 1, counts


def test_benchmark_cli_writes_text_and_files(tmp_path, capsys):
    assert main(["benchmark", "text", "en-tweets", "--out", str(tmp_path / "t.txt")]) == 0
    docs = (tmp_path / "t.txt").read_text(encoding="utf-8").split("\n\n")
    assert len(docs) > 10_000
    assert main(["benchmark", "data", "en-tweets", "--out", str(tmp_path / "d"), "--n-train", "40",
                 "--n-test", "30"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "d" / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and not {" ".join(r["text"].split()) for r in rows} & {" ".join(d.split()) for d in docs}
    assert main(["benchmark", "data", "zh-ner", "--out", str(tmp_path / "n"), "--n-train", "5", "--n-test", "5"]) == 0
    assert (tmp_path / "n" / "train.conll").is_file()
    assert set(BENCHMARKS) == {"zh-sentiment", "zh-ner", "zh-pos", "en-tweets"}


def test_benchmark_cli_learning_curve(tmp_path, capsys):
    import torch

    from lmforge.families.word2vec.model import Word2Vec, Word2VecConfig
    from lmforge.tokenization import Tokenizer

    tok = Tokenizer.train(iter(domain_text("en-tweets")[:2000]), kind="wordpiece", vocab_size=1000)
    torch.manual_seed(0)
    body = Word2Vec(Word2VecConfig(vocab_size=tok.vocab_size, vector_size=16))
    torch.nn.init.normal_(body.embeddings.weight)  # stands in for trained vectors
    body.save_pretrained(tmp_path / "w2v", tok)
    argv = ["benchmark", "curve", "en-tweets", str(tmp_path / "w2v"), "--out", str(tmp_path / "c"), "--sizes", "30",
            "--seeds", "0", "1", "--n-test", "60", "--pool", "200", "--max-len", "32",
            "--cache-dir", str(tmp_path / "cache")]
    assert main([*argv, "--modes", "scratch", "features"]) == 0
    res = json.loads((tmp_path / "c" / "curve.json").read_text())
    assert res["task"] == "classify" and res["modes"] == ["scratch", "features"]
    assert [(r["mode"], r["seed"]) for r in res["runs"]] == [("scratch", 0), ("features", 0), ("scratch", 1),
                                                             ("features", 1)]
    assert all(0 <= r["score"] <= 1 for r in res["runs"])
    assert "| 30 |" in capsys.readouterr().out
    assert res["n_test"] == 60 and res["scored_on"].endswith(":test")
    # every run trains at least 100 steps: 24 examples at batch 32 are one step an epoch
    assert all(r["epochs"] >= 100 for r in res["runs"] if r["mode"] == "scratch")
    # the research options of earlier versions are gone: refused in one line naming them
    for gone in (["--score-on", "dev"], ["--lr-grid-finetune", "1e-3"], ["--min-steps", "5"], ["--prompt", "x"]):
        with pytest.raises(SystemExit) as e:
            main([*argv, *gone])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"unknown option {gone[0]}" in err and len(err.strip().splitlines()) == 1


def _tweets_bert(max_positions: int):
    """A WordPiece tokenizer trained on 2,000 tweets and a 1-layer, 32-wide random BERT over it (tokenizer attached)."""
    import torch

    from lmforge.families.bert.model import BertConfig, BertForPreTraining
    from lmforge.tokenization import Tokenizer

    tok = Tokenizer.train(iter(domain_text("en-tweets")[:2000]), kind="wordpiece", vocab_size=1000)
    torch.manual_seed(0)
    body = BertForPreTraining(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=64,
                                         max_position_embeddings=max_positions))
    body.tokenizer = tok
    return tok, body


def test_benchmark_cli_curve_with_a_baseline_in_another_shape(tmp_path, capsys):
    from lmforge.families.bert.presets import PRESETS
    from lmforge.transfer.curve import curve_leads, preset_body

    tok, body = _tweets_bert(48)
    # the preset's shape, the pretrained body's vocabulary and positions, fresh weights
    tiny = preset_body(body, "tiny")
    assert (tiny.config.hidden_size, tiny.config.num_hidden_layers) == (PRESETS["tiny"]["hidden_size"],
                                                                         PRESETS["tiny"]["num_hidden_layers"])
    assert tiny.config.vocab_size == tok.vocab_size and tiny.config.max_position_embeddings == 48
    assert tiny.tokenizer is tok and body.config.hidden_size == 32
    body.save_pretrained(tmp_path / "bert", tok)
    argv = ["benchmark", "curve", "en-tweets", str(tmp_path / "bert"), "--out", str(tmp_path / "c"), "--sizes", "30",
            "--seeds", "0", "--n-test", "40", "--pool", "200", "--max-len", "32",
            "--modes", "scratch", "finetune"]
    assert main([*argv, "scratch:tiny"]) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "c" / "curve.json").read_text())
    assert res["modes"] == ["scratch", "finetune", "scratch:tiny"]
    runs = {r["mode"]: r for r in res["runs"]}
    assert runs["scratch:tiny"]["choices"]["lr"] == 1e-3 == runs["scratch"]["choices"]["lr"]  # the scratch recipe
    lead = curve_leads(res)[30]
    strongest = max(runs["scratch"]["score"], runs["scratch:tiny"]["score"])
    assert lead["baseline_mean"] == strongest and lead["best"] == "finetune"
    assert abs(lead["lead"] - (runs["finetune"]["score"] - strongest)) < 1e-12
    assert f"{100 * lead['lead']:+.1f} points" in out
    assert "strongest from-scratch baseline" in (tmp_path / "c" / "curve.md").read_text()
    assert main([*argv, "scratch:huge", "--overwrite"]) == 2  # (without --overwrite: the curve there is refused)
    err = capsys.readouterr().err.strip()
    assert "no preset 'huge'" in err and len(err.splitlines()) == 1
