"""Prompted BERT classification (``--prompt`` / ``--verbalizer``): the input template, a head that starts
as the masked LM's own output layer, training, saving and reloading, and the one-line errors."""

from __future__ import annotations

import random

import pytest
import torch
from test_transfer_families import FILL, cls_files, tiny_bert, tiny_gpt  # noqa: F401

from lmforge.cli import main
from lmforge.errors import ConfigError, LmforgeError
from lmforge.transfer import load_run, run_transfer
from lmforge.transfer.batching import collate
from lmforge.transfer.config import TransferConfig
from lmforge.transfer.encoding import InputFormat
from lmforge.transfer.run import TransferRun
from lmforge.transfer.tasks import TaskData, TextExample

TEMPLATE = "{text} it was [MASK] ."


@pytest.fixture(scope="module")
def verbalizer(wordpiece_tokenizer):
    """Two whole words of the tiny vocabulary, one token each: the label words (and the cue in the data)."""
    tok = wordpiece_tokenizer
    words = sorted(w for w in tok.get_vocab() if w.isalpha() and len(w) >= 4 and w not in FILL)
    words = [w for w in words if len(tok.encode_with_offsets(w)[0]) == 1]
    assert len(words) >= 2
    return {"pos": words[0], "neg": words[-1]}


def data(n: int, seed: int, verbalizer: dict[str, str]) -> TaskData:
    """Sentences of filler words with the label's word inserted somewhere (what a working head learns)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = [rng.choice(FILL) for _ in range(rng.randint(2, 6))]
        words.insert(rng.randrange(len(words) + 1), verbalizer[label])
        out.append(TextExample(" ".join(words), label=label))
    return TaskData("classify", out, ["neg", "pos"], "toy")


def test_template_places_the_mask_and_cuts_only_the_text(wordpiece_tokenizer):
    tok = wordpiece_tokenizer
    fmt = InputFormat("bert", tok, max_len=16, pool="mask", prompt="review : {text} . it was [MASK] !")
    pre = tok.encode_with_offsets("review :")[0]
    post = tok.encode_with_offsets(". it was")[0]
    bang = tok.encode_with_offsets("!")[0]
    text = "the name of a python " * 10
    enc = fmt.encode_text(text)
    ids = enc.input_ids
    assert len(ids) == 16 and ids[0] == tok.cls_id and ids[-1] == tok.sep_id
    assert ids[1 : 1 + len(pre)] == pre  # the template before the text is kept whole
    tail = [*post, tok.mask_id, *bang, tok.sep_id]
    assert ids[-len(tail) :] == tail  # ... and so is the template after it: only the text was cut
    assert enc.rows == [len(ids) - 2 - len(bang)] and ids[enc.rows[0]] == tok.mask_id
    body = tok.encode_with_offsets(text)[0]
    assert ids[1 + len(pre) : -len(tail)] == body[: 16 - 2 - len(pre) - len(post) - 1 - len(bang)]
    assert enc.segment.count(0) == 16 - 2 - len(pre) - len(post) - 1 - len(bang)
    # without {text} the text comes first; the mask may also sit before the text
    enc = InputFormat("bert", tok, 32, pool="mask", prompt="[MASK] :").encode_text("good")
    assert enc.input_ids == [tok.cls_id, *tok.encode_with_offsets("good")[0], tok.mask_id,
                             *tok.encode_with_offsets(":")[0], tok.sep_id]
    enc = InputFormat("bert", tok, 32, pool="mask", prompt="[MASK] : {text}").encode_text("good")
    assert enc.rows == [1] and enc.input_ids[1] == tok.mask_id
    with pytest.raises(LmforgeError, match="the prompt and the specials take"):
        InputFormat("bert", tok, 8, pool="mask", prompt="the name of a python and it is [MASK]")


def test_untrained_head_scores_the_labels_as_the_masked_lm_does(wordpiece_tokenizer, verbalizer):
    """Before any training the head's class scores are exactly the MLM's scores of the label words at
    the [MASK]: the head starts from what pretraining learned about them."""
    body = tiny_bert(wordpiece_tokenizer, seed=3)
    cfg = TransferConfig(task="classify", mode="frozen", prompt=TEMPLATE, verbalizer=verbalizer, max_len=32)
    run = TransferRun(body, cfg, ["neg", "pos"])
    run.build().eval()
    encs = run.encode(data(8, 0, verbalizer))
    batch = collate(encs, run.fmt.pad_id)
    with torch.no_grad():
        ours = run.model(batch)  # (B, 2)
        mlm = body(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits  # (B, T, V)
    word_ids = [wordpiece_tokenizer.encode_with_offsets(verbalizer[lab])[0][0] for lab in ("neg", "pos")]
    at_mask = torch.stack([mlm[b, e.rows[0], word_ids] for b, e in enumerate(encs)])
    torch.testing.assert_close(ours, at_mask, atol=1e-5, rtol=1e-5)
    assert not torch.equal(ours[:, 0], ours[:, 1])
    # the head's transform is its own copy: training it leaves the body's MLM head as it was
    assert run.model.head.lm_transform is not body.cls.predictions.transform


def test_prompt_finetune_learns_saves_and_reloads(wordpiece_tokenizer, verbalizer, tmp_path):
    body = tiny_bert(wordpiece_tokenizer, seed=0)
    test = data(40, 2, verbalizer)
    out = tmp_path / "run"
    train = data(96, 1, verbalizer)
    # a random body's embedding rows are small, so the prompted head starts slowly: no early stop here
    opts = dict(mode="finetune", epochs=20, patience=20, lr=1e-3, batch_size=8, max_len=32, seed=0,
                prompt=TEMPLATE, verbalizer=verbalizer)
    metrics = run_transfer(body, "classify", train, test, out_dir=out, **opts)
    assert metrics["accuracy"] >= 0.8  # the label word sits in every text: a working head learns it
    # a model folder is needed to reload: save the body and train the same run from it
    body_dir = tmp_path / "bert"
    tiny_bert(wordpiece_tokenizer, seed=0).save_pretrained(body_dir, wordpiece_tokenizer)
    again = run_transfer(str(body_dir), "classify", train, test, out_dir=out, **opts)
    assert again["accuracy"] == metrics["accuracy"]  # same config, data and seed: same run
    run = load_run(out)
    assert run.fmt.pool == "mask" and run.cfg.verbalizer == verbalizer
    preds = run.predict(test)
    written = [line for line in (out / "predictions.jsonl").read_text().splitlines() if line]
    assert len(written) == len(test)
    import json

    assert [p["label"] for p in preds] == [json.loads(w)["label"] for w in written]


def test_prompt_errors(wordpiece_tokenizer, bpe_tokenizer, verbalizer):
    with pytest.raises(ConfigError, match="one \\[MASK\\]"):
        TransferConfig(prompt="{text} it was .", verbalizer=verbalizer)
    with pytest.raises(ConfigError, match="go together"):
        TransferConfig(prompt=TEMPLATE)
    body = tiny_bert(wordpiece_tokenizer)
    d = data(20, 0, verbalizer)
    with pytest.raises(LmforgeError, match="one word per label"):
        run_transfer(body, "classify", d, d, prompt=TEMPLATE, verbalizer={"pos": "good", "bad": "bad"}, epochs=1)
    long_word = "pythonlanguagename"
    assert len(wordpiece_tokenizer.encode_with_offsets(long_word)[0]) > 1
    with pytest.raises(LmforgeError, match="one token each"):
        run_transfer(body, "classify", d, d, prompt=TEMPLATE, verbalizer={"pos": long_word, "neg": "bad"}, epochs=1)
    with pytest.raises(LmforgeError, match="needs a BERT model"):
        run_transfer(tiny_gpt(bpe_tokenizer), "classify", d, d, prompt=TEMPLATE, verbalizer=verbalizer, epochs=1)
    with pytest.raises(LmforgeError, match="--mode finetune or frozen"):
        run_transfer(body, "classify", d, d, mode="features", prompt=TEMPLATE, verbalizer=verbalizer)
    with pytest.raises(LmforgeError, match="leave --pool"):
        run_transfer(body, "classify", d, d, pool="cls", prompt=TEMPLATE, verbalizer=verbalizer, epochs=1)
    with pytest.raises(LmforgeError, match="give --prompt"):
        run_transfer(body, "classify", d, d, pool="mask", epochs=1)


def test_cli_prompt_and_its_one_line_errors(tmp_path, wordpiece_tokenizer, verbalizer, cls_files, capsys):  # noqa: F811
    model = tmp_path / "bert"
    tiny_bert(wordpiece_tokenizer).save_pretrained(model, wordpiece_tokenizer)
    train, test = map(str, cls_files)
    base = ["finetune", str(model), "--task", "classify", "--train", train, "--test", test, "--epochs", "1",
            "--max-len", "32", "--prompt", TEMPLATE]
    words = [f"{k}={v}" for k, v in verbalizer.items()]
    assert main([*base, "--out", str(tmp_path / "run"), "--verbalizer", *words]) == 0
    assert '"mode": "finetune"' in capsys.readouterr().out
    cfg = (tmp_path / "run" / "config.json").read_text()
    assert '"pool": "mask"' in cfg and TEMPLATE in cfg
    for bad, msg in ((["pos"], "LABEL=WORD"), (["pos=a", "pos=b"], "twice")):
        assert main([*base, "--out", str(tmp_path / "bad"), "--verbalizer", *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1
    assert main([*base, "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert "go together" in err and len(err.splitlines()) == 1
