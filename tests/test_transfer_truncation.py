"""``truncation``: a text longer than ``max_len`` keeps its start (head) or its start and its end (head+tail)."""

from __future__ import annotations

import random

import pytest
from test_transfer_families import FILL, tiny_bert

from lmforge.cli import main
from lmforge.data.tasks import TaskData, TextExample
from lmforge.errors import ConfigError, LmforgeError
from lmforge.transfer import load_run, run_transfer
from lmforge.transfer.config import TransferConfig
from lmforge.transfer.encoding import InputFormat


def test_head_and_head_tail_cuts(wordpiece_tokenizer):
    tok = wordpiece_tokenizer
    text = " ".join(FILL[i % len(FILL)] for i in range(40))
    body = tok.encode_with_offsets(text)[0]
    assert len(body) > 30
    head = InputFormat("bert", tok, max_len=18, pool="cls").encode_text(text).input_ids
    both = InputFormat("bert", tok, max_len=18, pool="cls", truncation="head+tail").encode_text(text).input_ids
    # BERT keeps room for three specials, so 15 text positions: head+tail takes a quarter (3) from the start
    assert head == [tok.cls_id, *body[:15], tok.sep_id]
    assert both == [tok.cls_id, *body[:3], *body[-12:], tok.sep_id]
    short = "the name of a python"
    ids = tok.encode_with_offsets(short)[0]
    for how in ("head", "head+tail"):  # a text that fits is never cut
        fmt = InputFormat("bert", tok, max_len=18, pool="cls", truncation=how)
        assert fmt.encode_text(short).input_ids == [tok.cls_id, *ids, tok.sep_id]
    # a pair: the longer side gives up room first, and each side keeps its own start and end
    pair = InputFormat("bert", tok, max_len=21, pool="cls", truncation="head+tail").encode_text(text, text)
    assert pair.input_ids == [tok.cls_id, *body[:2], *body[-7:], tok.sep_id, *body[:2], *body[-7:], tok.sep_id]
    with pytest.raises(LmforgeError, match="unknown truncation"):
        InputFormat("bert", tok, max_len=18, truncation="middle")


def test_truncation_settings_are_checked():
    with pytest.raises(ConfigError, match="truncation must be one of head, head\\+tail"):
        TransferConfig(truncation="tail")
    with pytest.raises(ConfigError, match="classify, pair"):
        TransferConfig(task="tokens", truncation="head+tail")


@pytest.fixture(scope="module")
def label_words(wordpiece_tokenizer):
    """Two whole words of the tiny vocabulary, one token each: the cue of each label in the data."""
    tok = wordpiece_tokenizer
    words = sorted(w for w in tok.get_vocab() if w.isalpha() and len(w) >= 4 and w not in FILL)
    words = [w for w in words if len(tok.encode_with_offsets(w)[0]) == 1]
    assert len(words) >= 2
    return {"pos": words[0], "neg": words[-1]}


def _data(n: int, seed: int, words: dict[str, str]) -> TaskData:
    """Long texts of filler words whose label word comes last: past any head-only cut of 16 positions."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        out.append(TextExample(" ".join([*(rng.choice(FILL) for _ in range(30)), words[label]]), label=label))
    return TaskData("classify", out, ["neg", "pos"], "toy")


def test_head_tail_reads_the_end_that_head_cuts_away(tmp_path, wordpiece_tokenizer, label_words, capsys):
    tok = wordpiece_tokenizer
    body_dir = tmp_path / "bert"
    tiny_bert(tok, seed=0).save_pretrained(body_dir, tok)
    train, test = _data(96, 1, label_words), _data(60, 2, label_words)
    opts = dict(mode="finetune", epochs=15, patience=15, lr=1e-3, batch_size=8, max_len=16, seed=0)
    head = run_transfer(str(body_dir), "classify", train, test, **opts)
    both = run_transfer(str(body_dir), "classify", train, test, out_dir=tmp_path / "run", truncation="head+tail",
                        **opts)
    assert head["accuracy"] <= 0.7  # the label word is cut away: nothing to learn but chance
    assert both["accuracy"] >= 0.9
    run = load_run(tmp_path / "run")  # the setting is saved with the run, so predictions cut the same way
    assert run.cfg.truncation == "head+tail" and run.fmt.truncation == "head+tail"
    preds = [p["label"] for p in run.predict(test)]
    assert sum(p == ex.label for p, ex in zip(preds, test.examples)) / len(test) == both["accuracy"]
    # a tagging benchmark keeps every word it can: one line, before any training
    argv = ["benchmark", "curve", "zh-ner", str(body_dir), "--out", str(tmp_path / "c"), "--sizes", "30", "--seeds",
            "0", "--n-test", "20", "--pool", "100", "--truncation", "head+tail"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "cuts whole texts (classify, pair)" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_max_len_above_the_models_positions_is_cut_to_them(tmp_path, wordpiece_tokenizer, bpe_tokenizer, capsys,
                                                          family):
    """The default max_len (128) on a model of 64 positions reads inputs of 64 positions, says so and records it,
    where it used to end in the model's error on the first long text."""
    from test_transfer_families import tiny_gpt

    tok = wordpiece_tokenizer if family == "bert" else bpe_tokenizer
    model_dir = tmp_path / family
    (tiny_bert if family == "bert" else tiny_gpt)(tok).save_pretrained(model_dir, tok)
    long = " ".join(FILL[i % len(FILL)] for i in range(150))
    data = tmp_path / "cls.jsonl"
    data.write_text("".join(f'{{"text": "{long}", "label": "{"ab"[i % 2]}"}}\n' for i in range(12)))
    assert main(["finetune", str(model_dir), "--task", "classify", "--train", str(data), "--test", str(data),
                 "--mode", "features", "--out", str(tmp_path / "run"), "--seed", "0"]) == 0
    err = capsys.readouterr().err
    assert f"max_len 128 is more than the {family} model's 64 positions: inputs are cut at 64" in err
    assert load_run(tmp_path / "run").cfg.max_len == 64
