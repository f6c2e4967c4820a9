"""Multiple choice (``--task choice``): one input per (context, choice), a score each, softmax over the choices."""

from __future__ import annotations

import json
import random

import pytest
import torch
from test_transfer_core import NEG, POS, make_body, toy_tokenizer

import lmforge.transfer as modes
from lmforge.cli import main
from lmforge.data.tasks import ChoiceExample, TaskData, load_task
from lmforge.errors import DataError
from lmforge.transfer import load_run
from lmforge.transfer.config import TransferConfig

FILL = ["the", "movie", "a", "plot", "and", "it", "story", "really"]


@pytest.fixture(scope="module")
def toy_tok():
    return toy_tokenizer()


def choice_rows(n: int, seed: int) -> list[dict]:
    """'which one is positive': 2-4 choices, exactly one of them carries a positive word."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(2, 4)
        choices = [f"{rng.choice(FILL)} {rng.choice(NEG)}" for _ in range(k)]
        right = rng.randrange(k)
        choices[right] = f"{rng.choice(FILL)} {rng.choice(POS)}"
        ctx = " ".join(rng.choice(FILL) for _ in range(rng.randint(2, 5)))
        out.append({"context": ctx, "choices": choices, "label": right})
    return out


def write(rows, path):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_choice_files_and_their_errors(tmp_path):
    data = load_task(write(choice_rows(5, 0), tmp_path / "c.jsonl"), "choice")
    assert data.task == "choice" and len(data) == 5 and data.labels == []
    assert all(isinstance(ex, ChoiceExample) and 0 <= ex.label < len(ex.choices) for ex in data.examples)
    csv = tmp_path / "c.csv"
    csv.write_text("context,choice0,choice1,choice2,label\nthe plot,a good one,a bad one,,0\n")
    ex = load_task(csv, "choice").examples[0]
    assert ex.choices == ["a good one", "a bad one"] and ex.label == 0  # an empty column is no choice
    for rec, msg in (
        ({"context": "x", "choices": ["a", "b"], "label": 2}, "out of range for 2 choices"),
        ({"context": "x", "choices": ["a"], "label": 0}, "two or more non-empty choices"),
        ({"choices": ["a", "b"], "label": 0}, "missing 'context'"),
        ({"context": "x", "choices": ["a", "b"], "label": "b"}, "not a choice index"),
        ({"context": "x", "choices": ["a", "b"]}, "missing 'label'"),
    ):
        with pytest.raises(DataError, match=msg):
            load_task(write([rec], tmp_path / "bad.jsonl"), "choice")
    assert load_task(write([{"context": "x", "choices": ["a", "b"]}], tmp_path / "u.jsonl"), "choice", False)


@pytest.mark.parametrize(
    "family,mode,kw",
    [
        ("bert", "finetune", dict(epochs=8, lr=3e-3)),
        ("bert", "features", dict(epochs=40)),
        ("elmo", "frozen", dict(epochs=20, lr=1e-2)),  # a plain body: each input is [a, b, |a-b|, a*b]
    ],
)
def test_choice_learns_and_scores_every_choice(toy_tok, tmp_path, family, mode, kw):
    train = load_task(write(choice_rows(96, 1), tmp_path / "train.jsonl"), "choice")
    test = load_task(write(choice_rows(48, 2), tmp_path / "test.jsonl"), "choice")
    cfg = TransferConfig(task="choice", mode=mode, cache_dir=str(tmp_path / "c"), **kw)
    run = modes.TransferRun(make_body(toy_tok, family), cfg, [])
    run.fit(train)
    m, recs = run.evaluate(test)
    # chance is 1/2..1/4 per question (about 0.36 on this test set); the positive word decides
    assert m["accuracy"] >= 0.9, m
    assert len(recs) == 48
    for r in recs:
        assert len(r["probs"]) == len(r["choices"]) and abs(sum(r["probs"]) - 1) < 1e-4
        assert r["pred"] == max(range(len(r["probs"])), key=r["probs"].__getitem__)
    # reordering the choices reorders the scores: each choice is scored on its own
    ex = ChoiceExample(recs[0]["context"], recs[0]["choices"])
    rev = ChoiceExample(ex.context, ex.choices[::-1])
    p, q = run.predict(TaskData("choice", [ex, rev], []), use_cache=False)
    assert torch.allclose(torch.tensor(p["probs"]), torch.tensor(q["probs"][::-1]), atol=1e-5)


def test_gpt_choice_inputs_and_cli(bpe_tokenizer, tmp_path, capsys):
    from test_transfer_families import tiny_gpt

    tr = write(choice_rows(64, 3), tmp_path / "train.jsonl")
    te = write(choice_rows(16, 4), tmp_path / "test.jsonl")
    base = tmp_path / "gpt"
    tiny_gpt(bpe_tokenizer).save_pretrained(base, bpe_tokenizer)
    out = tmp_path / "run"
    args = ["finetune", str(base), "--task", "choice", "--train", str(tr), "--test", str(te), "--out", str(out)]
    assert main([*args, "--epochs", "2", "--lr", "2e-3", "--max-len", "32", "--lm-weight", "0.5", "--json"]) == 0
    printed = next(json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{"))
    assert printed["task"] == "choice" and 0 <= printed["accuracy"] <= 1
    run = load_run(out)
    # GPT-1's multiple-choice input: start context delim choice extract, read at the extract token
    enc = run.encode(TaskData("choice", [ChoiceExample("the plot", ["a good one", "a bad one"])], []))
    assert len(enc) == 2 and [e.example for e in enc] == [0, 0]
    ctx, choice = bpe_tokenizer.encode("the plot"), bpe_tokenizer.encode("a good one")
    assert enc[0].input_ids == run.fmt.gpt.build(ctx, choice)[0] and enc[0].rows == [len(enc[0].input_ids) - 1]
    assert main(["predict", str(out), "--text", "the plot", "--choice", "a good one", "--choice", "a bad one",
                 "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["pred"] in (0, 1) and len(pred["probs"]) == 2
    assert main(["predict", str(out), "--text", "the plot", "--choice", "only one"]) == 2
    assert "two or more --choice" in capsys.readouterr().err
