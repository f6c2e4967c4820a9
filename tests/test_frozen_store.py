"""Frozen mode runs its (fixed, eval-mode) body once over the training examples and trains the head on the
kept vectors: the same head and metrics as a body pass in every step, in one pass instead of one per epoch.
Where the body does train (GPT's task-token rows), every step still runs it."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from test_transfer_families import rows, tiny_bert, tiny_elmo, tiny_gpt

from lmforge.data.tasks import load_task
from lmforge.transfer import TransferRun
from lmforge.transfer.config import TransferConfig


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("frozen") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(60, 11)))
    return path


def _fit(body, train_file):
    """A frozen-mode fit: (facts, head state, body passes)."""
    passes = []
    real = body.hidden_states

    def counted(*args, **kwargs):
        passes.append(1)
        return real(*args, **kwargs)

    body.hidden_states = counted  # what the transfer model calls for every batch
    cfg = TransferConfig(task="classify", mode="frozen", epochs=4, seed=0, max_len=32, batch_size=8,
                         precision="fp32", device="cpu")
    run = TransferRun(body, cfg, ["neg", "pos"])
    facts = run.fit(load_task(train_file, "classify"))
    return facts, {k: v.clone() for k, v in run.model.head.state_dict().items()}, len(passes)


@pytest.mark.parametrize("make", [tiny_bert, tiny_elmo], ids=["bert", "elmo"])
def test_the_kept_vectors_train_the_same_head_in_one_body_pass(make, wordpiece_tokenizer, train_file, monkeypatch):
    kept, head_kept, passes_kept = _fit(make(wordpiece_tokenizer), train_file)
    monkeypatch.setattr(TransferRun, "body_stays_fixed", property(lambda self: False))  # a body pass every step
    every, head_every, passes_every = _fit(make(wordpiece_tokenizer), train_file)
    assert kept["steps"] == every["steps"] and kept["choices"] == every["choices"]
    assert kept["val_score"] == pytest.approx(every["val_score"])
    assert kept["train_loss"] == pytest.approx(every["train_loss"], rel=1e-4)
    for k in head_every:
        torch.testing.assert_close(head_kept[k], head_every[k], atol=1e-4, rtol=1e-4)
    batches = -(-60 // 8)  # one body pass over the examples, in batches of 8
    assert passes_kept <= batches + 1 < passes_every  # the other fit runs the body in every step of every epoch


def test_a_body_that_trains_still_runs_in_every_step(bpe_tokenizer):
    cfg = TransferConfig(task="classify", mode="frozen", epochs=1, seed=0, max_len=32, precision="fp32", device="cpu")
    run = TransferRun(tiny_gpt(bpe_tokenizer), cfg, ["neg", "pos"])
    assert run.trains_task_rows and not run.body_stays_fixed  # GPT's task-token rows train through the body


def test_vectors_too_large_to_keep_fall_back_to_a_body_pass_per_step(wordpiece_tokenizer, train_file, monkeypatch,
                                                                      caplog):
    import lmforge.transfer.run as R

    monkeypatch.setattr(R, "KEEP_VECTORS_BYTES", 1000)  # far below 60 examples x 3 layers x 32 floats
    monkeypatch.setattr(logging.getLogger("lmforge"), "propagate", True)  # the CLI's setup, if run, turns it off
    with caplog.at_level("INFO", logger="lmforge"):
        facts, _, passes = _fit(tiny_bert(wordpiece_tokenizer), train_file)
    assert "so the body runs in every step instead" in caplog.text
    assert passes > 60 // 8 * 4 and facts["steps"] > 0  # a pass per step of each of the 4 epochs


def test_a_learning_curve_scores_every_frozen_run_on_one_pass_over_its_test_set(wordpiece_tokenizer, monkeypatch):
    from lmforge.data.tasks import TaskData, TextExample
    from lmforge.transfer import learning_curve

    def data(n, seed):
        return TaskData("classify", [TextExample(r["text"], None, r["label"]) for r in rows(n, seed)], ["neg", "pos"])

    pool, test = data(80, 3), data(40, 4)
    options = dict(max_len=32, batch_size=8, precision="fp32", device="cpu", epochs=3)
    passes = []
    real = TransferRun.features
    monkeypatch.setattr(TransferRun, "features",
                        lambda self, d, *a, **k: passes.append(len(d)) or real(self, d, *a, **k))
    body = tiny_bert(wordpiece_tokenizer)
    res = learning_curve(body, "classify", pool, test, sizes=(20,), seeds=(0, 1, 2), modes=["frozen"], min_steps=1,
                         **options)
    assert passes.count(len(test)) == 1 and passes.count(20) == 3  # the test set once, each draw's training set
    for rec in res["runs"]:  # each score as a run of its own gives it, scoring the test set with its body
        idx = np.random.default_rng(rec["seed"]).choice(len(pool), size=20, replace=False).tolist()
        run = TransferRun(body, TransferConfig(task="classify", mode="frozen", seed=rec["seed"], **options),
                          ["neg", "pos"])
        run.fit(pool.subset(idx))
        scores, _ = run.evaluate(test)
        assert scores["accuracy"] == pytest.approx(rec["score"], abs=1e-6)
