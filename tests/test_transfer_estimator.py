"""``Transfer``, the scikit-learn face of a transfer run: fit / predict / score / save / load give what
``lmforge finetune`` gives on the same data, settings and seed, down to the bytes of the weights."""

from __future__ import annotations

import json

import pytest
from test_transfer_families import bert_dir, cls_files, tiny_bert  # noqa: F401

from lmforge.cli import main
from lmforge.data.tasks import TaskData, TextExample, load_task
from lmforge.errors import ConfigError, LmforgeError
from lmforge.transfer import Transfer

SETTINGS = dict(epochs=3, lr=2e-3, max_len=32, seed=0)


@pytest.fixture
def cli_run(tmp_path_factory, bert_dir, cls_files):  # noqa: F811
    """The CLI's run, made under the same one-thread setting as the test (bf16 sums depend on the split of work)."""
    out = tmp_path_factory.mktemp("cli") / "run"
    train, test = map(str, cls_files)
    assert main(["finetune", str(bert_dir), "--task", "classify", "--train", train, "--test", test, "--mode",
                 "finetune", "--epochs", "3", "--lr", "2e-3", "--max-len", "32", "--seed", "0", "--out", str(out)]) == 0
    return out


def test_fit_predict_score_save_load_equal_the_cli(cli_run, bert_dir, cls_files, tmp_path):  # noqa: F811
    train, test = cls_files
    est = Transfer(str(bert_dir), task="classify", mode="finetune", **SETTINGS)
    assert est.fit(train) is est
    metrics = json.loads((cli_run / "metrics.json").read_text())
    assert est.score(test) == pytest.approx(metrics["accuracy"], abs=1e-6)
    test_d = load_task(test, "classify")
    cli_preds = [json.loads(line)["pred"] for line in (cli_run / "predictions.jsonl").read_text().splitlines()]
    assert est.predict(test_d) == cli_preds
    texts = [ex.text for ex in test_d.examples]
    assert est.predict(texts) == cli_preds  # plain texts read as the task's examples
    # what fitting chose, in attributes ending in _
    assert est.classes_ == ["neg", "pos"] and est.lr_ == 2e-3 and est.choices_ == metrics["choices"]
    assert est.epochs_ == metrics["choices"]["refit"]["epochs"] and est.layer_ == -1 % 3 and est.C_ is None
    assert est.val_score_ == metrics["val_accuracy"] and len(est.history_) >= 2
    # saved, the folder is the CLI's: the same weights, byte for byte
    est.save(tmp_path / "est")
    for name in ("body.safetensors", "head.safetensors"):
        assert (tmp_path / "est" / name).read_bytes() == (cli_run / name).read_bytes()
    again = Transfer.load(tmp_path / "est")
    assert again.predict(texts) == cli_preds and again.score(test) == est.score(test)
    assert (again.lr_, again.epochs_, again.classes_, again.history_) == (est.lr_, est.epochs_, est.classes_,
                                                                          est.history_)
    cli = Transfer.load(cli_run)  # a folder written by `lmforge finetune`
    assert cli.predict(texts) == cli_preds and cli.get_params()["epochs"] == 3
    assert main(["predict", str(tmp_path / "est"), "--text", texts[0]]) == 0  # the CLI reads the saved folder
    with pytest.raises(LmforgeError, match="overwrite=True"):  # an existing run folder is refused, as by the CLI
        est.save(tmp_path / "est")
    est.save(tmp_path / "est", overwrite=True)  # replaced as the CLI's --out is: whole, once the new one is written
    assert Transfer.load(tmp_path / "est").predict(texts) == cli_preds
    for refused in (bert_dir, tmp_path / "est" / "body.safetensors"):  # the model folder; a file, not a folder
        with pytest.raises(LmforgeError):
            est.save(refused)
    assert Transfer.load(cli_run).predict(texts) == cli_preds  # nothing it read was touched


def test_features_logreg_and_probabilities(bert_dir, cls_files, tmp_path):  # noqa: F811
    train, test = cls_files
    est = Transfer(str(bert_dir), task="classify", mode="features", max_len=32, seed=0,
                   cache_dir=str(tmp_path / "cache")).fit(train)
    assert est.C_ > 0 and est.lr_ is None and est.epochs_ is None and est.history_ == []
    assert est.layer_ == est.choices_["layer"] and 0.0 <= est.val_score_ <= 1.0  # chosen by cross-validation
    probs = est.predict_proba(["good fine happy", "bad awful sad"])
    assert len(probs) == 2 and all(len(p) == 2 and abs(sum(p) - 1) < 1e-4 for p in probs)
    labels = est.predict(["good fine happy", "bad awful sad"])
    assert labels == [est.classes_[max(range(2), key=p.__getitem__)] for p in probs]
    assert 0.0 <= est.score(test) <= 1.0


def test_a_dev_set_chooses_the_epoch_and_every_training_example_trains(bert_dir, cls_files):  # noqa: F811
    train, test = cls_files
    dev = load_task(test, "classify")
    est = Transfer(str(bert_dir), task="classify", mode="finetune", **SETTINGS).fit(train, dev=dev)
    assert est.choices_["val_examples"] == len(dev) and "refit" not in est.choices_
    assert est.epochs_ == est.choices_["best_epoch"]
    assert est.score(dev) == pytest.approx(est.val_score_, abs=1e-6)  # the kept state is the one dev chose


def test_scikit_learn_protocol_and_one_line_errors(bert_dir, wordpiece_tokenizer):  # noqa: F811
    from sklearn.base import clone

    est = Transfer(str(bert_dir), task="classify", mode="frozen", epochs=2, seed=1)
    twin = clone(est)
    assert twin.get_params() == est.get_params() and twin is not est
    assert est.set_params(epochs=1).settings["epochs"] == 1
    with pytest.raises(ConfigError, match="epochs must be >= 1"):
        Transfer(str(bert_dir), epochs=0)
    with pytest.raises(ConfigError, match="invalid transfer settings"):
        Transfer(str(bert_dir), no_such_setting=1)
    with pytest.raises(LmforgeError, match="not fitted yet"):
        est.predict(["a text"])
    data = TaskData("classify", [TextExample(t, label=lab) for t, lab in
                                 [("good fine", "pos"), ("bad sad", "neg")] * 8], ["neg", "pos"])
    in_memory = Transfer(tiny_bert(wordpiece_tokenizer), task="classify", mode="frozen", epochs=1, max_len=32)
    in_memory.fit(data)
    assert len(in_memory.predict(["good"])) == 1
    with pytest.raises(LmforgeError, match="model folder"):
        in_memory.save("anywhere")
